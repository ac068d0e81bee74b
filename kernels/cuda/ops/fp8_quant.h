// fp8 (e4m3) quantization of bf16 tensors on CUDA: per tensor for fp8 weights, per row for the
// activations an fp8 GEMM reads. Plain C++ launcher header: device pointers, `stream` is a
// cudaStream_t.
//
// Definition (base/quant.h): scale = max(amax / 448, tiny), q = e4m3(x / scale) with
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

// An fp8 activation with one dynamic scale per row, the input of an fp8 GEMM:
// q[t, :] = e4m3(x[t, :] / scale[t]), scale[t] = max(max_i |x[t, i]| / 448, tiny) (quant.h
// definition per row). The GEMM leaves the row scale out (it has no per-row operand scale on
// sm_90); whatever consumes its output multiplies row t by scale[t].
struct Fp8Rows {
  void* q = nullptr;       // e4m3 [T, cols], 8-byte aligned rows
  float* scale = nullptr;  // [T]
  bool enabled() const { return q != nullptr; }
};

// out: x (bf16 [rows, cols]) quantized per row (one CTA per row).
void LaunchQuantizeRowsFp8(const void* x, int rows, int cols, const Fp8Rows& out, void* stream);

// Static activation scale (a checkpoint's input_scale): q[t, :] = e4m3(x[t, :] / *scale),
// saturating, and out.scale[t] = *scale for every row, so the row-scale consumers need no other
// path.
void LaunchQuantizeRowsStaticFp8(const void* x, int rows, int cols, const float* scale,
                                 const Fp8Rows& out, void* stream);

// 1x128 blocks (the activation side of DeepSeek-V3's block-scaled fp8 GEMM): for row t and block
// b (columns [128 b, 128 b + 128), the last one partial), s = Fp8Scale(block absmax),
// q[t, c] = e4m3(x[t, c] / s) and scales[b * scale_ld + t] = s (rows fastest: what cuBLASLt's
// VEC128_32F reads). scale_ld >= rows.
void LaunchQuantizeBlocks128Fp8(const void* x, int rows, int cols, void* q, float* scales,
                                int scale_ld, void* stream);

// y[t, :] = bf16(y[t, :] * scale[t]) in place (bf16 [rows, cols]): applies the row scales of an
// fp8 GEMM's input to its raw output where the consumer cannot take them (CudaLinear::Apply).
void LaunchScaleRowsBf16(void* y, const float* scale, int rows, int cols, void* stream);

}  // namespace llm::cuda
