// Reading a Hugging Face weight map into the CPU models' fp32 layouts, shared by every CPU
// decoder: stacked projections (q/k/v, gate/up) and the embedding / LM head pair.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loader/model_config.h"
#include "engine/loader/safetensors.h"

namespace llm {

// One block of rows of a stacked matrix: tensor `prefix + name + ".weight"`, [rows, cols].
struct StackedPart {
  std::string name;
  int64_t rows = 0;
};

// Stacks the parts' weights (and, with `bias`, their ".bias" vectors into *b) in order, so that
// one matrix product computes them all.
Status ReadStacked(const WeightStore& w, const std::string& prefix,
                   std::span<const StackedPart> parts, int64_t cols, bool bias,
                   std::vector<float>* out, std::vector<float>* b);

// The embedding (`embed_name`) into *embed; the LM head (`head_name`) into *lm_head unless the
// embeddings are tied (then *lm_head stays empty, and a stored head must be an exact copy). An
// MTP layer names its own tensors (shared_head.head) or the model's.
Status ReadEmbeddingAndHead(const WeightStore& w, const ModelConfig& c, std::vector<float>* embed,
                            std::vector<float>* lm_head,
                            const std::string& embed_name = "model.embed_tokens.weight",
                            const std::string& head_name = "lm_head.weight");

}  // namespace llm
