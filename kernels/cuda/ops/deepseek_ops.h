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

// The MLA inputs of one layer's rows after the fused a-projection, in one launch (the decode
// steps' chain of small kernels): per token t,
//   latent[t, :C]    = LaunchRmsNormStrided's rmsnorm(kv[t, :C]) * kv_norm  (C = kv_rank)
//   latent[t, C:C+R] = LaunchDeepseekRope of kv[t, C:C+R]                    (the shared k_pe)
//   q_pe[t, h, :R]   = LaunchDeepseekRope of q[t, h, N:N+R] for every head   (N = q_nope)
// with the same bits as those launches (rope's in / out pointers and strides are not read; its
// num_heads is H).
// q is read, not written: the prefill path's in-place rotation of q comes after.
struct MlaRopeNormArgs {
  const void* kv = nullptr;  // bf16 rows of c_kv ++ k_pe, kv_row elements apart
  int64_t kv_row = 0;
  const void* kv_norm = nullptr;  // bf16 [C]
  int kv_rank = 0;
  float eps = 1e-6f;
  void* latent = nullptr;  // bf16 [T, C + R] rows, latent_row elements apart
  int64_t latent_row = 0;
  const void* q = nullptr;  // bf16 [T, H, N + R] rows, q_row / q_head elements apart
  int64_t q_row = 0, q_head = 0;
  int q_nope = 0;
  void* q_pe = nullptr;   // bf16 [T, H, R], dense
  DeepseekRopeArgs rope;  // positions, inv_freq, mscale, num_tokens, num_heads (H), rope_dim (R)
};
void LaunchMlaRopeNorm(const MlaRopeNormArgs& a, void* stream);

// The absorbed MLA decode's two per-head products for a few decode rows, as PDL kernels (the
// cuBLAS batched GEMMs they replace there are plain launches, each a full drain of the step's
// kernel chain): with W = w_kv_b [H, N + V, C] (W_UK_h its rows [0, N), W_UV_h [N, N + V)),
//   LaunchMlaAbsorbQ:   q_latent[r, h, :] = q[r, h, :N] @ W_UK_h              (fp32 sums)
//   LaunchMlaAbsorbOut: attn[r, h, :V]    = W_UV_h @ out_latent[r, h, :]
// for r < rows. False (nothing launched) where MlaAbsorbOk does not hold.
struct MlaAbsorbArgs {
  const void* w_kv_b = nullptr;  // bf16 [H, N + V, C]
  int heads = 0, nope = 0, v_dim = 0, rank = 0;
  int rows = 0;
  const void* q = nullptr;  // bf16: q[r, h, :N] at q + r q_row + h q_head
  int64_t q_row = 0, q_head = 0;
  void* q_latent = nullptr;          // bf16 [rows, H, C]
  const void* out_latent = nullptr;  // bf16 [rows, H, C]
  void* attn = nullptr;              // bf16 [rows, H, V]
};
constexpr int kMlaAbsorbMaxRows = 4;
inline bool MlaAbsorbOk(const MlaAbsorbArgs& a) {
  return a.rows >= 1 && a.rows <= kMlaAbsorbMaxRows && a.nope > 0 && a.nope % 64 == 0 &&
         a.rank > 0 && a.rank % 256 == 0 && a.rank <= 1024 && a.v_dim > 0 && a.v_dim % 8 == 0 &&
         a.q_head % 8 == 0 && a.q_row % 8 == 0;
}
[[nodiscard]] bool LaunchMlaAbsorbQ(const MlaAbsorbArgs& a, void* stream);
[[nodiscard]] bool LaunchMlaAbsorbOut(const MlaAbsorbArgs& a, void* stream);

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
