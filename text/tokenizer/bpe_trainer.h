// Trains a small byte-level BPE vocabulary and writes it as a Hugging Face tokenizer.json object.
// Used by tools/make_tiny_model to give the embedded default model a real tokenizer.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llm {

struct BpeTrainerConfig {
  int vocab_size = 512;  // 256 byte tokens + merges (special tokens come on top)
  // Added special tokens, in id order after the BPE vocabulary. The first is BOS, the second EOS.
  std::vector<std::string> special_tokens = {"<|begin_of_text|>", "<|end_of_text|>"};
  // Pre-tokenizer regex written into tokenizer.json (Llama-3's by default).
  std::string pretokenizer_regex;
};

// Deterministic: the same corpus and config give the same tokenizer.json.
nlohmann::json TrainByteLevelBpe(const std::string& corpus, const BpeTrainerConfig& config);

// The pre-tokenizer regexes of the model families we serve.
extern const char* const kGpt2PretokenizerRegex;
extern const char* const kLlama3PretokenizerRegex;
extern const char* const kQwen2PretokenizerRegex;

}  // namespace llm
