// Instantiation group: bf16 FMHA forward on Hopper warpgroup MMA, head dims 64 and 128 (CUDA,
// compiled for sm_90a only: see kernels/fmha/CMakeLists.txt).
#include "kernels/fmha/fmha_wgmma_kernel.cuh"

namespace llm::fmha {

const char* LaunchWgmmaBf16(const Run& run, void* stream) {
  return LaunchWgmmaElem<gpu::Bf16>(run, stream);
}

const char* ResidentCtasWgmmaBf16(const Run& run, int* ctas_per_sm) {
  return ResidentCtasWgmmaElem<gpu::Bf16>(run, ctas_per_sm);
}

}  // namespace llm::fmha
