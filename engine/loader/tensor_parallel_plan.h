// Tensor parallelism: how rank r of N holds a model's weights, written once for every family the
// CPU decoders compute (Llama, Mistral, Qwen2 / 3, Qwen3-MoE, Mixtral, Gemma 2 / 3, gpt-oss,
// DeepSeek V2 / V3). A rank computes its heads and its slice of every feed-forward block; the
// outputs of the row-split projections are partial sums that the rank's communicator adds up
// (engine/runtime/communicator.h).
//
// Each checkpoint tensor has one rule, found by the last two components of its name
// (TensorParallelRules() lists them all):
//   column  output rows (dim 0 of a [out, in] weight) in N equal parts, whole heads each:
//           q_proj, q_b_proj, kv_b_proj (DeepSeek: per head), gate_proj / up_proj / w1 / w3
//           (dense MLP, every expert, the shared experts), their biases, gpt-oss's sinks, its
//           stacked experts' gate_up_proj (dim 2 of [E, hidden, 2I]: the interleaved gate / up
//           pairs stay together), gate_up_proj_bias (dim 1) and, stored as MXFP4,
//           gate_up_proj_blocks / _scales (dim 1 of [E, 2I, hidden / 32, (16)])
//   kv      k_proj, v_proj and their biases: N equal parts when num_key_value_heads >= N; else
//           the one KV head the rank's query heads read (replicated over N / num_kv_heads ranks)
//   row     input columns (dim 1) in N equal parts: o_proj, down_proj / w2, gpt-oss's stacked
//           down_proj [E, I, hidden], and its MXFP4 down_proj_blocks / _scales by whole 32-value
//           blocks (dim 2 of [E, hidden, I / 32, (16)]); the rank's product is a partial sum
//   first   the biases of row-split projections (o_proj.bias, down_proj.bias, gpt-oss's
//           down_proj_bias): rank 0 holds them and the other ranks zeros, so the sum adds them once
//   vocab   embed_tokens and lm_head rows [r * Vr, (r + 1) * Vr), Vr = ceil(vocab / N), padded
//           with zero rows past the vocabulary: the embedding lookup of a token outside the
//           rank's rows is zeros (summed over the ranks), the LM head's logit slices are
//           gathered and the padding dropped
//   replicated  every norm, the MoE routers (gate, router, e_score_correction_bias), DeepSeek's
//           small down-projections q_a_proj and kv_a_proj_with_mqa: every rank computes (and
//           caches) the same latent, and attends with its own query heads
//
// gpt-oss's MXFP4 checkpoints (quantization_config mxfp4) are cut as stored: the uint8 blocks
// and e8m0 scales of a rank are the whole tensor's rows / blocks, so dequantizing the cut equals
// cutting the dequantized tensor; the experts' intermediate / N must be a multiple of 32 (the
// real gpt-oss's 2880 splits 2 ways, not 4 or 8). fp8 checkpoints are refused.
//
// MoE layers are tensor parallel inside every expert (each expert's intermediate / N, router
// replicated), not expert parallel: every rank routes the same way, takes an equal share of
// every expert's work whatever the routing's balance, and needs no collective beyond the
// all-reduce a dense layer has. Expert parallelism (TensorParallelOptions::expert_parallel) is
// refused, not approximated.
//
// The rank-local configuration (TensorParallelPlan::local) is the checkpoint's with the split
// dimensions divided: num_attention_heads / N, num_key_value_heads / N (or 1), intermediate
// sizes / N, vocab_size = Vr; the decoders size everything from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loader/deepseek_config.h"
#include "engine/loader/model_config.h"

namespace llm {

// The tensor-parallel sizes this server accepts.
inline constexpr int kTensorParallelSizes[] = {1, 2, 4, 8};

struct TensorParallelOptions {
  int size = 1;  // N: one of kTensorParallelSizes
  int rank = 0;  // r in [0, N)
  // Experts placed whole on ranks (rank r holding experts [r E / N, (r + 1) E / N)): not
  // implemented; true is refused (the MoE layers are split inside every expert).
  bool expert_parallel = false;
};

// How one tensor is cut (the file comment names each).
enum class TensorSplit { kReplicated, kColumn, kKvHeads, kRow, kFirstRank, kVocab };

struct TensorRule {
  std::string key;  // the tensor name's last two components: "o_proj.weight", "experts.down_proj"
  TensorSplit split = TensorSplit::kReplicated;
  int dim = 0;  // kColumn / kRow / kKvHeads / kVocab: the dimension cut
};

// Every rule, once.
const std::vector<TensorRule>& TensorParallelRules();

// Rank r's part of one tensor: dims[dim] restricted to [begin, begin + count), then padded with
// zeros to `padded` entries (the vocabulary); kReplicated: the whole tensor; kFirstRank: the whole
// tensor on rank 0, zeros elsewhere.
struct TensorShard {
  TensorSplit split = TensorSplit::kReplicated;
  int dim = 0;
  int64_t begin = 0, count = 0, padded = 0;
  bool zeros = false;  // kFirstRank on a rank other than 0
};

struct TensorParallelPlan {
  int rank = 0, size = 1;
  ModelConfig model;  // the checkpoint's configuration (what the engine sees)
  ModelConfig local;  // the rank's (the file comment); the whole model's when size is 1
  std::optional<DeepseekConfig> deepseek;  // DeepSeek: the rank's configuration (base == local)
  int first_q_head = 0;                    // the checkpoint's index of the rank's first head
  int first_kv_head = 0;                   // ... and of its first KV head
  int64_t vocab_begin = 0;                 // the rank's first vocabulary row
  int64_t vocab_rows = 0;  // rows of the vocabulary it holds; local.vocab_size - this are padding
  // Tensors of the layers [dropped_layers_begin, dropped_layers_end) are not carried: DeepSeek-V3's
  // MTP layers, which the decoder does not run (the unsharded load ignores them too).
  int dropped_layers_begin = 0, dropped_layers_end = 0;
  std::vector<TensorRule> rules = TensorParallelRules();  // a test may break one on purpose

  // The rule of `name` (InvalidArgument naming a tensor that no rule covers), cut for this rank
  // from a tensor of `shape` (InvalidArgument naming a dimension that does not split N ways).
  StatusOr<TensorShard> ShardOf(const std::string& name, const std::vector<int64_t>& shape) const;
  // Whether `name` is left out of the rank's weights (dropped_layers_begin / end).
  bool Dropped(const std::string& name) const;
};

// The plan of rank options.rank: InvalidArgument naming the value for a size outside
// kTensorParallelSizes, a rank outside [0, size), num_attention_heads not divisible by the size,
// num_key_value_heads neither a multiple nor a divisor of it, an intermediate size not divisible
// by it, MXFP4 experts whose intermediate / N is not a multiple of 32; Unimplemented for
// expert_parallel, an fp8 checkpoint (quantization_config) and an architecture the rules do not
// cover.
StatusOr<TensorParallelPlan> MakeTensorParallelPlan(const ModelConfig& config,
                                                    const TensorParallelOptions& options);
// DeepSeek V2 / V3: the same checks on its MLA heads and expert sizes; plan.deepseek is the
// rank's configuration.
StatusOr<TensorParallelPlan> MakeTensorParallelPlan(const DeepseekConfig& config,
                                                    const TensorParallelOptions& options);

// The rules of a rank whose decoder adds o_proj's bias after the all-reduce, as the whole model
// adds it (the CUDA dense decoder: inside the next norm, in fp32): the bias replicated on every
// rank instead of rank 0's alone (the CPU decoders add it inside o_proj, before the sum).
void ReplicateOProjBias(TensorParallelPlan* plan);

}  // namespace llm
