// Device-side argument structs shared by the MLA decode kernels and their launchers (internal).
// Plain C++: the launchers take these and an opaque stream.
#pragma once

#include <cstdint>

#include "kernels/cuda/mla/mla_decode.h"

namespace llm::cuda::mla {

struct AttendArgs {
  const void* q_latent;  // bf16 [T, H, 512]
  const void* q_pe;      // bf16 [T, H, 64]
  void* out;             // bf16 [T, H, 512]
  const void* cache;     // [num_blocks, block_size, 576] of the cache type
  const int32_t* q_indptr;
  const int32_t* kv_lens;
  const int32_t* page_indptr;
  const int32_t* pages;
  const MlaWorkItem* items;
  float* partial_o;    // [num_partials, kMlaMaxRows, 512]
  float* partial_lse;  // [num_partials, kMlaMaxRows], log2 domain
  int num_items;
  int num_heads;
  int block_size;
  float scale_log2;  // softmax_scale * log2(e), times the cache scale for fp8 (K dequant)
  float out_scale;   // 1, or the cache scale for fp8 (V dequant)
  // Graph form (MlaDecode::UploadGraph): the grid covers a bucket's capacity and the step's item
  // count is read here; CTAs past it exit at once. Null: the grid is the exact count.
  const int32_t* device_num_items;
};

struct MergeArgs {
  void* out;  // bf16 [T, H, 512]
  const MlaMergeItem* items;
  const float* partial_o;
  const float* partial_lse;
  int num_items;  // grid width; with device_num_items a grid-stride bound (see AttendArgs)
  int num_heads;
  const int32_t* device_num_items = nullptr;
};

struct AppendArgs {
  const void* latent_new;  // bf16 [T, 576]
  void* cache;
  const int32_t* slots;  // [T]: block * block_size + offset
  int num_tokens;
  float cache_scale;
};

// One translation unit per cache type; `rows` is a kMlaVariantRows entry.
void LaunchAttendBf16(const AttendArgs& a, int rows, void* stream);
// fp8 cache: e4m3 = true runs the e4m3-MMA kernel (mla_decode_fp8_mma.cu; needs
// AttendFp8MmaAvailable()), else the f16-MMA one.
void LaunchAttendFp8(const AttendArgs& a, int rows, bool e4m3, void* stream);
int AttendCtasPerSmBf16(int rows);
int AttendCtasPerSmFp8(int rows, bool e4m3);
void LaunchAttendFp8Mma(const AttendArgs& a, int rows, void* stream);
int AttendCtasPerSmFp8Mma(int rows);
bool AttendFp8MmaAvailable();
// The sm_90a warpgroup-MMA kernel for 64-row items over a bf16 cache (mla_decode_wgmma.cu; linked
// only when the build includes sm_90a: LLM_MLA_WGMMA). False: the driver could not describe the
// cache to the tensor-copy unit (nothing was launched).
bool LaunchAttendBf16Wgmma(const AttendArgs& a, void* stream);
int AttendCtasPerSmBf16Wgmma();
// The same items on the seesaw schedule (mla_decode_seesaw.cu; LLM_MLA_WGMMA): no producer
// warpgroup, slot halves refilled by the warpgroup that read them last. Needs block_size % 64 ==
// 0 and items starting on multiples of 64 (every TMA tile inside one page).
bool LaunchAttendBf16Seesaw(const AttendArgs& a, void* stream);
int AttendCtasPerSmBf16Seesaw();
// The sm_90a kernel for 16- and 32-row items over an fp8 cache (mla_decode_fp8_wgmma.cu;
// LLM_MLA_WGMMA); rows is 16 or 32.
bool LaunchAttendFp8Wgmma(const AttendArgs& a, int rows, void* stream);
int AttendCtasPerSmFp8Wgmma(int rows);
// Grid (a.num_items, rows): rows covers the largest merge item (kMlaMaxRows in eager steps).
void LaunchMerge(const MergeArgs& a, int rows, void* stream);
void LaunchAppend(const AppendArgs& a, MlaCacheType cache, void* stream);

}  // namespace llm::cuda::mla
