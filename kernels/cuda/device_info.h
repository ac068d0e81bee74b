// Queries of the current CUDA device shared by the kernel families (plain C++: no CUDA types).
#pragma once

namespace llm::cuda {

// Number of CUDA devices (0 when there is none or no driver).
int CudaDeviceCount();
// Multiprocessor count of the current device (0 when there is none).
int CudaNumSms();
// Whether the current device has compute capability 9.0 (H100/H200), the only target of the
// sm_90a kernels. Asked on every launch, so the answer is cached per device and thread.
bool CurrentDeviceIsSm90();

}  // namespace llm::cuda
