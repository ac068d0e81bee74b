// The tokenizer as the grammar sees it: each token's raw bytes, the end-of-sequence ids and the
// special tokens that never appear inside a grammar's output. Tokens are also kept sorted by their
// bytes so mask computation walks a shared prefix once (an implicit trie).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/result.h"

namespace llm::grammar {

class Vocabulary {
 public:
  // tokens[id] is the token's bytes as they appear in the output (an empty string never matches).
  static std::shared_ptr<const Vocabulary> Create(std::vector<std::string> tokens,
                                                  std::vector<int32_t> eos_ids,
                                                  std::vector<int32_t> special_ids = {});
  // A Hugging Face tokenizer.json: model.vocab plus added_tokens. Byte-level BPE tokens are mapped
  // back from GPT-2's byte-to-unicode alphabet; SentencePiece-style ones get '▁' -> ' ' and
  // "<0xNN>" -> that byte. Special added tokens are never allowed inside the grammar.
  static Result<std::shared_ptr<const Vocabulary>> FromHfTokenizerJson(
      const std::string& json_text, std::vector<int32_t> eos_ids);

  size_t size() const { return tokens_.size(); }
  size_t mask_words() const { return (tokens_.size() + 31) / 32; }
  const std::string& token(int32_t id) const { return tokens_[id]; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool IsEos(int32_t id) const;
  // Ids of ordinary tokens (non-empty, not special, not EOS) in byte order.
  const std::vector<int32_t>& sorted() const { return sorted_; }
  bool byte_level() const { return byte_level_; }
  // sorted()'s tokens, their bytes contiguous in that order, and each one's shared prefix length
  // with the token before it (0 for the first): a walk of the whole vocabulary reads them in
  // sequence instead of chasing every token's string.
  std::string_view sorted_token(size_t i) const {
    return {sorted_bytes_.data() + sorted_offsets_[i], sorted_offsets_[i + 1] - sorted_offsets_[i]};
  }
  uint32_t sorted_lcp(size_t i) const { return sorted_lcp_[i]; }
  // Skip tables of sorted() (see BuildSkipTables).
  const std::vector<uint32_t>* sorted_skip() const { return sorted_skip_; }
  bool IsOrdinary(int32_t id) const { return ordinary_[id] == 1; }
  // Special tokens (non-empty, not EOS): allowed only by grammars that say so.
  const std::vector<int32_t>& special_ids() const { return special_ids_; }
  bool IsSpecial(int32_t id) const { return ordinary_[id] == 2; }

 private:
  std::vector<std::string> tokens_;
  std::vector<int32_t> eos_ids_;
  std::vector<int32_t> sorted_;
  std::vector<int32_t> special_ids_;
  std::vector<char> ordinary_;  // 1: ordinary, 2: special, 0: neither (EOS, empty)
  std::vector<uint32_t> sorted_skip_[3];
  std::string sorted_bytes_;
  std::vector<uint32_t> sorted_offsets_;
  std::vector<uint32_t> sorted_lcp_;
  bool byte_level_ = false;
};

// For a byte-ordered token list: skip[d - 1][i] is the first index after i whose token does not
// share the first d bytes of token i, for d = 1..kSkipDepth. A walk that rejects a prefix of d
// bytes jumps over every token that starts with it.
constexpr size_t kSkipDepth = 3;
void BuildSkipTables(const Vocabulary& vocab, const std::vector<int32_t>& ids,
                     std::vector<uint32_t>* skip);

}  // namespace llm::grammar
