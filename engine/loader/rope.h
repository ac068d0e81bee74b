// Rotary-embedding frequencies with linear, llama3 and yarn scaling applied. One definition
// shared by the CPU oracle, the GPU models and the DeepSeek (MLA) models so their angles agree.
#pragma once

#include <vector>

#include "engine/loader/model_config.h"

namespace llm {

// inv_freq[i] for i in [0, dim / 2): 1 / theta^(2i / dim), then `scaling` as Hugging Face's
// _compute_{linear_scaling,llama3,yarn}_parameters apply it (yarn with truncate = true is also
// DeepSeek's yarn_find_correction_range / yarn_linear_ramp_mask). `dim` is the rotated width.
std::vector<float> RopeInvFreq(int dim, double theta, const RopeScaling& scaling);

// The Llama-family table: all of head_dim rotates.
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace llm
