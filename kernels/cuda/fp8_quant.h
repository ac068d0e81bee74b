// Per-tensor fp8 (e4m3) quantization of bf16 tensors on CUDA, for fp8 weights and the dynamic
// activation scales of fp8 GEMMs. Plain C++ launcher header: device pointers, `stream` is a
// cudaStream_t.
//
// Definition (engine/base/quant.h): scale = max(amax / 448, tiny), q = e4m3(x / scale) with
// round-to-nearest-even and saturation to +-448; x ~ q * scale.
#pragma once

#include <cstdint>

namespace llm::cuda {

// amax = max(amax, max |x|) over x: bf16 [n]. amax must start at 0 (or a previous maximum):
// it is combined with an atomic max.
void LaunchAbsMaxBf16(const void* x, int64_t n, float* amax, void* stream);

// out: e4m3 [n] = quantized x (bf16 [n]) with scale = max(*amax / 448, tiny), which is also
// written to *scale (read by the GEMM).
void LaunchQuantizeFp8(const void* x, int64_t n, const float* amax, float* scale, void* out,
                       void* stream);

}  // namespace llm::cuda
