// tokenizer.json "model" of type BPE: vocab, ranked merges (either "a b" strings or [a, b]
// pairs), ignore_merges, byte_fallback (<0xNN> tokens for characters missing from the vocab),
// unk_token and fuse_unk. Options that would change the result and are not implemented
// (dropout, continuing_subword_prefix, end_of_word_suffix) are refused by name.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace llm::tokenizer_internal {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Ids beyond this are rejected rather than allocating a huge id table for a corrupt file.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

class BpeModel {
 public:
  // `model` is the "model" object.
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model);

  // Appends the ids of one pre-token (a string in the model's alphabet). Thread-safe.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  const StringMap<int32_t>& vocab() const { return vocab_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }

 private:
  std::vector<int32_t> Bpe(std::string_view word) const;

  StringMap<int32_t> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // pair -> (rank, id)
  std::array<int32_t, 256> byte_fallback_ids_{};                      // <0xNN> ids, -1 if absent
  std::optional<int32_t> unk_id_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;

  mutable std::mutex cache_mu_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace llm::tokenizer_internal
