// MLA decode kernels for the fp8 e4m3 latent cache (one instantiation group: 16/32/64-row CTAs).
#include "kernels/cuda/mla_decode_kernel.cuh"

namespace llm::cuda::mla {

void LaunchAttendFp8(const AttendArgs& a, int rows, void* stream) {
  LaunchForCache<Fp8Cache>(a, rows, stream);
}

int AttendCtasPerSmFp8(int rows) {
  return CtasPerSm<Fp8Cache>(rows);
}

}  // namespace llm::cuda::mla
