// Instantiation group: fp16 FMHA forward kernels, head dims 64, 128 and 256 (CUDA and HIP).
#include "kernels/fmha/fmha_kernel.cuh"

namespace llm::fmha {

const char* LaunchFp16(const Run& run, void* stream) {
  return LaunchElem<gpu::F16>(run, stream);
}

const char* ResidentCtasFp16(const Run& run, int* ctas_per_sm) {
  return ResidentCtasElem<gpu::F16>(run, ctas_per_sm);
}

}  // namespace llm::fmha
