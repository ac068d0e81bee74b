// The greedy trace the tensor-parallel model tests compare, on any device: two sequences prefilled
// together, then one-token decode steps, each sequence in its own blocks; per step the logits of
// each sequence's last row and their greedy tokens. Shared by the CPU test
// (tests/unit/test_tensor_parallel_models.cc) and the GPU one
// (tests/gpu/test_tensor_parallel_cuda.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "engine/runtime/model.h"

namespace llm::tp_trace {

struct Trace {
  Status status;
  std::vector<std::vector<float>> logits;  // [steps][seqs * vocab]
  std::vector<int32_t> tokens;             // [steps * seqs]
};

// The run's geometry: sequence s owns blocks s * blocks_per_seq, ...
struct Shape {
  int block_size = 16;
  int blocks_per_seq = 4;
  int decode_steps = 4;
  std::vector<std::vector<int32_t>> prompts;  // taken modulo the vocabulary
};

// One step: for every sequence its tokens [kv_len - q_len, kv_len) of history.
inline ForwardBatch Step(const Shape& shape, const std::vector<std::vector<int32_t>>& history,
                         const std::vector<int>& q_len) {
  const int bs = shape.block_size;
  ForwardBatch b;
  b.attn.q_indptr = {0};
  b.attn.page_indptr = {0};
  for (size_t s = 0; s < history.size(); ++s) {
    const int kv_len = static_cast<int>(history[s].size());
    for (int p = kv_len - q_len[s]; p < kv_len; ++p) {
      b.token_ids.push_back(history[s][p]);
      b.positions.push_back(p);
      const int block = static_cast<int>(s) * shape.blocks_per_seq + p / bs;
      b.attn.slot_mapping.push_back(block * bs + p % bs);
    }
    b.attn.q_indptr.push_back(b.attn.q_indptr.back() + q_len[s]);
    b.attn.kv_lens.push_back(kv_len);
    const int pages = (kv_len + bs - 1) / bs;
    for (int i = 0; i < pages; ++i) {
      b.attn.page_indices.push_back(static_cast<int>(s) * shape.blocks_per_seq + i);
    }
    b.attn.page_indptr.push_back(static_cast<int>(b.attn.page_indices.size()));
    b.logit_rows.push_back(b.attn.q_indptr.back() - 1);
  }
  b.attn.num_seqs = static_cast<int>(history.size());
  b.attn.num_tokens = static_cast<int>(b.token_ids.size());
  return b;
}

// The prompts prefilled together, then shape.decode_steps one-token steps; the history grows by
// `forced` (a reference's tokens, [steps * seqs]) where given, else by the greedy ones.
inline Trace Drive(Model& model, const Shape& shape, const std::vector<int32_t>* forced = nullptr) {
  const int vocab = model.config().vocab_size;
  std::vector<std::vector<int32_t>> history = shape.prompts;
  std::vector<int> q_len;
  for (auto& h : history) {
    for (int32_t& t : h) t %= vocab;
    q_len.push_back(static_cast<int>(h.size()));
  }
  Trace trace;
  for (int step = 0; step <= shape.decode_steps; ++step) {
    std::vector<float> logits;
    trace.status = model.Forward(Step(shape, history, q_len), &logits);
    if (!trace.status.ok()) return trace;
    for (size_t s = 0; s < history.size(); ++s) {
      const float* row = logits.data() + s * vocab;
      const int32_t next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      trace.tokens.push_back(next);
      history[s].push_back(forced != nullptr ? (*forced)[trace.tokens.size() - 1] : next);
      q_len[s] = 1;
    }
    trace.logits.push_back(std::move(logits));
  }
  return trace;
}

// The largest |a - whole| of one step over the largest |whole|.
inline double RelativeError(const std::vector<float>& a, const std::vector<float>& whole) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - whole[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(whole[i])));
  }
  return err / scale;
}

}  // namespace llm::tp_trace
