// Options of the two front ends (HTTP address, API keys, TLS, request body limit, chat
// template): storage only. Each is declared once, as a row of ServerOptions() (server_config.cc).
#pragma once

#include <string>

namespace llm {

struct FrontEndOptions {
  std::string http_address = "127.0.0.1:8000";  // OpenAI HTTP API; "off" disables; loopback
  std::string api_key;                          // comma-separated keys; empty: no key needed
  std::string api_key_file;                     // one key per line
  std::string tls_cert_file;                    // PEM; with tls_key_file, TLS on gRPC and HTTP
  std::string tls_key_file;
  int max_request_body_bytes = 8 << 20;         // HTTP bodies past this get 413
  int max_json_depth = 64;                      // HTTP JSON bodies nested deeper get 400
  int http_max_connections = 16384;             // open HTTP connections; past it, closed at accept
  int http_max_connections_per_address = 4096;  // the same, per client address
  std::string chat_template_file;               // overrides the model's chat template
  // How chat output is split (text/tool_calls): "auto" picks from the chat template.
  std::string tool_call_parser = "auto";
  std::string reasoning_parser = "auto";

  bool tls() const { return !tls_cert_file.empty(); }
};

}  // namespace llm
