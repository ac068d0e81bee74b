// One declared server option: the member of ServerConfig it binds (so the engine's own config
// structs are the storage), its key, help text, group, value type and range or choices, and the
// device or setting it needs. The flag parser, the JSON reader, --help and validation all read
// these declarations (ServerOptions() in server_config.cc).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace llm {

struct ServerConfig;

// --help groups, in the order printed. kKernel is shown only by --help-all.
enum class OptionGroup { kServer, kModel, kKvCache, kScheduler, kLimits, kCuda, kKernel };
const char* OptionGroupTitle(OptionGroup group);

class ServerOption {
 public:
  enum class Kind { kInt, kBool, kString };  // the JSON type a config file must use

  // The binder returns the option's storage inside a ServerConfig.
  static ServerOption Int(const char* key, std::function<int&(ServerConfig&)> bind, int lo, int hi,
                          OptionGroup group, const char* help);
  static ServerOption Bool(const char* key, std::function<bool&(ServerConfig&)> bind,
                           OptionGroup group, const char* help);
  static ServerOption String(const char* key, std::function<std::string&(ServerConfig&)> bind,
                             OptionGroup group, const char* help);
  // One of `choices` (the list a module exports, so the values are declared once).
  static ServerOption Choice(const char* key, std::function<std::string&(ServerConfig&)> bind,
                             std::span<const char* const> choices, OptionGroup group,
                             const char* help);
  // Stored as bytes, given in MiB.
  static ServerOption MiB(const char* key, std::function<size_t&(ServerConfig&)> bind, int lo,
                          int hi, OptionGroup group, const char* help);
  // Stored as a fraction, given as a whole percent.
  static ServerOption Percent(const char* key, std::function<double&(ServerConfig&)> bind, int lo,
                              int hi, OptionGroup group, const char* help);

  // An explicitly set value is refused unless the model runs on `device`; `why` completes
  // "--flag does not apply to device D: why".
  ServerOption& OnlyOn(const char* device, const char* why);
  // An explicitly set value is refused unless `applies(config)`; `needs` names the condition
  // ("--weight-dtype fp8").
  ServerOption& Requires(std::function<bool(const ServerConfig&)> applies, const char* needs);
  // An extra check of the value (after parsing); its message should name the option.
  ServerOption& Check(std::function<Status(const std::string& value)> check);
  // A second flag name (--model for --model-dir).
  ServerOption& Alias(const char* alias);

  const std::string& key() const { return key_; }
  std::string flag() const;  // --key with '-' for '_'
  const std::string& alias() const { return alias_; }
  OptionGroup group() const { return group_; }
  Kind kind() const { return kind_; }
  const std::string& help() const { return help_; }
  const std::string& value_name() const { return value_name_; }

  // Parses `text` into `config`; errors name the option and the value.
  Status Set(ServerConfig& config, const std::string& text) const;
  // The value in the form Set accepts.
  std::string Get(const ServerConfig& config) const;
  // Empty when an explicit value applies to `config` running on `device`, else the reason.
  std::string Inapplicable(const ServerConfig& config, const std::string& device) const;

 private:
  ServerOption(const char* key, Kind kind, OptionGroup group, const char* help,
               std::string value_name);

  std::string key_, alias_, help_, value_name_;
  Kind kind_;
  OptionGroup group_;
  std::function<Status(ServerConfig&, const std::string&)> set_;
  std::function<std::string(ServerConfig&)> get_;
  std::function<Status(const std::string&)> check_;
  std::string only_device_, only_device_why_;
  std::function<bool(const ServerConfig&)> applies_;
  std::string needs_;
};

}  // namespace llm
