#include "kernels/cuda/common/device_info.h"

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

int CurrentCudaDevice() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return dev;
}

namespace {
bool IsSm90(int dev) {
  int major = 0, minor = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
         major == 9 && minor == 0;
}

bool HasPdl(int dev) {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         major >= 9;
}

int MaxSmemPerBlock(int dev) {
  int bytes = 0;
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return bytes;
}
}  // namespace

bool CurrentDeviceIsSm90() {
  return CachedForCurrentDevice<IsSm90>();
}

bool CurrentDeviceHasPdl() {
  return CachedForCurrentDevice<HasPdl>();
}

int CurrentDeviceMaxSmemPerBlock() {
  return CachedForCurrentDevice<MaxSmemPerBlock>();
}

}  // namespace llm::cuda
