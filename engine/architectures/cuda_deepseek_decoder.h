// DeepSeek-V2 / DeepSeek-V3 as a definition on the CUDA model runner (cuda_model_runner.h):
// MLA through the "cuda_mla" backend (absorbed decode, expanded-heads prefill), and
// DeepSeekMoE (cuda_moe_layer.h). Same semantics as the CPU definition (cpu_deepseek_decoder.h),
// which is its oracle. Built only with the CUDA backend.
//
// Per layer (T rows of the flattened batch, H heads, C = kv_lora_rank 512, R = rope 64):
//   a = xn @ [q_a_proj | q_proj ; kv_a_proj_with_mqa]^T      one GEMM      [T, QA + C + R]
//   q = q_b_proj(RMSNorm(a[:, :QA])) or a[:, :QA]                          [T, H, N + R]
//   latent = RMSNorm(a c_kv) ++ rope(a k_pe)                               [T, C + R] -> cache
//   decode rows: q_latent = q_nope @ W_UK (strided-batched over heads), RunMla,
//                attn = out_latent @ W_UV^T (strided-batched)
//   prefill seqs: q_pe roped in place, RunMlaPrefill (the backend expands the cached latents
//                through kv_b_proj and attends with full heads: kernels/cuda/mla/mla_prefill.h)
//                into their rows of attn
//   MoE: CudaMoeLayer (cuda_moe_layer.h: routing, permutation and grouped GEMMs on the device, no
//   host sync).
// Decode steps run in the runner's CUDA graphs (cuda_mla's graph form; graph_safe).
// fp8 weights (weight_dtype fp8): q_a / q / kv_a (fused), q_b, o_proj, the dense MLPs, the routed
// and shared experts through CudaLinear (per-tensor e4m3, activations per row); kv_b_proj (W_UK /
// W_UV, read by the batched absorptions and the prefill expansion), the router, embedding, norms
// and LM head stay bf16 (router logits fp32).
// ModelLoadOptions::mla_kernel picks cuda_mla's decode kernel (auto | wgmma | portable), logged
// at load.
#pragma once

#include <memory>

#include "engine/loader/deepseek_config.h"
#include "engine/runtime/cuda/cuda_model_runner.h"

namespace llm {

std::unique_ptr<CudaDecoder> NewCudaDeepseekDecoder(const DeepseekConfig& config);
// The decoder layers [first_layer, first_layer + num_layers) of the checkpoint alone, their
// caches the runner's layers 0 .. num_layers: what an MTP layer (cuda_deepseek_mtp.h) runs as
// its block.
std::unique_ptr<CudaDecoder> NewCudaDeepseekLayers(const DeepseekConfig& config, int first_layer,
                                                   int num_layers);

}  // namespace llm
