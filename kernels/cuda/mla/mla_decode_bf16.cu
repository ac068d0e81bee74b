// MLA decode kernels for the bf16 latent cache (one instantiation group: 16/32/64-row CTAs).
#include "kernels/cuda/mla/mla_decode_kernel.cuh"

namespace llm::cuda::mla {

void LaunchAttendBf16(const AttendArgs& a, int rows, void* stream) {
  LaunchForCache<Bf16Cache>(a, rows, stream);
}

int AttendCtasPerSmBf16(int rows) {
  return CtasPerSm<Bf16Cache>(rows);
}

}  // namespace llm::cuda::mla
