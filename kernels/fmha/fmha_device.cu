// Device queries for the FMHA launcher (the only runtime calls the plain C++ launcher needs).
#include "kernels/fmha/fmha_dispatch.h"
#include "kernels/gpu_port.h"

namespace llm::fmha {

const char* QueryDevice(int* num_sms, int* smem_optin_bytes) {
  int dev = 0;
  LLM_GPU_TRY(gpu::CurrentDevice(&dev));
  LLM_GPU_TRY(gpu::SmCount(dev, num_sms));
  LLM_GPU_TRY(gpu::SmemOptinBytes(dev, smem_optin_bytes));
  return nullptr;
}

}  // namespace llm::fmha
