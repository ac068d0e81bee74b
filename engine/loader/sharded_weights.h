// One tensor-parallel rank's weights: the checkpoint's tensors cut by the plan
// (tensor_parallel_plan.h) into an in-memory WeightStore of fp32 tensors under their checkpoint
// names and rank-local shapes, so that a decoder built on the plan's rank-local configuration
// reads them with its ordinary code. uint8 tensors (gpt-oss's MXFP4 *_blocks / *_scales) are cut
// as stored bytes and stay uint8; the store keeps the checkpoint's quantization_config.
#pragma once

#include <memory>

#include "base/status.h"
#include "engine/loader/safetensors.h"
#include "engine/loader/tensor_parallel_plan.h"

namespace llm {

// Every tensor of `full` (all marked consumed there) cut for plan.rank, except those the plan
// drops; those the loaders ignore by design (IgnoredTensor: rotary tables, KV-cache scales) are
// carried whole, in their dtype (DeepSeek's per-layer kv_scale is one scalar), except a static KV
// cache's per-head / per-channel K and V scales, cut to the rank's KV heads (fp32) like k_proj.
// A tensor without a rule fails, naming it. Check the result's CheckAllConsumed after loading,
// not full's.
StatusOr<std::unique_ptr<WeightStore>> ShardWeights(const WeightStore& full,
                                                    const TensorParallelPlan& plan);

}  // namespace llm
