// A structured-output token mask applied to a row of logits: what the grammar does not allow
// gets -inf before penalties, temperature and the kept set, so the sampler and the logprobs see
// the masked distribution.
#pragma once

#include <cstdint>
#include <span>

namespace llm {

// mask: bit (id & 31) of word (id >> 5) set when token id is allowed, for ids < mask_tokens;
// ids at or past mask_tokens (padding rows of the LM head) are never allowed. Returns how many
// tokens stay allowed.
int ApplyTokenMask(std::span<float> logits, const uint32_t* mask, size_t mask_tokens);

}  // namespace llm
