// Queries of the current CUDA device shared by the kernel families (plain C++: no CUDA types).
#pragma once

namespace llm::cuda {

// Number of CUDA devices (0 when there is none or no driver).
int CudaDeviceCount();
// Multiprocessor count of the current device (0 when there is none).
int CudaNumSms();
// The current CUDA device, or -1 where there is none (the runtime's error is cleared).
int CurrentCudaDevice();
// Query(device) evaluated once per device and thread: capability checks asked on every launch.
// A value-initialized result (false, 0) where there is no current device.
template <auto Query>
auto CachedForCurrentDevice() {
  using T = decltype(Query(0));
  thread_local int cached_dev = -1;
  thread_local T cached{};
  const int dev = CurrentCudaDevice();
  if (dev < 0) return T{};
  if (dev != cached_dev) {
    cached = Query(dev);
    cached_dev = dev;
  }
  return cached;
}
// Whether the current device has compute capability 9.0 (Hopper), the only target of the
// sm_90a kernels (cached per device and thread).
bool CurrentDeviceIsSm90();
// Whether the current device supports programmatic dependent launch (compute capability 9.0 and
// later; cached).
bool CurrentDeviceHasPdl();
// The most dynamic shared memory one block of the current device may opt into (227 KB on sm_90,
// 163 KB on sm_80, 99 KB on sm_89 and sm_120; 0 without a device; cached).
int CurrentDeviceMaxSmemPerBlock();

}  // namespace llm::cuda
