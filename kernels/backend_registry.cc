#include "kernels/backend_registry.h"

#include <algorithm>
#include <sstream>

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
    if (f & bit) s += (s.empty() ? "" : "+") + std::string(name);
  }
  return s.empty() ? "none" : s;
}

BackendRegistry& BackendRegistry::Global() {
  static BackendRegistry* r = new BackendRegistry();  // never destroyed: used by static registrars
  return *r;
}

void BackendRegistry::Register(BackendInfo info) {
  backends_.push_back(std::move(info));
}

namespace {

// Empty string when `b` can serve `spec`, else what is missing.
std::string Mismatch(const BackendInfo& b, const AttentionSpec& s) {
  if (b.device != s.device) return std::string("device is ") + DeviceKindName(b.device);
  if (s.device_arch < b.min_arch || s.device_arch > b.max_arch) {
    return "arch " + std::to_string(s.device_arch) + " outside [" + std::to_string(b.min_arch) +
           ", " + std::to_string(b.max_arch) + "]";
  }
  if (b.kind != s.kind) return std::string("kind is ") + AttentionKindName(b.kind);
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
  for (SelectionRow& row : sel.rows) {
    if (row.fits)
      row.reason = (sel.info && row.name == sel.info->name) ? "SELECTED" : "fits, lower priority";
  }
  return sel;
}

std::string Selection::Table(const AttentionSpec& s) const {
  std::ostringstream os;
  os << "attention backend selection for device=" << DeviceKindName(s.device)
     << " arch=" << s.device_arch << " kind=" << AttentionKindName(s.kind)
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

}  // namespace llm
