// MLA decode kernels for the fp8 e4m3 latent cache on e4m3 tensor cores (Fp8MmaCache; one
// instantiation group: 16/32/64-row CTAs). The MMA exists from sm_89 on: an older binary of this
// kernel traps, so AttendFp8MmaAvailable asks which binary the device actually runs.
#include "kernels/cuda/mla_decode_kernel.cuh"

namespace llm::cuda::mla {

void LaunchAttendFp8Mma(const AttendArgs& a, int rows, void* stream) {
  LaunchForCache<Fp8MmaCache>(a, rows, stream);
}

int AttendCtasPerSmFp8Mma(int rows) {
  return CtasPerSm<Fp8MmaCache>(rows);
}

bool AttendFp8MmaAvailable() {
  thread_local int cached_dev = -1;
  thread_local bool cached = false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (dev != cached_dev) {
    cudaFuncAttributes attr{};
    cached = cudaFuncGetAttributes(&attr, MlaDecodeKernel<Fp8MmaCache, 16>) == cudaSuccess &&
             attr.binaryVersion >= 89;
    cudaGetLastError();  // no device / no compatible binary: not available, not sticky
    cached_dev = dev;
  }
  return cached;
}

}  // namespace llm::cuda::mla
