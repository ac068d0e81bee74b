// Instantiation group: C8 tile kernels for the int8 cache, head dims 64 and 128.
#include "kernels/cuda/c8/c8_tile_kernel.cuh"

namespace llm::cuda::detail {

void LaunchTilesInt8(const TileArgs& a, int head_dim, bool prefill, void* stream) {
  LaunchTilesForCache<Int8Cache>(a, head_dim, prefill, stream);
}

int DecodeCtasPerSmInt8(int head_dim, int stages) {
  return DecodeCtasPerSm<Int8Cache>(head_dim, stages);
}

}  // namespace llm::cuda::detail
