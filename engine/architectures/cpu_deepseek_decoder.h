// DeepSeek-V2 / DeepSeek-V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM) as a definition on the
// CPU model runner (cpu_model_runner.h): multi-head latent attention over the runner's paged
// latent cache and MLA backend, DeepSeekMoE feed-forward layers.
//
// Attention per layer (HF modeling_deepseek.py semantics):
//   q      = q_b_proj(RMSNorm_1e-6(q_a_proj(x)))  or  q_proj(x)     -> [H, qk_nope + qk_rope]
//   kv_a   = kv_a_proj_with_mqa(x) -> c_kv [kv_lora_rank] ++ k_pe [qk_rope]
//   latent = RMSNorm_1e-6(c_kv) ++ rope(k_pe)      <- the only thing cached per token
//   k_nope, v per head = kv_b_proj(latent c part)   (W_UK, W_UV rows of kv_b_proj)
// Rope is HF DeepSeek's: the (d/2, 2) pairs are de-interleaved before rotate_half, so rope(x)
// gives [x0 c - x1 s, x2 c - x3 s, ..., x1 c + x0 s, x3 c + x2 s, ...] * mscale; q_pe and the
// cached k_pe both use that output layout.
// Decode sequences (1..kMlaMaxDecodeQueryLen query rows) attend in the absorbed form through the
// MLA backend (q_latent = W_UK^T q_nope, output W_UV * out_latent); longer ones (prefill chunks)
// expand the sequence's cached latents to full heads in this definition. Both read the latents
// from the cache, so an fp8 cache affects them alike.
//
// Latent cache dtype: ModelLoadOptions::kv_cache_dtype "fp8_e4m3" or, with "auto", config.json's
// `mla_cache_dtype` (default fp32). fp8 uses one static dequant scale per layer: the checkpoint
// scalar `model.layers.N.self_attn.kv_scale` when present, else config `mla_cache_scale` (1.0).
// Other kv_cache_dtype values (int8, fp8_e4m3_dynamic) and kv_scales_file are rejected with
// InvalidArgument; kv_scale_granularity does not apply (one scalar per layer).
//
// A tensor-parallel rank is this definition on the plan's rank-local configuration
// (tensor_parallel_plan.h): its query heads (q_proj / q_b_proj, kv_b_proj and o_proj by head),
// the whole latent (q_a_proj and kv_a_proj_with_mqa are replicated: every rank caches the same
// latents), its slice of every expert and of the shared and dense MLPs; o_proj's and the
// feed-forward block's outputs are summed over the ranks (CpuStep::AllReduceSum).
#pragma once

#include <memory>

#include "engine/loader/deepseek_config.h"
#include "engine/runtime/cpu/cpu_model_runner.h"

namespace llm {

std::unique_ptr<CpuArchitecture> NewCpuDeepseekDecoder(const DeepseekConfig& config);
// The decoder layers [first_layer, first_layer + num_layers) of the checkpoint alone, their
// caches step.kv[0 .. num_layers): what an MTP layer (cpu_deepseek_mtp.h) runs as its block.
std::unique_ptr<CpuArchitecture> NewCpuDeepseekLayers(const DeepseekConfig& config, int first_layer,
                                                      int num_layers);

}  // namespace llm
