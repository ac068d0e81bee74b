// Server configuration: one JSON file, overridden by command-line flags, validated at start.
//
// Every option is declared once, as a row of ServerOptions() (server_config.cc) bound to its
// storage: the engine's own config structs (EngineConfig, ModelLoadOptions, SchedulerConfig) for
// engine options, the server-only members below for the rest. The default is the member's
// initializer; the row gives the key (JSON key, and the flag --key with '-' for '_'), type,
// range or choices, --help group and text, and the device or setting the option needs.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine_config.h"
#include "server/front_end_options.h"
#include "server/server_option.h"

namespace llm {

struct ServerConfig {
  EngineConfig engine;  // model, scheduler and request limits, handed to EngineCore::Create
  std::string listen_address = "127.0.0.1:50051";  // loopback unless configured otherwise
  std::string metrics_address = "127.0.0.1:9400";  // Prometheus /metrics; "off" disables
  int max_prompt_bytes = 1 << 20;
  int shutdown_grace_s = 10;  // SIGTERM: time in-flight requests get to finish
  std::string log_level = "info";
  FrontEndOptions front_end;  // OpenAI HTTP API, API keys, TLS, chat template

  // Keys the config file or a flag set (the rest hold their defaults).
  std::set<std::string> explicit_keys;
  bool IsExplicit(const std::string& key) const { return explicit_keys.count(key) > 0; }
};

// Every option, in --help order.
const std::vector<ServerOption>& ServerOptions();

// Applies `--config FILE` first, then every other flag, then validates. Unknown flags and keys and
// bad values are InvalidArgument naming them. --help and --version are not handled here
// (ParseCommandLine).
StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args);

// InvalidArgument naming the first explicitly set option that cannot apply when the model runs
// on `device` ("cpu" or "cuda"), or with the other settings. ParseServerConfig runs it unless the
// device is "auto"; then the caller runs it once the device is known (ResolveDevice).
Status CheckOptionsApply(const ServerConfig& config, const std::string& device);

// --help (all: --help-all, which adds the kernel experiment switches).
std::string ServerUsage(bool all);
std::string ServerVersion();

// What a command line asks for: serve with `config`, or print `out` (stdout) / `err` (stderr)
// and exit with `exit_code`: 0 for --help, --help-all and --version, 2 for a usage error.
struct CommandLine {
  std::optional<ServerConfig> config;
  int exit_code = 0;
  std::string out, err;
};
CommandLine ParseCommandLine(const std::vector<std::string>& args);

}  // namespace llm
