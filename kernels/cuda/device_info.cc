#include "kernels/cuda/device_info.h"

#include <cuda_runtime.h>

namespace llm::cuda {

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int CudaNumSms() {
  if (CudaDeviceCount() == 0) return 0;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

bool CurrentDeviceIsSm90() {
  thread_local int cached_dev = -1;
  thread_local bool cached = false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (dev != cached_dev) {
    int major = 0, minor = 0;
    cached =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
        major == 9 && minor == 0;
    cached_dev = dev;
  }
  return cached;
}

}  // namespace llm::cuda
