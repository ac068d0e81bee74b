// DeepSeek-V2 / DeepSeek-V3 decoder on CUDA: bf16 weights in device memory, cuBLAS projections,
// MLA through the "cuda_mla" backend (absorbed decode) plus an expanded-heads prefill path, and
// DeepSeekMoE on the device. Same semantics as the CPU DeepseekModel (deepseek_model.h), which is
// its oracle. Built only with the CUDA backend.
//
// Per layer (T rows of the flattened batch, H heads, C = kv_lora_rank 512, R = rope 64):
//   a = xn @ [q_a_proj | q_proj ; kv_a_proj_with_mqa]^T      one GEMM      [T, QA + C + R]
//   q = q_b_proj(RMSNorm(a[:, :QA])) or a[:, :QA]                          [T, H, N + R]
//   latent = RMSNorm(a c_kv) ++ rope(a k_pe)                               [T, C + R] -> cache
//   decode rows: q_latent = q_nope @ W_UK (strided-batched over heads), RunMla,
//                attn = out_latent @ W_UV^T (strided-batched)
//   prefill seqs: gather the cached latents, expand K_nope / V = c @ W_UK^T / W_UV^T (one GEMM),
//                materialized fp32 scores (two strided-batched GEMMs: nope + shared k_pe),
//                causal softmax kernel, PV GEMM. Queries are tiled so the score buffer stays
//                under 256 MiB: cost O(H * Tq * kv) memory traffic per tile, fine for
//                correctness, a fused FMHA is the follow-up.
//   MoE: router GEMM -> routing kernel (device) -> one small D2H copy of the top-k ids -> the
//        host groups rows by expert (cuBLAS needs each expert's row count on the host anyway)
//        -> gather kernel -> per-expert gate_up GEMM, one SiLU-mul, per-expert down GEMM ->
//        deterministic weighted combine with the shared-expert output. The host copy of the
//        top-k ids also feeds the opt-in routing trace (Model::set_routing_trace).
// ModelLoadOptions::mla_kernel picks cuda_mla's decode kernel (auto | wgmma | portable), logged
// at load.
#pragma once

#include <memory>

#include "engine/models/deepseek_config.h"
#include "engine/models/model.h"
#include "engine/safetensors.h"

namespace llm {

// weights may be null when options.dummy_weights is set (tensors filled on the device).
StatusOr<std::unique_ptr<Model>> CreateCudaDeepseekModel(const DeepseekConfig& config,
                                                         const WeightStore* weights,
                                                         const ModelLoadOptions& options);

}  // namespace llm
