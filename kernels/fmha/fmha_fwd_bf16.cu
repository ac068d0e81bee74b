// Instantiation group: bf16 FMHA forward kernels, head dims 64, 128 and 256 (CUDA and HIP).
#include "kernels/fmha/fmha_kernel.cuh"

namespace llm::fmha {

const char* LaunchBf16(const Run& run, void* stream) {
  return LaunchElem<gpu::Bf16>(run, stream);
}

const char* ResidentCtasBf16(const Run& run, int* ctas_per_sm) {
  return ResidentCtasElem<gpu::Bf16>(run, ctas_per_sm);
}

}  // namespace llm::fmha
