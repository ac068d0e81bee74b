// MLA decode kernels for the fp8 e4m3 latent cache on e4m3 tensor cores (Fp8MmaCache; one
// instantiation group: 16/32/64-row CTAs). The MMA exists from sm_89 on: an older binary of this
// kernel traps, so AttendFp8MmaAvailable asks which binary the device actually runs.
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/mla/mla_decode_kernel.cuh"

namespace llm::cuda::mla {

void LaunchAttendFp8Mma(const AttendArgs& a, int rows, void* stream) {
  LaunchForCache<Fp8MmaCache>(a, rows, stream);
}

int AttendCtasPerSmFp8Mma(int rows) {
  return CtasPerSm<Fp8MmaCache>(rows);
}

namespace {
// The binary the current device runs (`dev` is current: the caller's).
bool RunsFp8MmaBinary(int /*dev*/) {
  cudaFuncAttributes attr{};
  const bool ok = cudaFuncGetAttributes(&attr, MlaDecodeKernel<Fp8MmaCache, 16>) == cudaSuccess &&
                  attr.binaryVersion >= 89;
  cudaGetLastError();  // no compatible binary: not available, not sticky
  return ok;
}
}  // namespace

bool AttendFp8MmaAvailable() {
  return CachedForCurrentDevice<RunsFp8MmaBinary>();
}

}  // namespace llm::cuda::mla
