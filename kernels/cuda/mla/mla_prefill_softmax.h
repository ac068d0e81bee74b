// The online-softmax steps of the MLA prefill path when a sequence's keys are attended in chunks
// (MlaPrefill, mla_prefill.h): per chunk, the probabilities of a score tile against the chunk
// and the update of each (row, head)'s running max, running sum and fp32 output accumulator;
// after the last chunk, the accumulator divided by the sum into bf16. Plain C++: device pointers
// and an opaque stream.
#pragma once

namespace llm::cuda::mla {

// A score tile: `rows` consecutive query rows of one sequence against its keys
// [k0, k0 + cols). Row i sits at position first_pos + i and sees keys up to that position.
struct ChunkSoftmaxArgs {
  const float* scores = nullptr;  // [heads, rows, cols] q . k, unscaled
  void* probs = nullptr;          // bf16 [heads, rows, cols]: exp(scale s - new max), 0 if masked
  float* row_max = nullptr;       // [rows, heads] running max of scale * s
  float* row_sum = nullptr;       // [rows, heads] running sum of probs (the bf16 values)
  float* acc = nullptr;           // [rows, heads, v_dim] sum of probs @ v, rescaled here
  int heads = 0, rows = 0, cols = 0, v_dim = 0;
  int first_pos = 0;  // position of row 0
  int k0 = 0;         // position of column 0
  float scale = 1.0f;
  // The sequence's first chunk: no running state yet (row_max, row_sum and acc are written, not
  // read; the P @ V product that follows writes acc with beta 0).
  bool first_chunk = false;
};

// One CTA per (head, row). Where the row sees a key of the chunk: new max m' = max(m, chunk max),
// probs = bf16(exp(scale s - m')), sum = sum * exp(m - m') + sum(probs), acc *= exp(m - m').
// A row that sees none of the chunk gets zero probabilities and keeps its state.
void LaunchChunkSoftmax(const ChunkSoftmaxArgs& a, void* stream);

// out[r, h, :] = bf16(acc[r, h, :] / row_sum[r, h]) for `rows` rows; out rows are heads * v_dim
// elements apart, as acc's.
void LaunchNormalizeRows(const float* acc, const float* row_sum, int rows, int heads, int v_dim,
                         void* out, void* stream);

}  // namespace llm::cuda::mla
