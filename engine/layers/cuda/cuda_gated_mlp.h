// silu(x W_gate^T) * (x W_up^T) W_down^T on CUDA: DeepSeek's dense MLP and every MoE layer's
// shared experts (cuda_moe_layer.h). Built only with the CUDA backend.
#pragma once

#include <string>

#include "engine/layers/cuda/cuda_linear.h"

namespace llm {

struct CudaGatedMlp {
  int inter = 0;       // 0: absent
  CudaLinear gate_up;  // [2 * inter, hidden] (gate, up stacked)
  CudaLinear down;     // [hidden, inter]
  // Loads p + {gate,up,down}_proj.weight and converts them to `quant`; with fp8_checkpoint, its
  // e4m3 tensors as stored (CudaLinear::LoadCheckpoint; `quant` for any it left unquantized).
  Status Load(Bf16WeightLoader& loader, const CudaLinearOps& ops, WeightQuant quant,
              const std::string& p, int hidden, int inter,
              const WeightStore* fp8_checkpoint = nullptr);
  // out [rows, hidden] (bf16); gate_up: [rows16, 2 inter] and act: [rows16, inter] scratch.
  Status Run(const CudaLinearOps& ops, const void* x, int rows, void* out, void* gate_up_buf,
             void* act_buf, const cuda::Fp8Rows& fp8_scratch) const;
};

}  // namespace llm
