// The tokenizer pipeline: added tokens -> normalizer -> pre-tokenizer -> BPE model ->
// post-processor for Encode, and token strings -> decoder chain -> clean-up for Decode.
#include "text/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/bpe_model.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/decoder.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/post_processor.h"
#include "text/tokenizer/pre_tokenizer.h"

namespace llm {

namespace {

using json = nlohmann::json;
using namespace tokenizer_internal;  // NOLINT: the pipeline stages

class PipelineTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Create(const json& j, const json& config);

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  std::string TokenBytes(int32_t id) const override {
    const std::string* t = TokenString(id);
    if (t == nullptr) return {};
    return decoder_->Decode(std::span<const std::string>(t, 1), false, false);
  }
  bool IsSpecial(int32_t id) const override { return InRange(id) && special_[id]; }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = token_to_id_.find(token);
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(id_token_.size()); }
  std::optional<int32_t> bos_token_id() const override {
    if (post_.prefix().empty()) return std::nullopt;
    return post_.prefix().front();
  }
  const std::string* TokenString(int32_t id) const override {
    return InRange(id) && known_[id] ? &id_token_[id] : nullptr;
  }
  std::string DecodeWindow(std::span<const std::string> tokens, bool at_start, bool at_end,
                           size_t* stable) const override {
    return decoder_->Decode(tokens, at_start, at_end, stable);
  }
  bool clean_up_tokenization_spaces() const override { return clean_up_; }

 private:
  bool InRange(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < id_token_.size(); }
  Status ApplyConfig(const json& config);
  void EncodeText(std::string_view text, bool at_origin, std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> model_;
  AddedVocabulary added_;
  std::unique_ptr<Normalizer> normalizer_;  // null when none
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<Decoder> decoder_;
  PostProcessor post_;
  bool clean_up_ = false;

  StringMap<int32_t> token_to_id_;     // vocab plus added-token contents
  std::vector<std::string> id_token_;  // id -> token string (added tokens win)
  std::vector<bool> known_;
  std::vector<bool> special_;
};

StatusOr<std::unique_ptr<Tokenizer>> PipelineTokenizer::Create(const json& j, const json& config) {
  if (!j.is_object()) return InvalidArgument("tokenizer.json: top level is not an object");
  if (!j.contains("model")) return InvalidArgument("tokenizer.json: missing 'model'");
  auto tok = std::unique_ptr<PipelineTokenizer>(new PipelineTokenizer);
  LLM_ASSIGN_OR_RETURN(tok->model_, BpeModel::FromJson(j["model"]));
  if (j.contains("added_tokens")) LLM_RETURN_IF_ERROR(tok->added_.Parse(j["added_tokens"]));
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    LLM_ASSIGN_OR_RETURN(tok->normalizer_, Normalizer::FromJson(j["normalizer"]));
  }
  LLM_ASSIGN_OR_RETURN(tok->pre_, PreTokenizer::FromJson(j.value("pre_tokenizer", json())));
  LLM_ASSIGN_OR_RETURN(tok->decoder_, Decoder::FromJson(j.value("decoder", json())));
  LLM_ASSIGN_OR_RETURN(tok->post_, PostProcessor::FromJson(j.value("post_processor", json())));
  tok->added_.Build(tok->normalizer_.get());

  int64_t max_id = -1;
  for (const auto& [t, id] : tok->model_->vocab()) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& t : tok->added_.tokens()) max_id = std::max<int64_t>(max_id, t.id);
  tok->id_token_.assign(max_id + 1, std::string());
  tok->known_.assign(max_id + 1, false);
  tok->special_.assign(max_id + 1, false);
  for (const auto& [t, id] : tok->model_->vocab()) {
    tok->id_token_[id] = t;
    tok->known_[id] = true;
    tok->token_to_id_[t] = id;
  }
  for (const AddedToken& t : tok->added_.tokens()) {
    tok->id_token_[t.id] = t.content;
    tok->known_[t.id] = true;
    tok->special_[t.id] = t.special;
    tok->token_to_id_[t.content] = t.id;
  }
  if (!config.is_null()) LLM_RETURN_IF_ERROR(tok->ApplyConfig(config));
  for (const auto* ids : {&tok->post_.prefix(), &tok->post_.suffix()}) {
    for (int32_t id : *ids) {
      if (!tok->InRange(id)) {
        return InvalidArgument("post-processor token id " + std::to_string(id) +
                               " is outside the vocabulary");
      }
    }
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Status PipelineTokenizer::ApplyConfig(const json& config) {
  if (!config.is_object()) return InvalidArgument("tokenizer_config.json is not an object");
  clean_up_ = BoolOr(config, "clean_up_tokenization_spaces", false);
  if (BoolOr(config, "split_special_tokens", false)) {
    return InvalidArgument("tokenizer_config.json: split_special_tokens=true is not supported");
  }
  // add_bos_token / add_eos_token are not applied: transformers 5.17 decides BOS / EOS by
  // tokenizer.json's post-processor alone (DeepSeek-V3 says add_bos_token=true and gets no BOS;
  // tests/fixtures/tokenizers shows it), and so does this tokenizer.
  return Status::Ok();
}

void PipelineTokenizer::EncodeText(std::string_view text, bool at_origin,
                                   std::vector<int32_t>* ids) const {
  std::vector<std::string> pieces;
  pre_->Split(text, at_origin, &pieces);
  for (const std::string& piece : pieces) model_->Tokenize(piece, ids);
}

std::vector<int32_t> PipelineTokenizer::Encode(std::string_view text,
                                               bool add_special_tokens) const {
  // Regexes need valid UTF-8; invalid input becomes U+FFFD, the same thing Decode would show.
  const std::string clean = SanitizeUtf8(text);
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = post_.prefix();
  std::vector<TextSegment> raw, normalized;
  added_.Split(clean, /*at_origin=*/true, /*normalized_pass=*/false, &raw);
  for (const TextSegment& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    // Each piece between raw-matched tokens is normalized on its own, as in HF.
    const std::string norm = normalizer_ ? normalizer_->Apply(seg.text) : seg.text;
    normalized.clear();
    added_.Split(norm, seg.at_origin, /*normalized_pass=*/true, &normalized);
    for (const TextSegment& sub : normalized) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
      } else {
        EncodeText(sub.text, sub.at_origin, &ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), post_.suffix().begin(), post_.suffix().end());
  return ids;
}

std::string PipelineTokenizer::Decode(std::span<const int32_t> ids,
                                      bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = TokenString(id);
    if (t == nullptr || (skip_special_tokens && special_[id])) continue;
    tokens.push_back(*t);
  }
  std::string text = SanitizeUtf8(decoder_->Decode(tokens, /*at_start=*/true, /*at_end=*/true));
  return clean_up_ ? CleanUpTokenizationSpaces(std::move(text)) : text;
}

StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open tokenizer file: " + path);
  // Parsing from memory avoids the stream's per-character overhead, which dominates for large
  // vocabularies.
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("tokenizer file is not valid JSON: " + path);
  return j;
}

}  // namespace

std::string CleanUpTokenizationSpaces(std::string text) {
  // The same replacements, in the same order, as transformers' clean_up_tokenization.
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) text = ReplaceAll(text, from, nullptr, to);
  return text;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const nlohmann::json& tokenizer_json) {
  return FromJson(tokenizer_json, json());
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const nlohmann::json& tokenizer_json,
                                                         const nlohmann::json& tokenizer_config) {
  // nlohmann throws on type mismatches in malformed files; keep exceptions inside this call.
  try {
    return PipelineTokenizer::Create(tokenizer_json, tokenizer_config);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("malformed tokenizer.json or tokenizer_config.json: ") +
                           e.what());
  }
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  LLM_ASSIGN_OR_RETURN(json j, ReadJson(path));
  json config;
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    LLM_ASSIGN_OR_RETURN(config, ReadJson(config_path.string()));
  }
  return FromJson(j, config);
}

}  // namespace llm
