// Kernel launches with programmatic dependent launch allowed where the device has it (compute
// capability 9.0 on; a plain launch before) (internal; CUDA translation units).
// Such a kernel's CTAs may be scheduled while the kernel before it in the stream is still
// finishing; each one calls ptx::GridDependencyWait before it reads anything that kernel may
// write (and before writing anything it may read), so only the launch latency and the prologue
// that reads uploaded work lists overlap. Inside a CUDA graph the dependency becomes a
// programmatic edge.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/common/device_info.h"

namespace llm::cuda {

template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = CurrentDeviceHasPdl() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace llm::cuda
