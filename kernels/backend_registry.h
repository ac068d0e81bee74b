// Registry of attention backends. Each implementation registers what it supports; selection runs
// once at model load, logs a table of every candidate and why it was or was not chosen, and fails
// before anything is allocated when nothing fits.
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
  std::function<std::unique_ptr<AttentionBackend>(const AttentionSpec&)> create;
};

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
  static BackendRegistry& Global();
  void Register(BackendInfo info);
  const std::vector<BackendInfo>& backends() const { return backends_; }

  // Empty `force_name` picks by priority; otherwise only that backend may be chosen.
  Selection Select(const AttentionSpec& spec, const std::string& force_name = "") const;
  // Select + create; the error lists what each candidate is missing.
  StatusOr<std::unique_ptr<AttentionBackend>> Create(const AttentionSpec& spec,
                                                     const std::string& force_name,
                                                     std::string* table_out) const;

 private:
  std::vector<BackendInfo> backends_;
};

// Static registration: `static BackendRegistrar reg(BackendInfo{...});` in the backend's file.
struct BackendRegistrar {
  explicit BackendRegistrar(BackendInfo info) {
    BackendRegistry::Global().Register(std::move(info));
  }
};

}  // namespace llm
