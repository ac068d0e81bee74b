// How the sm_90a MLA kernels are launched (internal, CUDA): a kernel (AttendArgs, the cache's
// tensor map) with one CTA per work item and more dynamic shared memory than the 48 KB default,
// under programmatic dependent launch.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/mla/mla_kernel_args.h"

namespace llm::cuda::mla {

using Sm90MlaKernel = void (*)(AttendArgs, CUtensorMap);

template <Sm90MlaKernel kKernel, int kThreads, int kSmemBytes>
struct Sm90MlaLaunch {
  // The shared-memory opt-in, once per process.
  static cudaError_t Prepare() {
    static const cudaError_t err =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    return err;
  }
  // A failed attribute call makes the launch fail too; the caller checks cudaGetLastError.
  static void Launch(const AttendArgs& a, const CUtensorMap& map, void* stream) {
    (void)Prepare();
    (void)LaunchPdl(kKernel, dim3(a.num_items), dim3(kThreads), kSmemBytes,
                    static_cast<cudaStream_t>(stream), a, map);
  }
  static int CtasPerSm() {
    if (Prepare() != cudaSuccess) return 1;
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, kSmemBytes);
    return n > 0 ? n : 1;
  }
};

}  // namespace llm::cuda::mla
