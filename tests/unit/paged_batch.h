// Test batches over a paged cache: sequences appended to an AttentionBatch in the CSR layout
// every backend shares, their blocks taken in turn from a (shuffled) list of block ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention_backend.h"

namespace llm::test {

// Appends a sequence of kv_len cached tokens, the last q_len of them new this step, to `b`
// (q_indptr, kv_lens, page_indptr, page_indices; not slot_mapping or the counts), its pages
// blocks[*next, ...), advancing *next. Returns the cache slot of each of its kv_len positions.
inline std::vector<int32_t> AppendSequence(AttentionBatch& b, const std::vector<int32_t>& blocks,
                                           size_t* next, int kv_len, int q_len, int block_size) {
  const size_t pages = (static_cast<size_t>(kv_len) + block_size - 1) / block_size;
  const auto first = blocks.begin() + static_cast<std::ptrdiff_t>(*next);
  b.page_indices.insert(b.page_indices.end(), first, first + static_cast<std::ptrdiff_t>(pages));
  *next += pages;
  b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
  b.kv_lens.push_back(kv_len);
  b.q_indptr.push_back(b.q_indptr.back() + q_len);
  std::vector<int32_t> slots(static_cast<size_t>(kv_len));
  for (int p = 0; p < kv_len; ++p) {
    slots[p] = first[p / block_size] * block_size + p % block_size;
  }
  return slots;
}

}  // namespace llm::test
