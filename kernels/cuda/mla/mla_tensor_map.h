// The latent cache as a 2-D tensor [rows][576] for the tensor-copy unit (TMA), shared by the
// sm_90a MLA kernels (internal; CUDA driver types).
#pragma once

#include <cuda.h>

namespace llm::cuda::mla {

// bf16: 64 x 64-element boxes with the 128-byte swizzle (the wgmma operand layout). fp8: 64-byte x
// 64-row boxes with the 64-byte swizzle (16-byte chunk c of row r lands at chunk c ^ (r / 2 % 4):
// conflict-free ldmatrix). The row count is nominal: coordinates come from the block table and
// never leave the cache. False: the driver has no encoder (nothing to launch with).
bool EncodeMlaCacheMap(const void* cache, bool fp8, CUtensorMap* map);

}  // namespace llm::cuda::mla
