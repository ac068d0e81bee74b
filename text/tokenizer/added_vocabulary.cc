#include "text/tokenizer/added_vocabulary.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/tokenizer/bpe_model.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/unicode.h"

namespace llm::tokenizer_internal {

using json = nlohmann::json;

namespace {

bool IsWordChar(uint32_t c) {
  return c == '_' || IsAlphanumeric(c);
}

}  // namespace

Status AddedVocabulary::Parse(const json& added) {
  if (added.is_null()) return Status::Ok();
  if (!added.is_array()) return InvalidArgument("tokenizer.json: added_tokens is not an array");
  for (const json& t : added) {
    AddedToken tok;
    const int64_t id = t.at("id").get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) return InvalidArgument("added token id out of range");
    tok.id = static_cast<int32_t>(id);
    tok.content = t.at("content").get<std::string>();
    if (tok.content.empty())
      return InvalidArgument("added token " + std::to_string(id) + " is empty");
    tok.special = BoolOr(t, "special", false);
    tok.lstrip = BoolOr(t, "lstrip", false);
    tok.rstrip = BoolOr(t, "rstrip", false);
    // HF's AddedToken default: normalized unless special.
    tok.normalized = BoolOr(t, "normalized", !tok.special);
    tok.single_word = BoolOr(t, "single_word", false);
    tokens_.push_back(std::move(tok));
  }
  return Status::Ok();
}

void AddedVocabulary::Build(const Normalizer* normalizer) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    std::string pattern = t.content;
    if (t.normalized && normalizer != nullptr) pattern = normalizer->Apply(pattern);
    if (pattern.empty()) continue;
    Matcher& m = t.normalized ? normalized_ : raw_;
    m.by_first_byte[static_cast<unsigned char>(pattern[0])].emplace_back(std::move(pattern), i);
    m.empty = false;
  }
  for (Matcher* m : {&raw_, &normalized_}) {
    for (auto& bucket : m->by_first_byte) {
      std::stable_sort(bucket.begin(), bucket.end(), [](const auto& x, const auto& y) {
        return x.first.size() > y.first.size();
      });
    }
  }
}

void AddedVocabulary::Split(std::string_view text, bool at_origin, bool normalized_pass,
                            std::vector<TextSegment>* out) const {
  const Matcher& m = normalized_pass ? normalized_ : raw_;
  if (m.empty) {
    if (!text.empty()) out->push_back({std::string(text), -1, at_origin});
    return;
  }
  size_t start_offset = 0;  // end of the previous piece
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& bucket = m.by_first_byte[static_cast<unsigned char>(text[pos])];
    const std::pair<std::string, size_t>* hit = nullptr;
    for (const auto& entry : bucket) {
      if (text.substr(pos).starts_with(entry.first)) {
        hit = &entry;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->first.size();
    pos = stop;  // matches never overlap, even ones the flags reject
    const AddedToken& tok = tokens_[hit->second];
    uint32_t cp = 0;
    if (tok.single_word) {
      const bool left_ok = start == 0 || (DecodeUtf8Before(text, start, &cp), !IsWordChar(cp));
      const bool right_ok = stop == text.size() || (DecodeUtf8At(text, stop, &cp), !IsWordChar(cp));
      if (!left_ok || !right_ok) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        const size_t prev = DecodeUtf8Before(text, s, &cp);
        if (!IsWhitespace(cp)) break;
        s = prev;
      }
      // Whitespace an earlier token already took stays with it.
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        const size_t len = DecodeUtf8At(text, stop, &cp);
        if (!IsWhitespace(cp)) break;
        stop += len;
      }
      pos = stop;
    }
    if (start_offset < start) {
      out->push_back({std::string(text.substr(start_offset, start - start_offset)), -1,
                      at_origin && start_offset == 0});
    }
    out->push_back({std::string(text.substr(start, stop - start)), tok.id, false});
    start_offset = stop;
  }
  if (start_offset < text.size()) {
    out->push_back({std::string(text.substr(start_offset)), -1, at_origin && start_offset == 0});
  }
}

}  // namespace llm::tokenizer_internal
