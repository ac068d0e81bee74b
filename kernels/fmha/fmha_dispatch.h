// Internal: what the host launcher (fmha_launcher.cc, plain C++) hands to the device code
// (fmha_fwd_{bf16,fp16}.cu, compiled by nvcc or hipcc). No CUDA/HIP types here.
#pragma once

#include <cstddef>

#include "kernels/fmha/fmha_params.h"

namespace llm::fmha {

// Warp layouts:
//   kPrefill: 128-row tiles, 4 warps x 32 rows, all warps share each KV tile (fmha_kernel.cuh);
//             at head_dim 256, 64-row tiles of 4 warps x 16 rows (the 16 x 256 fp32 accumulator
//             is already 128 registers per lane).
//   kDecode:  16-row tiles, the warps split each KV tile and merge at the end.
//   kPrefillWgmma: 128-row tiles, 2 warpgroups x 64 rows on wgmma (fmha_wgmma_kernel.cuh; sm_90
//             devices, builds with sm_90a). Same partial layout as kPrefill.
enum class Layout { kPrefill, kDecode, kPrefillWgmma };

inline constexpr int kPrefillRows = 128;
inline constexpr int kPrefillRowsD256 = 64;
inline constexpr int kDecodeRows = 16;

inline int LayoutRows(Layout l, int head_dim) {
  if (l == Layout::kDecode) return kDecodeRows;
  return head_dim == 256 ? kPrefillRowsD256 : kPrefillRows;
}

// One launch, as planned on the host.
struct Run {
  FmhaParams p;
  Layout layout = Layout::kPrefill;
  int row_tiles =
      0;  // tiles of LayoutRows(layout, head_dim) packed rows (query token x GQA head) per sequence
  int num_splits = 1;            // > 1: split-KV into the workspace, then a merge kernel
  float* partial_o = nullptr;    // [batch, kv_heads, row_tiles, splits, rows, head_dim] fp32
  float* partial_lse = nullptr;  // [batch, kv_heads, row_tiles, splits, rows] fp32 (log2 units)
};

// Split-KV workspace for a plan, in bytes.
inline size_t WorkspaceBytes(const FmhaParams& p, Layout layout, int row_tiles, int num_splits) {
  if (num_splits <= 1) return 0;
  const size_t parts = static_cast<size_t>(p.batch) * p.num_kv_heads * row_tiles * num_splits *
                       LayoutRows(layout, p.head_dim);
  return parts * (p.head_dim + 1) * sizeof(float) + 256;  // + alignment slack for the lse part
}

// Each returns nullptr on success, else the runtime's error string.
const char* LaunchBf16(const Run& run, void* stream);
const char* LaunchFp16(const Run& run, void* stream);
// Resident CTAs per SM of the kernel `run` would launch (run.num_splits is ignored).
const char* ResidentCtasBf16(const Run& run, int* ctas_per_sm);
const char* ResidentCtasFp16(const Run& run, int* ctas_per_sm);
// The wgmma prefill kernel (kPrefillWgmma), defined only in builds that compile sm_90a
// (LLM_FMHA_WGMMA); the launcher calls them only on a compute capability 9.0 device.
const char* LaunchWgmmaBf16(const Run& run, void* stream);
const char* LaunchWgmmaFp16(const Run& run, void* stream);
const char* ResidentCtasWgmmaBf16(const Run& run, int* ctas_per_sm);
const char* ResidentCtasWgmmaFp16(const Run& run, int* ctas_per_sm);
// Device properties of the current device (cached per device by the caller if needed).
const char* QueryDevice(int* num_sms, int* smem_optin_bytes);

}  // namespace llm::fmha
