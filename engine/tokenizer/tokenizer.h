// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (GPT-2, Llama-3, Qwen2 style).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/base/status.h"

namespace llm {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads `tokenizer.json`. Unsupported model / pre-tokenizer / decoder types are an error that
  // names the type.
  static StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(const nlohmann::json& tokenizer_json);

  // Added tokens (special or not) are matched first and never split; the rest goes through the
  // pre-tokenizer regexes, byte-level mapping and BPE merges. add_special_tokens applies the
  // post-processor template (BOS for Llama-3; nothing for Qwen2 / GPT-2).
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // Ids out of range decode to nothing. Invalid UTF-8 byte sequences decode to U+FFFD.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // Raw bytes a token stands for (the byte-level alphabet already undone). Special tokens
  // return their content.
  virtual std::string TokenBytes(int32_t id) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // Number of ids including added tokens (max id + 1).
  virtual int32_t vocab_size() const = 0;
  // BOS id the post-processor inserts, if any.
  virtual std::optional<int32_t> bos_token_id() const = 0;
};

// Streaming detokenizer: feeds one token at a time and returns only text that ends on a UTF-8
// character boundary, so a multi-byte character split across tokens is never emitted in halves.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Returns the newly completed text (possibly empty).
  std::string Step(int32_t id);
  // Returns whatever bytes are still pending; incomplete sequences become U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

}  // namespace llm
