#include "server/server_option.h"

#include <cmath>
#include <stdexcept>

#include "server/server_config.h"

namespace llm {
namespace {

// Value errors say what is wrong with the value; the caller prefixes the flag or key.
Status ParseInt(const std::string& v, int lo, int hi, int* out) {
  long long x = 0;
  try {
    size_t pos = 0;
    x = std::stoll(v, &pos);
    if (pos != v.size()) throw std::invalid_argument(v);
  } catch (const std::exception&) {
    return InvalidArgument("must be an integer, got '" + v + "'");
  }
  if (x < lo || x > hi) {
    return InvalidArgument("must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + v);
  }
  *out = static_cast<int>(x);
  return Status::Ok();
}

std::string Join(std::span<const char* const> choices, const char* sep) {
  std::string s;
  for (const char* c : choices) s += (s.empty() ? "" : sep) + std::string(c);
  return s;
}

}  // namespace

const char* OptionGroupTitle(OptionGroup group) {
  switch (group) {
    case OptionGroup::kServer:
      return "Server";
    case OptionGroup::kModel:
      return "Model";
    case OptionGroup::kKvCache:
      return "KV cache";
    case OptionGroup::kScheduler:
      return "Scheduler";
    case OptionGroup::kLimits:
      return "Request limits";
    case OptionGroup::kCuda:
      return "CUDA";
    case OptionGroup::kKernel:
      return "Kernel experiments (docs/KERNEL_SELECTION.md)";
  }
  return "";
}

ServerOption::ServerOption(const char* key, Kind kind, OptionGroup group, const char* help,
                           std::string value_name)
    : key_(key), help_(help), value_name_(std::move(value_name)), kind_(kind), group_(group) {}

ServerOption ServerOption::Int(const char* key, std::function<int&(ServerConfig&)> bind, int lo,
                               int hi, OptionGroup group, const char* help) {
  ServerOption o(key, Kind::kInt, group, help, "INT");
  o.set_ = [=](ServerConfig& c, const std::string& v) { return ParseInt(v, lo, hi, &bind(c)); };
  o.get_ = [=](ServerConfig& c) { return std::to_string(bind(c)); };
  return o;
}

ServerOption ServerOption::Bool(const char* key, std::function<bool&(ServerConfig&)> bind,
                                OptionGroup group, const char* help) {
  ServerOption o(key, Kind::kBool, group, help, "true|false");
  o.set_ = [=](ServerConfig& c, const std::string& v) {
    if (v == "true" || v == "1") {
      bind(c) = true;
    } else if (v == "false" || v == "0") {
      bind(c) = false;
    } else {
      return InvalidArgument("must be true or false, got '" + v + "'");
    }
    return Status::Ok();
  };
  o.get_ = [=](ServerConfig& c) { return std::string(bind(c) ? "true" : "false"); };
  return o;
}

ServerOption ServerOption::String(const char* key, std::function<std::string&(ServerConfig&)> bind,
                                  OptionGroup group, const char* help) {
  ServerOption o(key, Kind::kString, group, help, "STR");
  o.set_ = [=](ServerConfig& c, const std::string& v) {
    bind(c) = v;
    return Status::Ok();
  };
  o.get_ = [=](ServerConfig& c) { return bind(c); };
  return o;
}

ServerOption ServerOption::Choice(const char* key, std::function<std::string&(ServerConfig&)> bind,
                                  std::span<const char* const> choices, OptionGroup group,
                                  const char* help) {
  ServerOption o(key, Kind::kString, group, help, Join(choices, "|"));
  o.set_ = [=](ServerConfig& c, const std::string& v) {
    for (const char* choice : choices) {
      if (v == choice) {
        bind(c) = v;
        return Status::Ok();
      }
    }
    return InvalidArgument("must be one of " + Join(choices, ", ") + ", got '" + v + "'");
  };
  o.get_ = [=](ServerConfig& c) { return bind(c); };
  return o;
}

ServerOption ServerOption::MiB(const char* key, std::function<size_t&(ServerConfig&)> bind, int lo,
                               int hi, OptionGroup group, const char* help) {
  ServerOption o(key, Kind::kInt, group, help, "MIB");
  o.set_ = [=](ServerConfig& c, const std::string& v) {
    int mib = 0;
    LLM_RETURN_IF_ERROR(ParseInt(v, lo, hi, &mib));
    bind(c) = static_cast<size_t>(mib) << 20;
    return Status::Ok();
  };
  o.get_ = [=](ServerConfig& c) { return std::to_string(bind(c) >> 20); };
  return o;
}

ServerOption ServerOption::Percent(const char* key, std::function<double&(ServerConfig&)> bind,
                                   int lo, int hi, OptionGroup group, const char* help) {
  ServerOption o(key, Kind::kInt, group, help, "PERCENT");
  o.set_ = [=](ServerConfig& c, const std::string& v) {
    int pct = 0;
    LLM_RETURN_IF_ERROR(ParseInt(v, lo, hi, &pct));
    bind(c) = pct / 100.0;
    return Status::Ok();
  };
  o.get_ = [=](ServerConfig& c) { return std::to_string(std::lround(bind(c) * 100)); };
  return o;
}

ServerOption& ServerOption::OnlyOn(const char* device, const char* why) {
  only_device_ = device;
  only_device_why_ = why;
  return *this;
}

ServerOption& ServerOption::Requires(std::function<bool(const ServerConfig&)> applies,
                                     const char* needs) {
  applies_ = std::move(applies);
  needs_ = needs;
  return *this;
}

ServerOption& ServerOption::Check(std::function<Status(const std::string&)> check) {
  check_ = std::move(check);
  return *this;
}

ServerOption& ServerOption::Alias(const char* alias) {
  alias_ = alias;
  return *this;
}

std::string ServerOption::flag() const {
  std::string f = "--" + key_;
  for (char& ch : f) ch = ch == '_' ? '-' : ch;
  return f;
}

Status ServerOption::Set(ServerConfig& config, const std::string& text) const {
  LLM_RETURN_IF_ERROR(set_(config, text));
  return check_ ? check_(text) : Status::Ok();
}

std::string ServerOption::Get(const ServerConfig& config) const {
  // The binders hand out mutable references; reading through one changes nothing.
  return get_(const_cast<ServerConfig&>(config));
}

std::string ServerOption::Inapplicable(const ServerConfig& config,
                                       const std::string& device) const {
  if (!only_device_.empty() && device != only_device_) {
    return flag() + " does not apply to device " + device + ": " + only_device_why_;
  }
  if (applies_ && !applies_(config)) return flag() + " applies only with " + needs_;
  return "";
}

}  // namespace llm
