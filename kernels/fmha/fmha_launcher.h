// Paged-KV flash attention forward on the GPU (CUDA or HIP, whichever this build targets).
// Plain C++: no CUDA/HIP types, so engine code and tests include it freely.
//
// All pointers in FmhaParams are device pointers (see fmha_params.h for shapes and semantics);
// q, k, v and out must be 16-byte aligned. Supported: bf16 and fp16, head_dim 64, 128 and 256, any
// num_q_heads multiple of num_kv_heads, batch and group (varlen) mode, paged KV with any
// block_size multiple of 16 or contiguous KV (with optional cache_batch_idx), every FmhaMask,
// sink tokens, learned sink logits, ALiBi, soft-cap, optional LSE, and an e4m3 output with a
// static scale (FmhaParams::out_fp8) instead of the bf16/fp16 one.
//
// The launch picks a warp layout from the packed rows per sequence (query tokens x GQA group):
// up to 16 -> decode tiles (16 rows, the KV tile split over 4 warps), else prefill tiles
// (128 rows): on a compute capability 9.0 device in a build with sm_90a, the Hopper kernel on
// warpgroup MMA (fmha_wgmma_kernel.cuh), elsewhere the portable one. Split-KV (flash-decoding)
// needs a caller-provided workspace: the engine sizes it once with FmhaWorkspaceBytes for its
// largest step and passes it every step.
#pragma once

#include <cstddef>

#include "base/status.h"
#include "kernels/fmha/fmha_params.h"

namespace llm {

// Which kernel serves prefill-shaped launches (more than 16 packed rows per sequence; decode
// shapes always take the portable decode tiles).
enum class FmhaKernel {
  kAuto,      // wgmma where FmhaWgmmaAvailable(), else portable
  kPortable,  // the one-source CUDA/HIP kernel
  kWgmma,     // the Hopper kernel; InvalidArgument where it is not available
};

struct FmhaLaunchOptions {
  // 1: no split. 0: choose from the device's SM count when the grid would not fill it (uses the
  // workspace; falls back to 1 without one). > 1: exactly this many KV splits.
  int num_splits = 1;
  void* workspace = nullptr;  // device memory, 16-byte aligned, >= FmhaWorkspaceBytes(p, splits)
  size_t workspace_bytes = 0;
  FmhaKernel kernel = FmhaKernel::kAuto;
};

// Whether this build carries the sm_90a wgmma kernel and the current device is compute
// capability 9.0 (Hopper).
bool FmhaWgmmaAvailable();

// InvalidArgument naming the first unsupported or inconsistent field; OK otherwise. Reads only
// host-side fields (never dereferences the device pointers).
Status FmhaCheckParams(const FmhaParams& p);

// Workspace bytes for `num_splits` KV splits (0: as many as the automatic choice picks for this
// shape on the current device; 1: none). It grows with batch * num_kv_heads * row tiles * splits.
size_t FmhaWorkspaceBytes(const FmhaParams& p, int num_splits);

// The split count the automatic choice (num_splits = 0) picks for this shape on the current
// device (1 when the grid already fills the GPU).
int FmhaAutoSplits(const FmhaParams& p);

// Enqueues the attention on `stream` (a cudaStream_t / hipStream_t, or null for the default).
Status FmhaForward(const FmhaParams& p, void* stream);
Status FmhaForward(const FmhaParams& p, const FmhaLaunchOptions& options, void* stream);

}  // namespace llm
