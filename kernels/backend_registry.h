// Registry of attention backends. The capabilities of every kernel family live in one table,
// KernelCatalog() (kernels/kernel_catalog.cc), present in every build, so the selection rules are
// the same (and tested as a table) whether or not a family is compiled in; each implementation
// attaches its factory by name. Selection runs once at model load, logs a table of every
// candidate and why it was or was not chosen, and fails before anything is allocated when nothing
// fits, naming what is missing (including "not built into this binary").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention_backend.h"

namespace llm {

struct BackendInfo {
  std::string name;
  DeviceKind device = DeviceKind::kCpu;
  int min_arch = 0, max_arch = 1 << 30;  // device arch range (e.g. 80..120)
  AttentionKind kind = AttentionKind::kMha;
  std::vector<DType> kv_dtypes;
  std::vector<KvQuant> kv_quants = {KvQuant::kNone};  // 8-bit cache scalings implemented
  std::vector<int> head_dims;                         // empty: any
  int min_block_size = 1;                             // block sizes must be multiples of this
  uint32_t features = 0;                              // features implemented
  int priority = 0;                                   // higher wins when several fit
  // > 0: may attend a model's steps with a prefill chunk beside another decode backend with the
  // same block layout (AttentionOptions::prefill_backend "auto"); higher wins.
  int prefill_priority = 0;
  int mla_rope_dim = 0;  // kMla: required rope width (0: any)
  // The family's own kernel options (kKernelOptions: "c8_prefill", "mla_kernel") that its
  // Configure applies. A value other than "auto" is refused unless the backend attending the steps
  // the option steers lists it.
  std::vector<std::string> kernel_options;
  // GPU code objects in this binary: "90a" runs on exactly sm_90, "80" on sm_80 and newer (PTX),
  // "gfx90a" on exactly gfx90a. Empty: no restriction beyond [min_arch, max_arch].
  std::vector<std::string> archs;
  std::string build_hint;  // how to build a binary that has it, for "not built" reasons
  // Null when the family is described by the catalog but not compiled into this binary.
  std::function<std::unique_ptr<AttentionBackend>(const AttentionSpec&)> create;
};

// Device arch numbers: CUDA sm_XY is 10 * X + Y (90 for sm_90); AMD gfx9ab is 0x9ab (0x90a).
std::string ArchName(DeviceKind device, int arch);
// Whether a code object built for `built` (e.g. "90a", "80", "gfx90a") runs on `arch`.
bool ArchRuns(DeviceKind device, const std::string& built, int arch);
// Parses a ';'-separated arch list (CMAKE_CUDA_ARCHITECTURES style).
std::vector<std::string> SplitArchList(const std::string& list);

// What a model attends through: the registry's whole choice for one AttentionSpec and the options.
struct AttentionBackends {
  std::unique_ptr<AttentionBackend> decode;   // decode steps, and prefill steps without `prefill`
  std::unique_ptr<AttentionBackend> prefill;  // steps with a prefill chunk, or null
  // The backend for a step with (true) or without a prefill chunk.
  AttentionBackend& For(bool has_prefill) const {
    return has_prefill && prefill ? *prefill : *decode;
  }
};

// A family's own kernel option in AttentionOptions, and the steps it steers: those with a prefill
// chunk (AttentionBackends::For(true)) or those without.
struct KernelOption {
  const char* name;
  std::string AttentionOptions::*value;
  bool prefill_steps;
};
inline constexpr KernelOption kKernelOptions[] = {
    {"c8_prefill", &AttentionOptions::c8_prefill, true},
    {"mla_kernel", &AttentionOptions::mla_kernel, false}};

// Every kernel family's capabilities and preference (priority), factories unset.
std::vector<BackendInfo> KernelCatalog();

struct SelectionRow {
  std::string name;
  int priority = 0;
  bool fits = false;
  std::string reason;  // why it does not fit, or "selected" / "fits (lower priority)"
};

struct Selection {
  const BackendInfo* info = nullptr;  // null when nothing fits
  std::vector<SelectionRow> rows;
  std::string Table(const AttentionSpec& spec) const;
};

class BackendRegistry {
 public:
  // The catalog plus every factory this binary's implementations attached.
  static BackendRegistry& Global();
  BackendRegistry() = default;
  explicit BackendRegistry(std::vector<BackendInfo> catalog) : backends_(std::move(catalog)) {}
  // A name already described (the catalog) only gets the factory: the catalog's capabilities are
  // the rules. A new name is added as given (tests, out-of-tree backends).
  void Register(BackendInfo info);
  const std::vector<BackendInfo>& backends() const { return backends_; }

  // Empty `force_name` picks by priority; otherwise only that backend may be chosen.
  Selection Select(const AttentionSpec& spec, const std::string& force_name = "") const;
  // Select + create; the error lists what each candidate is missing.
  StatusOr<std::unique_ptr<AttentionBackend>> Create(const AttentionSpec& spec,
                                                     const std::string& force_name,
                                                     std::string* table_out) const;
  // The decode backend (options.backend forces one), the prefill backend that options and the
  // catalog's prefill_priority give (with the decode backend's block layout, or none), each
  // configured with the options (AttentionBackend::Configure). A kernel option (kKernelOptions)
  // other than "auto" that the backend attending its steps does not list fails, naming the
  // option. Errors name what does not fit.
  // `log` (if set) gets the selection tables and the decisions, failed loads included.
  StatusOr<AttentionBackends> CreateBackends(const AttentionSpec& spec,
                                             const AttentionOptions& options,
                                             std::vector<std::string>* log) const;

 private:
  const BackendInfo* Find(const std::string& name) const;
  // Fails on a kernel option other than "auto" that the backend attending its steps cannot apply.
  Status CheckKernelOptions(const AttentionBackends& chosen, const AttentionOptions& options) const;

  std::vector<BackendInfo> backends_;
};

// The factory of a backend class built from the spec alone.
template <typename Backend>
std::function<std::unique_ptr<AttentionBackend>(const AttentionSpec&)> BackendFactoryOf() {
  return [](const AttentionSpec& spec) -> std::unique_ptr<AttentionBackend> {
    return std::make_unique<Backend>(spec);
  };
}

// Static registration in the backend's file:
// `const BackendRegistrar reg("cuda_c8", BackendFactoryOf<CudaC8Backend>());` for a catalog
// family (the catalog's row holds its capabilities), or with a whole BackendInfo for one the
// catalog does not describe (tests, out-of-tree backends).
struct BackendRegistrar {
  explicit BackendRegistrar(BackendInfo info) {
    BackendRegistry::Global().Register(std::move(info));
  }
  BackendRegistrar(std::string name,
                   std::function<std::unique_ptr<AttentionBackend>(const AttentionSpec&)> create);
};

}  // namespace llm
