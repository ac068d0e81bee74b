#include "engine/model_config.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace llm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

StatusOr<json> ReadJsonFile(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open " + path.string());
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(path.string() + " is not a JSON object");
  return j;
}

Status ReadInt(const json& j, const char* key, int* out, bool required, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return InvalidArgument(file + ": missing required field '" + key + "'");
    return Status::Ok();
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0 ||
      j[key].get<int64_t>() > (1ll << 30)) {
    return InvalidArgument(file + ": field '" + key + "' must be a positive integer");
  }
  *out = j[key].get<int>();
  return Status::Ok();
}

void ReadIds(const json& v, std::vector<int32_t>* out) {
  out->clear();
  if (v.is_number_integer()) out->push_back(v.get<int32_t>());
  if (v.is_array()) {
    for (const json& x : v) {
      if (x.is_number_integer()) out->push_back(x.get<int32_t>());
    }
  }
}

// Sliding window as Hugging Face applies it. Mistral: every layer when sliding_window is
// non-null. Qwen2: only with use_sliding_window, and then the layers named "sliding_attention" in
// layer_types or, without that list, layers l >= max_window_layers (default 28, as in
// Qwen2Config; Mistral ignores layer_types, as HF does). Llama has no sliding window.
Status ReadSlidingWindow(const json& j, const std::string& file, ModelConfig* c) {
  if (c->architecture != Architecture::kMistral && c->architecture != Architecture::kQwen2) {
    return Status::Ok();
  }
  if (c->architecture == Architecture::kQwen2 &&
      !(j.contains("use_sliding_window") && j["use_sliding_window"] == true)) {
    return Status::Ok();
  }
  // An explicit null disables the window; an absent key means the HF config default, 4096.
  if (j.contains("sliding_window") && j["sliding_window"].is_null()) return Status::Ok();
  int window = 4096;
  LLM_RETURN_IF_ERROR(ReadInt(j, "sliding_window", &window, false, file));
  c->sliding_window = window;
  if (c->architecture != Architecture::kQwen2) return Status::Ok();

  c->window_layers.assign(c->num_layers, false);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& types = j["layer_types"];
    if (!types.is_array() || static_cast<int>(types.size()) != c->num_layers) {
      return InvalidArgument(file + ": 'layer_types' must list one type per layer (" +
                             std::to_string(c->num_layers) + ")");
    }
    for (int l = 0; l < c->num_layers; ++l) {
      const json& t = types[l];
      if (t == "sliding_attention") {
        c->window_layers[l] = true;
      } else if (t != "full_attention") {
        return InvalidArgument(file + ": 'layer_types'[" + std::to_string(l) + "] is " + t.dump() +
                               "; expected \"full_attention\" or \"sliding_attention\"");
      }
    }
    return Status::Ok();
  }
  int max_window_layers = 28;
  if (j.contains("max_window_layers") && !j["max_window_layers"].is_null()) {
    const json& m = j["max_window_layers"];
    if (!m.is_number_integer() || m.get<int64_t>() < 0 || m.get<int64_t>() > (1ll << 30)) {
      return InvalidArgument(file + ": field 'max_window_layers' must be a non-negative integer");
    }
    max_window_layers = m.get<int>();
  }
  for (int l = max_window_layers; l < c->num_layers; ++l) c->window_layers[l] = true;
  return Status::Ok();
}

}  // namespace

const char* ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kDeepseekV2:
      return "DeepseekV2ForCausalLM";
    case Architecture::kDeepseekV3:
      return "DeepseekV3ForCausalLM";
  }
  return "?";
}

Status ReadSpecialTokenIds(const std::string& model_dir, const json& j, ModelConfig* c) {
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) {
    c->bos_token_id = j["bos_token_id"].get<int32_t>();
  }
  if (j.contains("eos_token_id")) ReadIds(j["eos_token_id"], &c->eos_token_ids);
  const fs::path gen = fs::path(model_dir) / "generation_config.json";
  if (fs::exists(gen)) {
    LLM_ASSIGN_OR_RETURN(json g, ReadJsonFile(gen));
    if (g.contains("eos_token_id")) ReadIds(g["eos_token_id"], &c->eos_token_ids);
    if (g.contains("bos_token_id") && g["bos_token_id"].is_number_integer()) {
      c->bos_token_id = g["bos_token_id"].get<int32_t>();
    }
  }
  for (int32_t id : c->eos_token_ids) {
    if (id < 0 || id >= c->vocab_size) {
      return InvalidArgument((fs::path(model_dir) / "config.json").string() + ": eos_token_id " +
                             std::to_string(id) + " is outside the vocabulary");
    }
  }
  return Status::Ok();
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const std::string file = (dir / "config.json").string();
  LLM_ASSIGN_OR_RETURN(json j, ReadJsonFile(file));
  ModelConfig c;
  c.name = fs::path(model_dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = fs::path(model_dir).lexically_normal().parent_path().filename();

  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string()) {
    return InvalidArgument(file + ": missing 'architectures'");
  }
  c.architecture_name = j["architectures"][0].get<std::string>();
  if (c.architecture_name == "LlamaForCausalLM") {
    c.architecture = Architecture::kLlama;
  } else if (c.architecture_name == "MistralForCausalLM") {
    c.architecture = Architecture::kMistral;
  } else if (c.architecture_name == "Qwen2ForCausalLM") {
    c.architecture = Architecture::kQwen2;
    c.attention_bias = true;
  } else {
    return Unimplemented(file + ": unsupported architecture '" + c.architecture_name +
                         "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
  }
  LLM_RETURN_IF_ERROR(ReadInt(j, "hidden_size", &c.hidden_size, true, file));
  LLM_RETURN_IF_ERROR(ReadInt(j, "intermediate_size", &c.intermediate_size, true, file));
  LLM_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", &c.num_layers, true, file));
  LLM_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", &c.num_q_heads, true, file));
  c.num_kv_heads = c.num_q_heads;
  LLM_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", &c.num_kv_heads, false, file));
  LLM_RETURN_IF_ERROR(ReadInt(j, "vocab_size", &c.vocab_size, true, file));
  LLM_RETURN_IF_ERROR(
      ReadInt(j, "max_position_embeddings", &c.max_position_embeddings, false, file));
  if (c.hidden_size % c.num_q_heads != 0 && !j.contains("head_dim")) {
    return InvalidArgument(file + ": hidden_size is not a multiple of num_attention_heads");
  }
  c.head_dim = c.hidden_size / c.num_q_heads;
  LLM_RETURN_IF_ERROR(ReadInt(j, "head_dim", &c.head_dim, false, file));
  if (c.num_q_heads % c.num_kv_heads != 0) {
    return InvalidArgument(file + ": num_attention_heads (" + std::to_string(c.num_q_heads) +
                           ") is not a multiple of num_key_value_heads (" +
                           std::to_string(c.num_kv_heads) + ")");
  }
  if (c.head_dim % 2 != 0) return InvalidArgument(file + ": head_dim must be even for rotary");
  if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()) {
    c.rms_norm_eps = j["rms_norm_eps"].get<float>();
  }
  if (j.contains("rope_theta") && j["rope_theta"].is_number()) {
    c.rope_theta = j["rope_theta"].get<float>();
  }
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()) {
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (j.contains("attention_bias") && j["attention_bias"].is_boolean()) {
    c.attention_bias = j["attention_bias"].get<bool>();
  }
  LLM_RETURN_IF_ERROR(ReadSlidingWindow(j, file, &c));
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
    DType t;
    if (ParseDType(j["torch_dtype"].get<std::string>(), &t)) c.dtype = t;
  }
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const json& rs = j["rope_scaling"];
    std::string type = rs.value("rope_type", rs.value("type", std::string()));
    if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::kLlama3;
      c.rope_scaling.factor = rs.value("factor", 8.0f);
      c.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0f);
      c.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0f);
      c.rope_scaling.original_max_position_embeddings =
          rs.value("original_max_position_embeddings", 8192);
      if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor) {
        return InvalidArgument(file + ": rope_scaling needs high_freq_factor > low_freq_factor");
      }
    } else if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      c.rope_scaling.factor = rs.value("factor", 1.0f);
    } else if (type != "default" && !type.empty()) {
      return Unimplemented(file + ": unsupported rope_scaling type '" + type + "'");
    }
  }
  LLM_RETURN_IF_ERROR(ReadSpecialTokenIds(model_dir, j, &c));
  return c;
}

}  // namespace llm
