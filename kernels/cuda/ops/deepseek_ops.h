// Fused kernels of the DeepSeek-V2/V3 decoder on CUDA
// (engine/architectures/cuda_deepseek_decoder.cc). Plain C++ launcher header: pointers are device
// pointers, `stream` is a cudaStream_t. Activations are bf16 unless noted.
#pragma once

#include <cstdint>

namespace llm::cuda {

// out[r, :dim] = bf16(rmsnorm(in[r, :dim]) * weight), rows with their own strides (elements).
// Used for q_a_layernorm and kv_a_layernorm, which read slices of the fused projection output.
void LaunchRmsNormStrided(const void* in, int in_stride, const void* weight, int rows, int dim,
                          float eps, void* out, int out_stride, void* stream);

// DeepSeek rope (engine/architectures/cpu_deepseek_decoder.h): the (d/2, 2) pairs are
// de-interleaved, then rotate_half; cos and sin times mscale, angle = float(pos) * inv_freq[i] in
// fp32 as on the CPU. Row t, head h reads in + t * in_row + h * in_head and writes out + t *
// out_row + h * out_head (may alias in exactly).
struct DeepseekRopeArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_row = 0, in_head = 0, out_row = 0, out_head = 0;  // element strides
  const int32_t* positions = nullptr;                          // [num_tokens]
  const float* inv_freq = nullptr;                             // [rope_dim / 2]
  float mscale = 1.0f;
  int num_tokens = 0, num_heads = 0, rope_dim = 0;
};
void LaunchDeepseekRope(const DeepseekRopeArgs& a, void* stream);

// out[j, :] = bf16(latent first + j of a sequence) for j in [0, count): gathers from a paged
// latent cache [num_blocks, block_size, width] (bf16, or fp8 e4m3 bytes times scale) whose
// sequence owns blocks `pages`, into [count, width].
void LaunchGatherLatents(const void* cache, bool fp8, float scale, const int32_t* pages,
                         int block_size, int width, int first, int count, void* out, void* stream);

// Causal softmax over materialized scores: s fp32 [heads, q_rows, kv_len] (unscaled); row i of
// a head attends to [0, first_pos + i]. p = bf16(softmax(scale * s)), zeros past the causal edge.
void LaunchCausalSoftmax(const float* s, int heads, int q_rows, int kv_len, int first_pos,
                         float scale, void* p, void* stream);

}  // namespace llm::cuda
