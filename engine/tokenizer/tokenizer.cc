// Byte-level BPE (GPT-2 / Llama-3 / Qwen2 family) read from a Hugging Face tokenizer.json.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/bpe_trainer.h"
#include "engine/tokenizer/byte_level.h"

namespace llm {

const char* const kGpt2PretokenizerRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3PretokenizerRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2PretokenizerRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using json = nlohmann::json;
using tokenizer_internal::ByteLevelToBytes;
using tokenizer_internal::BytesToByteLevel;
using tokenizer_internal::ByteToUnicode;
using tokenizer_internal::Regex;
using tokenizer_internal::SanitizeUtf8;

// Ids beyond this are rejected rather than allocating a huge id table for a corrupt file.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;
// Word cache bounds: long words are rare and cheap to skip; the map is cleared when full.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCacheEntries = size_t{1} << 16;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

std::string TypeOf(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"];
  return "<missing>";
}

bool IsNullOrMissing(const json& j, const char* key) {
  return !j.contains(key) || j[key].is_null();
}

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer stage. Stages run in order, each refining the previous pieces.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;  // Split{Regex}, or ByteLevel with use_regex (GPT-2 regex)
  std::string literal;           // Split{String}
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

// A candidate merge of the adjacent symbols `left` and `right` inside one word.
struct MergeCandidate {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t new_id;
  // Lowest rank first; among equal ranks the leftmost, as in HF's BPE.
  bool operator>(const MergeCandidate& o) const {
    return std::tie(rank, left) > std::tie(o.rank, o.left);
  }
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class BpeTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Create(const json& j);

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  std::string TokenBytes(int32_t id) const override {
    return InRange(id) ? id_bytes_[id] : std::string();
  }
  bool IsSpecial(int32_t id) const override { return InRange(id) && special_[id]; }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = token_to_id_.find(token);
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(id_bytes_.size()); }
  std::optional<int32_t> bos_token_id() const override { return bos_id_; }

 private:
  bool InRange(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < id_bytes_.size(); }

  Status ParseModel(const json& model);
  Status ParseAddedTokens(const json& added);
  Status ParseNormalizer(const json& normalizer);
  Status ParsePreTokenizer(const json& pre);
  Status ParseDecoder(const json& decoder);
  Status ParsePostProcessor(const json& post);
  Status ParseTemplate(const json& post);
  Status Finish();

  // Longest added token starting at text[pos]: (id, length) or nullopt.
  std::optional<std::pair<int32_t, size_t>> MatchAddedToken(std::string_view text,
                                                            size_t pos) const;
  void EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const;
  void ApplyStep(const PreTokenizerStep& step, std::string_view piece,
                 std::vector<std::string>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;
  std::vector<int32_t> Bpe(std::string_view word) const;

  // Model.
  StringMap<int32_t> vocab_;  // byte-level token -> id (model vocab only)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // pair -> (rank, id)
  std::array<int32_t, 256> byte_ids_{};  // id of each single-byte symbol, -1 if absent
  std::optional<int32_t> unk_id_;
  bool ignore_merges_ = false;

  // Added tokens, bucketed by first byte and sorted longest first.
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> added_by_first_byte_;
  std::vector<std::pair<std::string, int32_t>> added_;  // (content, id) before Finish()
  std::vector<bool> added_special_;

  std::vector<PreTokenizerStep> pre_steps_;
  bool saw_byte_level_pre_ = false;
  std::vector<int32_t> prefix_ids_;  // post-processor ids before the sequence
  std::vector<int32_t> suffix_ids_;  // and after it
  std::optional<int32_t> bos_id_;

  StringMap<int32_t> token_to_id_;     // vocab plus added-token contents
  std::vector<std::string> id_bytes_;  // id -> raw bytes
  std::vector<bool> special_;

  mutable std::mutex cache_mu_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Create(const json& j) {
  if (!j.is_object()) return InvalidArgument("tokenizer.json: top level is not an object");
  if (!j.contains("model")) return InvalidArgument("tokenizer.json: missing 'model'");
  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer);
  LLM_RETURN_IF_ERROR(tok->ParseModel(j["model"]));
  if (j.contains("added_tokens")) LLM_RETURN_IF_ERROR(tok->ParseAddedTokens(j["added_tokens"]));
  LLM_RETURN_IF_ERROR(tok->ParseNormalizer(j.value("normalizer", json())));
  LLM_RETURN_IF_ERROR(tok->ParsePreTokenizer(j.value("pre_tokenizer", json())));
  if (!tok->saw_byte_level_pre_) {
    return InvalidArgument("unsupported pre_tokenizer: a ByteLevel pre-tokenizer is required");
  }
  LLM_RETURN_IF_ERROR(tok->ParseDecoder(j.value("decoder", json())));
  LLM_RETURN_IF_ERROR(tok->Finish());
  // The template names tokens by content, so it is resolved after the id tables exist.
  LLM_RETURN_IF_ERROR(tok->ParsePostProcessor(j.value("post_processor", json())));
  if (!tok->prefix_ids_.empty()) tok->bos_id_ = tok->prefix_ids_.front();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Status BpeTokenizer::ParseModel(const json& model) {
  if (!model.is_object()) return InvalidArgument("tokenizer.json: 'model' is not an object");
  // HF omits "type" in some old files; vocab + merges then still mean BPE.
  if (model.contains("type") && TypeOf(model) != "BPE") {
    return InvalidArgument("unsupported model type: " + TypeOf(model));
  }
  if (model.value("byte_fallback", false)) {
    return InvalidArgument("unsupported model option: byte_fallback");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!IsNullOrMissing(model, key) && !model[key].get<std::string>().empty()) {
      return InvalidArgument(std::string("unsupported model option: ") + key);
    }
  }
  ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return InvalidArgument("tokenizer.json: model.vocab missing or not an object");
  }
  for (const auto& [token, id_json] : model["vocab"].items()) {
    int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) {
      return InvalidArgument("vocab id out of range for token '" + token + "'");
    }
    vocab_[token] = static_cast<int32_t>(id);
  }
  const json merges = model.value("merges", json::array());
  if (!merges.is_array()) return InvalidArgument("tokenizer.json: model.merges is not an array");
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {
      // Byte-level tokens never contain a literal space (it is mapped to U+0120).
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) return InvalidArgument("malformed merge: '" + s + "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return InvalidArgument("malformed merge at rank " + std::to_string(rank));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end()) {
      return InvalidArgument("merge '" + a + " " + b + "' uses a token missing from the vocab");
    }
    // The first occurrence of a pair wins, as in HF.
    merges_.try_emplace(PairKey(ia->second, ib->second), static_cast<int32_t>(rank), iab->second);
  }
  if (!IsNullOrMissing(model, "unk_token")) {
    auto it = vocab_.find(model["unk_token"].get<std::string>());
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  return Status::Ok();
}

Status BpeTokenizer::ParseAddedTokens(const json& added) {
  if (added.is_null()) return Status::Ok();
  if (!added.is_array()) return InvalidArgument("tokenizer.json: added_tokens is not an array");
  for (const json& t : added) {
    int64_t id = t.at("id").get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) return InvalidArgument("added token id out of range");
    std::string content = t.at("content").get<std::string>();
    if (content.empty()) continue;
    added_.emplace_back(std::move(content), static_cast<int32_t>(id));
    added_special_.push_back(t.value("special", false));
  }
  return Status::Ok();
}

Status BpeTokenizer::ParseNormalizer(const json& n) {
  if (n.is_null()) return Status::Ok();
  std::string type = TypeOf(n);
  // Byte-level vocabularies are trained on NFC text; we pass text through unchanged, which is
  // identical for the (already NFC) text that reaches a server in practice.
  if (type == "NFC") return Status::Ok();
  if (type == "Sequence") {
    for (const json& sub : n.value("normalizers", json::array())) {
      LLM_RETURN_IF_ERROR(ParseNormalizer(sub));
    }
    return Status::Ok();
  }
  return InvalidArgument("unsupported normalizer type: " + type);
}

Status BpeTokenizer::ParsePreTokenizer(const json& p) {
  if (p.is_null()) return Status::Ok();
  std::string type = TypeOf(p);
  if (type == "Sequence") {
    for (const json& sub : p.value("pretokenizers", json::array())) {
      LLM_RETURN_IF_ERROR(ParsePreTokenizer(sub));
    }
    return Status::Ok();
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    // Defaults follow HF's serde defaults for a missing field.
    step.add_prefix_space = p.value("add_prefix_space", true);
    if (p.value("use_regex", true)) {
      LLM_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2PretokenizerRegex));
    }
    saw_byte_level_pre_ = true;
  } else if (type == "Split") {
    // A Split after ByteLevel would run on the mapped alphabet; nobody ships that.
    if (saw_byte_level_pre_)
      return InvalidArgument("unsupported pre_tokenizer: Split after ByteLevel");
    step.kind = PreTokenizerStep::Kind::kSplit;
    const json& pattern = p.at("pattern");
    if (pattern.contains("Regex")) {
      LLM_ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern["Regex"].get<std::string>()));
    } else if (pattern.contains("String")) {
      step.literal = pattern["String"].get<std::string>();
      if (step.literal.empty()) return InvalidArgument("Split pre_tokenizer: empty String pattern");
    } else {
      return InvalidArgument("unsupported Split pattern: " + pattern.dump());
    }
    std::string behavior = p.value("behavior", "Isolated");
    if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return InvalidArgument("unsupported Split behavior: " + behavior);
    }
    step.invert = p.value("invert", false);
  } else {
    return InvalidArgument("unsupported pre_tokenizer type: " + type);
  }
  pre_steps_.push_back(std::move(step));
  return Status::Ok();
}

Status BpeTokenizer::ParseDecoder(const json& d) {
  // A missing decoder is read as ByteLevel: our vocabularies are always byte-level.
  if (d.is_null()) return Status::Ok();
  std::string type = TypeOf(d);
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    for (const json& sub : d.value("decoders", json::array())) {
      LLM_RETURN_IF_ERROR(ParseDecoder(sub));
    }
    return Status::Ok();
  }
  return InvalidArgument("unsupported decoder type: " + type);
}

Status BpeTokenizer::ParsePostProcessor(const json& p) {
  if (p.is_null()) return Status::Ok();
  std::string type = TypeOf(p);
  if (type == "ByteLevel") return Status::Ok();  // only adjusts offsets, which we don't expose
  if (type == "TemplateProcessing") return ParseTemplate(p);
  if (type == "Sequence") {
    for (const json& sub : p.value("processors", json::array())) {
      LLM_RETURN_IF_ERROR(ParsePostProcessor(sub));
    }
    return Status::Ok();
  }
  return InvalidArgument("unsupported post_processor type: " + type);
}

Status BpeTokenizer::ParseTemplate(const json& p) {
  const json specials = p.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const json& item : p.value("single", json::array())) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      return InvalidArgument("unsupported TemplateProcessing item: " + item.dump());
    }
    std::string name = item["SpecialToken"].at("id").get<std::string>();
    std::vector<int32_t> ids;
    if (specials.contains(name) && specials[name].contains("ids")) {
      ids = specials[name]["ids"].get<std::vector<int32_t>>();
    } else if (auto id = TokenToId(name)) {
      ids.push_back(*id);
    } else {
      return InvalidArgument("TemplateProcessing names unknown token: " + name);
    }
    auto& dst = seen_sequence ? suffix_ids_ : prefix_ids_;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  return Status::Ok();
}

Status BpeTokenizer::Finish() {
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab_) max_id = std::max<int64_t>(max_id, id);
  for (const auto& [content, id] : added_) max_id = std::max<int64_t>(max_id, id);
  id_bytes_.assign(max_id + 1, std::string());
  special_.assign(max_id + 1, false);
  for (const auto& [tok, id] : vocab_) {
    id_bytes_[id] = ByteLevelToBytes(tok);
    token_to_id_[tok] = id;
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    const auto& [content, id] = added_[i];
    id_bytes_[id] = content;
    special_[id] = added_special_[i];
    token_to_id_[content] = id;
    added_by_first_byte_[static_cast<unsigned char>(content[0])].emplace_back(content, id);
  }
  for (auto& bucket : added_by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }
  const auto& alphabet = ByteToUnicode();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(alphabet[b]);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  return Status::Ok();
}

std::optional<std::pair<int32_t, size_t>> BpeTokenizer::MatchAddedToken(std::string_view text,
                                                                        size_t pos) const {
  const auto& bucket = added_by_first_byte_[static_cast<unsigned char>(text[pos])];
  for (const auto& [content, id] : bucket) {
    if (text.substr(pos).starts_with(content)) return std::make_pair(id, content.size());
  }
  return std::nullopt;
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  // Regexes need valid UTF-8; invalid input becomes U+FFFD, the same thing Decode would show.
  const std::string clean = SanitizeUtf8(text);
  std::string_view s = clean;
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_ids_;
  size_t segment_start = 0;
  for (size_t i = 0; i < s.size();) {
    if (auto match = MatchAddedToken(s, i)) {
      EncodeSegment(s.substr(segment_start, i - segment_start), &ids);
      ids.push_back(match->first);
      i += match->second;
      segment_start = i;
    } else {
      ++i;
    }
  }
  EncodeSegment(s.substr(segment_start), &ids);
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void BpeTokenizer::EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const {
  if (segment.empty()) return;
  std::vector<std::string> pieces{std::string(segment)};
  std::vector<std::string> next;
  for (const PreTokenizerStep& step : pre_steps_) {
    next.clear();
    for (const std::string& piece : pieces) ApplyStep(step, piece, &next);
    pieces.swap(next);
  }
  for (const std::string& piece : pieces) EncodeWord(piece, ids);
}

void BpeTokenizer::ApplyStep(const PreTokenizerStep& step, std::string_view piece,
                             std::vector<std::string>* out) const {
  std::string prefixed;
  if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    // HF prepends the space to every piece reaching this stage, not just the first.
    if (step.add_prefix_space && !piece.starts_with(' ')) {
      prefixed = " " + std::string(piece);
      piece = prefixed;
    }
    if (!step.regex) {
      out->emplace_back(piece);
      return;
    }
  }
  std::vector<std::pair<size_t, size_t>> matches;
  if (step.regex) {
    step.regex->FindAll(piece, &matches);
  } else {
    for (size_t pos = piece.find(step.literal); pos != std::string_view::npos;
         pos = piece.find(step.literal, pos + step.literal.size())) {
      matches.emplace_back(pos, pos + step.literal.size());
    }
  }
  // Cover the piece with (begin, end, is_match) parts, gaps included.
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t last = 0;
  for (auto [b, e] : matches) {
    if (b > last) parts.push_back({last, b, step.invert});
    parts.push_back({b, e, !step.invert});
    last = e;
  }
  if (last < piece.size()) parts.push_back({last, piece.size(), step.invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out->emplace_back(piece.substr(b, e - b));
  };
  // ByteLevel's regex always splits Isolated.
  SplitBehavior behavior =
      step.kind == PreTokenizerStep::Kind::kByteLevel ? SplitBehavior::kIsolated : step.behavior;
  size_t start = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    switch (behavior) {
      case SplitBehavior::kIsolated:
        emit(p.begin, p.end);
        break;
      case SplitBehavior::kRemoved:
        if (!p.is_match) emit(p.begin, p.end);
        break;
      case SplitBehavior::kMergedWithPrevious:
        if (p.is_match) {
          emit(start, p.end);
          start = p.end;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        if (p.is_match) {
          emit(start, p.begin);
          start = p.begin;
        }
        break;
      case SplitBehavior::kContiguous:
        if (!p.is_match || i + 1 == parts.size() || !parts[i + 1].is_match) {
          emit(start, p.end);
          start = p.end;
        }
        break;
    }
  }
  if (behavior == SplitBehavior::kMergedWithPrevious ||
      behavior == SplitBehavior::kMergedWithNext) {
    emit(start, piece.size());
  }
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> result = Bpe(word);
  ids->insert(ids->end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();  // crude but bounded
    cache_.try_emplace(std::string(word), std::move(result));
  }
}

std::vector<int32_t> BpeTokenizer::Bpe(std::string_view word) const {
  if (ignore_merges_) {
    // Llama-3: a pre-token that is itself a vocab entry is emitted whole.
    auto it = vocab_.find(BytesToByteLevel(word));
    if (it != vocab_.end()) return {it->second};
  }
  // Symbols form a doubly linked list; merged-away symbols get id -1.
  struct Symbol {
    int32_t id, prev, next;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  for (unsigned char b : word) {
    int32_t id = byte_ids_[b];
    if (id < 0) {
      // A byte missing from the vocab: unk if there is one, else dropped (HF does the same).
      if (!unk_id_) continue;
      id = *unk_id_;
    }
    int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back({id, i - 1, i + 1});
  }
  if (syms.empty()) return {};
  syms.back().next = -1;

  std::priority_queue<MergeCandidate, std::vector<MergeCandidate>, std::greater<>> heap;
  auto push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    auto it = merges_.find(PairKey(syms[left].id, syms[right].id));
    if (it != merges_.end()) heap.push({it->second.first, left, right, it->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i, i + 1);
  while (!heap.empty()) {
    MergeCandidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    if (l.id < 0 || l.next != c.right || syms[c.right].id < 0) continue;  // stale
    auto it = merges_.find(PairKey(l.id, syms[c.right].id));
    if (it == merges_.end() || it->second.first != c.rank) continue;  // left changed since
    l.id = c.new_id;
    syms[c.right].id = -1;
    l.next = syms[c.right].next;
    if (l.next >= 0) syms[l.next].prev = c.left;
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  std::vector<int32_t> out;
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  return out;
}

std::string BpeTokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!InRange(id) || (skip_special_tokens && special_[id])) continue;
    bytes += id_bytes_[id];
  }
  return SanitizeUtf8(bytes);
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const nlohmann::json& tokenizer_json) {
  // nlohmann throws on type mismatches in malformed files; keep exceptions inside this call.
  try {
    return BpeTokenizer::Create(tokenizer_json);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("malformed tokenizer.json: ") + e.what());
  }
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open tokenizer file: " + path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("tokenizer file is not valid JSON: " + path);
  return FromJson(j);
}

}  // namespace llm
