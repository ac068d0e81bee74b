// Energy a GPU has drawn, from NVML's total-energy counter (millijoules since the driver loaded),
// so benchmarks can report joules per step. A power-capped board runs the serving workload at its
// cap (docs/BENCHMARKS.md): there the energy a step takes sets its speed, which a short run at
// full clock does not show. NVML is opened at run time (dlopen), so nothing links
// against it (the CUDA toolkit here ships neither nvml.h nor the driver's library) and a machine
// without it just reports no energy. The counter advances in steps of tens of milliseconds on
// some boards, so a short span reads as zero or as an impossible power: measure spans of a second
// or more; shorter ones are reported as unknown (kMinSpanSeconds).
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

namespace bench {

class GpuEnergy {
 public:
  // Spans shorter than this give no energy figure: the counter's steps would dominate it.
  static constexpr double kMinSpanSeconds = 0.5;

  // The NVML device with the PCI bus id of CUDA device `cuda_device`.
  explicit GpuEnergy(int cuda_device) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    init_ = reinterpret_cast<Ret (*)()>(dlsym(lib_, "nvmlInit_v2"));
    shutdown_ = reinterpret_cast<Ret (*)()>(dlsym(lib_, "nvmlShutdown"));
    auto by_bus = reinterpret_cast<Ret (*)(const char*, Device*)>(
        dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    energy_ = reinterpret_cast<Ret (*)(Device, unsigned long long*)>(
        dlsym(lib_, "nvmlDeviceGetTotalEnergyConsumption"));
    if (init_ == nullptr || shutdown_ == nullptr || by_bus == nullptr || energy_ == nullptr ||
        init_() != 0) {
      return;
    }
    initialized_ = true;
    char bus[32] = {};
    unsigned long long mj = 0;
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_device) == cudaSuccess &&
        by_bus(bus, &device_) == 0 && energy_(device_, &mj) == 0) {
      ok_ = true;
    }
  }
  ~GpuEnergy() {
    if (initialized_) shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }
  GpuEnergy(const GpuEnergy&) = delete;
  GpuEnergy& operator=(const GpuEnergy&) = delete;

  bool ok() const { return ok_; }
  // Millijoules drawn since the driver loaded, or -1 where NVML cannot say.
  long long millijoules() const {
    unsigned long long mj = 0;
    return ok_ && energy_(device_, &mj) == 0 ? static_cast<long long>(mj) : -1;
  }

 private:
  using Ret = int;                // nvmlReturn_t; 0 is NVML_SUCCESS
  using Device = struct Opaque*;  // nvmlDevice_t
  void* lib_ = nullptr;
  Ret (*init_)() = nullptr;
  Ret (*shutdown_)() = nullptr;
  Ret (*energy_)(Device, unsigned long long*) = nullptr;
  Device device_ = nullptr;
  bool initialized_ = false;
  bool ok_ = false;
};

}  // namespace bench
