// Instantiation group: C8 tile kernels for the bf16 cache, head dims 64 and 128.
#include "kernels/cuda/c8/c8_tile_kernel.cuh"

namespace llm::cuda::detail {

void LaunchTilesBf16(const TileArgs& a, int head_dim, bool prefill, void* stream) {
  LaunchTilesForCache<Bf16Cache>(a, head_dim, prefill, stream);
}

int DecodeCtasPerSmBf16(int head_dim, int stages) {
  return DecodeCtasPerSm<Bf16Cache>(head_dim, stages);
}

}  // namespace llm::cuda::detail
