// Tokenizer read from a Hugging Face `tokenizer.json` (plus `tokenizer_config.json` when present),
// encoding and decoding as HF tokenizers / transformers do: BPE models (byte-level GPT-2 /
// Llama-3 / Qwen style, and SentencePiece-style with byte_fallback as in Llama-2 / Gemma),
// normalizers, pre-tokenizers, added tokens with their flags, post-processor and decoders.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace llm {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads `tokenizer.json`, and `tokenizer_config.json` from the same directory when it exists.
  // Unsupported components or options are an error that names them.
  static StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // `tokenizer_config` may be null. Its clean_up_tokenization_spaces applies to Decode; BOS / EOS
  // come from the post-processor alone, as in transformers 5 (add_bos_token is not applied).
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(const nlohmann::json& tokenizer_json);
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(const nlohmann::json& tokenizer_json,
                                                       const nlohmann::json& tokenizer_config);

  // HF's encode: added tokens split out, normalizer, pre-tokenizer, model, and with
  // add_special_tokens the post-processor's BOS / EOS (HF `tokenizer(text)` passes true).
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // HF's decode. Unknown ids decode to nothing; ill-formed UTF-8 becomes U+FFFD.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // One token decoded on its own, not at the start of a text (raw bytes for byte-level BPE;
  // special tokens give their content).
  virtual std::string TokenBytes(int32_t id) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // Number of ids including added tokens (max id + 1).
  virtual int32_t vocab_size() const = 0;
  // BOS id that Encode(text, true) starts with, if any.
  virtual std::optional<int32_t> bos_token_id() const = 0;

  // Streaming hooks for IncrementalDecoder. The token string of an id (nullptr when unknown).
  virtual const std::string* TokenString(int32_t id) const = 0;
  // Decoder output for a window of token strings, as raw bytes; `*stable` is the prefix length
  // later tokens cannot change. See tokenizer_internal::Decoder::Decode.
  virtual std::string DecodeWindow(std::span<const std::string> tokens, bool at_start, bool at_end,
                                   size_t* stable) const = 0;
  virtual bool clean_up_tokenization_spaces() const = 0;
};

// transformers' clean_up_tokenization: removes the space before punctuation and contractions.
std::string CleanUpTokenizationSpaces(std::string text);

// Streaming detokenizer: fed one token at a time, it returns text deltas whose concatenation
// (with Flush) is exactly Decode() of all the ids, and never emits part of a UTF-8 character.
// Text that a later token could still change (a run of byte-fallback tokens, a character split
// across tokens, a space the clean-up may remove) is held back until it is settled.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Returns the newly settled text (possibly empty).
  std::string Step(int32_t id);
  // Returns everything still held back; incomplete sequences become U+FFFD.
  std::string Flush();

 private:
  std::string Emit(std::string text, bool final);

  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<std::string> window_;  // token strings since the last settled point
  bool at_start_ = true;             // the window begins the text
  size_t consumed_ = 0;              // raw bytes of the window's decode already passed on
  std::string cleanup_pending_;      // text held for clean_up_tokenization_spaces
};

}  // namespace llm
