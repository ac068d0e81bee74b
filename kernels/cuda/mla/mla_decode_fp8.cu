// MLA decode kernels for the fp8 e4m3 latent cache (one instantiation group: 16/32/64-row CTAs).
// This file holds the f16-MMA kernel (every architecture); the e4m3-MMA one is in
// mla_decode_fp8_mma.cu.
#include "kernels/cuda/mla/mla_decode_kernel.cuh"

namespace llm::cuda::mla {

void LaunchAttendFp8(const AttendArgs& a, int rows, bool e4m3, void* stream) {
  if (e4m3) {
    LaunchAttendFp8Mma(a, rows, stream);
  } else {
    LaunchForCache<Fp8Cache>(a, rows, stream);
  }
}

int AttendCtasPerSmFp8(int rows, bool e4m3) {
  return e4m3 ? AttendCtasPerSmFp8Mma(rows) : CtasPerSm<Fp8Cache>(rows);
}

}  // namespace llm::cuda::mla
