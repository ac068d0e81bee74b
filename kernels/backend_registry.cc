#include "kernels/backend_registry.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "base/check.h"

namespace llm {

const char* DeviceKindName(DeviceKind d) {
  switch (d) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kHip:
      return "hip";
  }
  return "?";
}

const char* AttentionKindName(AttentionKind k) {
  return k == AttentionKind::kMha ? "mha/gqa" : "mla";
}

const char* KvQuantName(KvQuant q) {
  switch (q) {
    case KvQuant::kNone:
      return "none";
    case KvQuant::kStaticPerHead:
      return "static_per_head";
    case KvQuant::kStaticPerChannel:
      return "static_per_channel";
    case KvQuant::kDynamicPerToken:
      return "dynamic_per_token";
  }
  return "?";
}

std::string FeatureNames(uint32_t f) {
  static const std::pair<uint32_t, const char*> kNames[] = {
      {kFeatureCausal, "causal"},
      {kFeatureSlidingWindow, "sliding_window"},
      {kFeatureAlibi, "alibi"},
      {kFeatureSoftCap, "softcap"},
      {kFeatureSinks, "sinks"}};
  std::string s;
  for (const auto& [bit, name] : kNames) {
    if (!(f & bit)) continue;
    if (!s.empty()) s += '+';
    s += name;
  }
  return s.empty() ? "none" : s;
}

std::string ArchName(DeviceKind device, int arch) {
  char buf[32];
  if (device == DeviceKind::kHip) {
    std::snprintf(buf, sizeof(buf), "gfx%x", arch);
  } else if (device == DeviceKind::kCuda) {
    std::snprintf(buf, sizeof(buf), "sm_%d", arch);
  } else {
    return "cpu";
  }
  return buf;
}

bool ArchRuns(DeviceKind device, const std::string& built, int arch) {
  if (device == DeviceKind::kHip) return built == ArchName(device, arch);
  if (built.empty()) return false;
  const bool specific = built.back() == 'a' || built.back() == 'f';  // sm_90a: no forward PTX
  int n = 0;
  for (char ch : built) {
    if (ch < '0' || ch > '9') break;
    n = n * 10 + (ch - '0');
  }
  // Plain archs embed PTX that the driver compiles for newer GPUs (CMake's default code=[sm,
  // compute]); arch-specific ones ("90a") run only on that exact GPU.
  return specific ? n == arch : arch >= n;
}

std::vector<std::string> SplitArchList(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : list + ";") {
    if (ch == ';' || ch == ',' || ch == ' ') {
      // CMake allows "90-real" / "90-virtual"; the number and suffix letter are what matter.
      const size_t dash = cur.find('-');
      if (dash != std::string::npos) cur.resize(dash);
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  return out;
}

BackendRegistry& BackendRegistry::Global() {
  // Never destroyed: static registrars in other translation units use it.
  static BackendRegistry* r = new BackendRegistry(KernelCatalog());
  return *r;
}

void BackendRegistry::Register(BackendInfo info) {
  for (BackendInfo& b : backends_) {
    if (b.name == info.name) {
      LLM_CHECK(!b.create) << "attention backend '" << info.name << "' registered twice";
      b.create = std::move(info.create);
      return;
    }
  }
  backends_.push_back(std::move(info));
}

BackendRegistrar::BackendRegistrar(
    std::string name,
    std::function<std::unique_ptr<AttentionBackend>(const AttentionSpec&)> create) {
  auto& reg = BackendRegistry::Global();
  bool known = false;
  for (const BackendInfo& b : reg.backends()) known |= b.name == name;
  LLM_CHECK(known) << "attention backend '" << name << "' is not in KernelCatalog()";
  BackendInfo info;
  info.name = std::move(name);
  info.create = std::move(create);
  reg.Register(std::move(info));
}

namespace {

// Empty string when `b` can serve `spec`, else what is missing.
std::string Mismatch(const BackendInfo& b, const AttentionSpec& s) {
  if (b.device != s.device) return std::string("device is ") + DeviceKindName(b.device);
  if (s.device_arch < b.min_arch || s.device_arch > b.max_arch) {
    return "arch " + ArchName(s.device, s.device_arch) + " outside [" +
           ArchName(b.device, b.min_arch) + ", " +
           (b.max_arch == (1 << 30) ? std::string("newest") : ArchName(b.device, b.max_arch)) + "]";
  }
  if (b.kind != s.kind) return std::string("kind is ") + AttentionKindName(b.kind);
  if (b.kind == AttentionKind::kMla && b.mla_rope_dim != 0 && b.mla_rope_dim != s.mla_rope_dim) {
    return "no mla rope dim " + std::to_string(s.mla_rope_dim);
  }
  if (std::find(b.kv_dtypes.begin(), b.kv_dtypes.end(), s.kv_dtype) == b.kv_dtypes.end()) {
    return std::string("no kv dtype ") + DTypeName(s.kv_dtype);
  }
  if (std::find(b.kv_quants.begin(), b.kv_quants.end(), s.kv_quant) == b.kv_quants.end()) {
    return std::string("no kv quant ") + KvQuantName(s.kv_quant);
  }
  if (!b.head_dims.empty() &&
      std::find(b.head_dims.begin(), b.head_dims.end(), s.head_dim) == b.head_dims.end()) {
    return "no head_dim " + std::to_string(s.head_dim);
  }
  if (s.block_size % b.min_block_size != 0) {
    return "block_size " + std::to_string(s.block_size) + " not a multiple of " +
           std::to_string(b.min_block_size);
  }
  const uint32_t missing = s.features & ~b.features;
  if (missing) return "missing features " + FeatureNames(missing);
  if (!b.archs.empty()) {
    bool runs = false;
    std::string built;
    for (const std::string& a : b.archs) {
      runs |= ArchRuns(s.device, a, s.device_arch);
      if (!built.empty()) built += ',';
      built += a;
    }
    if (!runs)
      return "not compiled for " + ArchName(s.device, s.device_arch) + " (built: " + built + ")";
  }
  if (!b.create) return "not built into this binary (" + b.build_hint + ")";
  return "";
}

}  // namespace

Selection BackendRegistry::Select(const AttentionSpec& spec, const std::string& force) const {
  Selection sel;
  for (const BackendInfo& b : backends_) {
    SelectionRow row{b.name, b.priority, false, Mismatch(b, spec)};
    if (!force.empty() && b.name != force && row.reason.empty())
      row.reason = "not the forced backend";
    row.fits = row.reason.empty();
    if (row.fits && (sel.info == nullptr || b.priority > sel.info->priority)) sel.info = &b;
    sel.rows.push_back(row);
  }
  int fitting = 0;
  for (const SelectionRow& row : sel.rows) fitting += row.fits;
  for (SelectionRow& row : sel.rows) {
    if (!row.fits) continue;
    if (sel.info && row.name == sel.info->name) {
      row.reason = !force.empty() ? "SELECTED (forced by attention_backend)"
                   : fitting == 1
                       ? "SELECTED (the only one that fits)"
                       : "SELECTED (highest priority of " + std::to_string(fitting) + " that fit)";
    } else {
      row.reason = "fits, lower priority";
    }
  }
  return sel;
}

std::string Selection::Table(const AttentionSpec& s) const {
  std::ostringstream os;
  os << "attention backend selection for device=" << DeviceKindName(s.device)
     << " arch=" << ArchName(s.device, s.device_arch) << " kind=" << AttentionKindName(s.kind)
     << " kv_dtype=" << DTypeName(s.kv_dtype) << " kv_quant=" << KvQuantName(s.kv_quant)
     << " heads=" << s.num_q_heads << "/" << s.num_kv_heads << " head_dim=" << s.head_dim
     << " block=" << s.block_size << " features=" << FeatureNames(s.features) << "\n";
  os << "  | backend                  | prio | decision\n";
  for (const SelectionRow& r : rows) {
    std::string name = r.name;
    name.resize(24, ' ');
    std::string prio = std::to_string(r.priority);
    prio.resize(4, ' ');
    os << "  | " << name << " | " << prio << " | " << r.reason << "\n";
  }
  return os.str();
}

StatusOr<std::unique_ptr<AttentionBackend>> BackendRegistry::Create(const AttentionSpec& spec,
                                                                    const std::string& force,
                                                                    std::string* table_out) const {
  Selection sel = Select(spec, force);
  if (table_out) *table_out = sel.Table(spec);
  if (sel.info == nullptr) {
    std::string why;
    for (const auto& r : sel.rows) why += " " + r.name + ": " + r.reason + ";";
    if (!force.empty()) why += " (forced backend '" + force + "')";
    return FailedPrecondition("no attention backend supports this model:" + why);
  }
  return sel.info->create(spec);
}

const BackendInfo* BackendRegistry::Find(const std::string& name) const {
  for (const BackendInfo& b : backends_) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

Status BackendRegistry::CheckKernelOptions(const AttentionBackends& chosen,
                                           const AttentionOptions& options) const {
  for (const KernelOption& option : kKernelOptions) {
    const std::string& value = options.*option.value;
    if (value == "auto") continue;
    const AttentionBackend& b = chosen.For(option.prefill_steps);
    const BackendInfo* info = Find(b.name());
    if (info != nullptr && std::find(info->kernel_options.begin(), info->kernel_options.end(),
                                     option.name) != info->kernel_options.end()) {
      continue;
    }
    std::string owners;
    for (const BackendInfo& other : backends_) {
      if (std::find(other.kernel_options.begin(), other.kernel_options.end(), option.name) !=
          other.kernel_options.end()) {
        owners += (owners.empty() ? "" : ", ") + other.name;
      }
    }
    return InvalidArgument(std::string(option.name) + " " + value + ": steps " +
                           (option.prefill_steps ? "with" : "without") +
                           " a prefill chunk attend through " + b.name() + ", which has no " +
                           option.name + " choice (it steers " +
                           (owners.empty() ? std::string("no family") : owners) + ")");
  }
  return Status::Ok();
}

StatusOr<AttentionBackends> BackendRegistry::CreateBackends(const AttentionSpec& spec,
                                                            const AttentionOptions& options,
                                                            std::vector<std::string>* log) const {
  std::vector<std::string> ignored;
  if (log == nullptr) log = &ignored;
  AttentionBackends out;
  std::string table;
  auto decode = Create(spec, options.backend, &table);
  log->push_back(table);
  if (!decode.ok()) return decode.status();
  out.decode = std::move(decode).value();

  std::string name = options.prefill_backend;
  const bool automatic = name == "auto";
  if (automatic) {  // the fitting family with the highest prefill_priority, if any
    name.clear();
    int best = 0;
    for (const BackendInfo& b : backends_) {
      if (b.prefill_priority > best && Select(spec, b.name).info != nullptr) {
        best = b.prefill_priority;
        name = b.name;
      }
    }
  }
  if (!name.empty() && name != "none" && name != out.decode->name()) {
    auto prefill = Create(spec, name, &table);
    if (!prefill.ok()) {
      if (!automatic) {
        log->push_back("prefill attention: " + table);
        return prefill.status();
      }
    } else if ((*prefill)->BlockBytes() != out.decode->BlockBytes()) {
      if (!automatic) {
        return FailedPrecondition("prefill attention backend " + name +
                                  " lays out KV blocks differently from " + out.decode->name());
      }
    } else {
      out.prefill = std::move(prefill).value();
    }
  }
  LLM_RETURN_IF_ERROR(CheckKernelOptions(out, options));
  for (AttentionBackend* b : {out.decode.get(), out.prefill.get()}) {
    if (b == nullptr) continue;
    LLM_RETURN_IF_ERROR(b->Configure(options));
    if (const std::string choice = b->kernel_choice(); !choice.empty()) {
      log->push_back(b->name() + ": " + choice);
    }
  }
  if (out.prefill) {
    log->push_back("steps with a prefill chunk attend through " + out.prefill->name() +
                   ", decode steps through " + out.decode->name());
  }
  return out;
}

}  // namespace llm
