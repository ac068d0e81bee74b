// Writes the embedded default model: a small Llama-architecture model in the Hugging Face layout
// (config.json, model.safetensors, tokenizer.json, generation_config.json, chat_template.jinja).
//
// Its weights are deterministic RANDOM numbers: it exercises every part of the server, but its
// text is gibberish. Any real Hugging Face model directory of a supported architecture is served
// the same way.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/loader/safetensors.h"
#include "text/tokenizer/bpe_trainer.h"

namespace {

using json = nlohmann::json;

// Training text for the tokenizer (written for this project).
const char* const kCorpus = R"(
A language model server turns prompts into tokens. The scheduler admits waiting requests while
memory and the token budget allow, runs their prompt tokens together with the decode tokens of
running requests, samples one token for each, and streams the text back to every client.
The key and value cache is paged: each sequence owns a table of fixed-size blocks, and a block
returns to the free list as soon as its request ends, whether it finished, failed or was aborted.
Attention reads the cache through the block table. Grouped-query attention lets several query
heads share one key-value head, which cuts the bytes read for every generated token.
Numbers like 1, 12, 123, 1234 and 3.14159 appear in text; so do dates such as 2026-11-29,
times like 12:30, prices like $19.99 and percentages like 42%. Punctuation: commas, periods,
question marks? exclamation marks! (parentheses) [brackets] {braces} "quotes" 'apostrophes'.
It's, don't, we'll, they're, I've, she'd, I'm: contractions are split by the pre-tokenizer.
Code looks different: for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; } return sum;
def forward(self, x): return self.norm(x + self.attn(x))
Unicode text: café, naïve, über, señor, 東京, 北京, こんにちは, 안녕하세요, Привет, مرحبا, 🙂🚀.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Memory bandwidth bounds the decode step: every weight and every cached key and value is read
once per step, so a larger batch shares the weight reads and a smaller cache type halves the
cache reads. Prefill is bound by arithmetic instead, and long prompts are split into chunks so
that running requests keep receiving tokens while a new prompt is processed.
)";

struct Dims {
  int vocab = 0;
  int hidden = 256;
  int inter = 512;
  int layers = 4;
  int heads = 8;
  int kv_heads = 2;
  int head_dim = 32;
};

llm::TensorToWrite RandomBf16(const std::string& name, std::vector<int64_t> shape, float mean,
                              float std, std::mt19937_64& rng) {
  llm::TensorToWrite t{name, llm::DType::kBF16, shape, {}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  t.data.resize(static_cast<size_t>(n) * 2);
  std::normal_distribution<float> dist(mean, std);
  auto* p = reinterpret_cast<uint16_t*>(t.data.data());
  for (int64_t i = 0; i < n; ++i) p[i] = llm::F32ToBf16(dist(rng));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path out(argv[1]);
  fs::create_directories(out);

  llm::BpeTrainerConfig tc;
  tc.vocab_size = 768;
  tc.pretokenizer_regex = llm::kLlama3PretokenizerRegex;
  const json tokenizer = llm::TrainByteLevelBpe(kCorpus, tc);
  Dims d;
  d.vocab = tc.vocab_size + static_cast<int>(tc.special_tokens.size());
  const int bos = tc.vocab_size, eos = tc.vocab_size + 1;

  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_size", d.hidden},
                 {"intermediate_size", d.inter},
                 {"num_hidden_layers", d.layers},
                 {"num_attention_heads", d.heads},
                 {"num_key_value_heads", d.kv_heads},
                 {"head_dim", d.head_dim},
                 {"vocab_size", d.vocab},
                 {"max_position_embeddings", 4096},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", 500000.0},
                 {"rope_scaling",
                  {{"rope_type", "llama3"},
                   {"factor", 8.0},
                   {"low_freq_factor", 1.0},
                   {"high_freq_factor", 4.0},
                   {"original_max_position_embeddings", 1024}}},
                 {"tie_word_embeddings", false},
                 {"torch_dtype", "bfloat16"},
                 {"bos_token_id", bos},
                 {"eos_token_id", eos},
                 {"_comment", "llm-server embedded default model: RANDOM weights, not trained"}};
  json gen = {{"bos_token_id", bos}, {"eos_token_id", {eos}}};

  std::mt19937_64 rng(20261129);
  std::vector<llm::TensorToWrite> ts;
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  ts.push_back(RandomBf16("model.embed_tokens.weight", {d.vocab, d.hidden}, 0.0f, 1.0f, rng));
  for (int l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back(RandomBf16(p + "input_layernorm.weight", {d.hidden}, 1.0f, 0.1f, rng));
    ts.push_back(RandomBf16(p + "self_attn.q_proj.weight", {q, d.hidden}, 0.0f, 0.08f, rng));
    ts.push_back(RandomBf16(p + "self_attn.k_proj.weight", {kv, d.hidden}, 0.0f, 0.08f, rng));
    ts.push_back(RandomBf16(p + "self_attn.v_proj.weight", {kv, d.hidden}, 0.0f, 0.08f, rng));
    ts.push_back(RandomBf16(p + "self_attn.o_proj.weight", {d.hidden, q}, 0.0f, 0.05f, rng));
    ts.push_back(RandomBf16(p + "post_attention_layernorm.weight", {d.hidden}, 1.0f, 0.1f, rng));
    ts.push_back(RandomBf16(p + "mlp.gate_proj.weight", {d.inter, d.hidden}, 0.0f, 0.06f, rng));
    ts.push_back(RandomBf16(p + "mlp.up_proj.weight", {d.inter, d.hidden}, 0.0f, 0.06f, rng));
    ts.push_back(RandomBf16(p + "mlp.down_proj.weight", {d.hidden, d.inter}, 0.0f, 0.04f, rng));
  }
  ts.push_back(RandomBf16("model.norm.weight", {d.hidden}, 1.0f, 0.1f, rng));
  // An untied head: tied random embeddings make greedy decoding copy the last token forever.
  ts.push_back(RandomBf16("lm_head.weight", {d.vocab, d.hidden}, 0.0f, 0.15f, rng));

  llm::Status st =
      llm::WriteSafetensors((out / "model.safetensors").string(), ts, {{"format", "pt"}});
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  std::ofstream(out / "config.json") << config.dump(2) << "\n";
  std::ofstream(out / "generation_config.json") << gen.dump(2) << "\n";
  std::ofstream(out / "tokenizer.json") << tokenizer.dump(2) << "\n";
  // A Llama-3-style chat template over the model's own special tokens, so chat works out of the
  // box (the random weights make the replies gibberish, but the prompt is a real chat prompt).
  std::ofstream(out / "chat_template.jinja")
      << "{{- bos_token }}\n"
         "{%- for message in messages %}\n"
         "{{- '<|start|>' + message['role'] + '\\n' + message['content'] | trim + '<|end|>' }}\n"
         "{%- endfor %}\n"
         "{%- if add_generation_prompt %}\n"
         "{{- '<|start|>assistant\\n' }}\n"
         "{%- endif %}\n";
  std::ofstream(out / "README.md")
      << "# tiny-llama (llm-server embedded default)\n\nA Llama-architecture model with "
         "deterministic RANDOM weights, written by tools/make_tiny_model. Its output is "
         "gibberish; it exists to exercise the server end to end.\n";
  std::printf("wrote %s (vocab %d, %d layers, hidden %d, RANDOM weights)\n", out.c_str(), d.vocab,
              d.layers, d.hidden);
  return 0;
}
