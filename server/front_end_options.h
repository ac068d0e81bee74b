// Options of the two front ends (HTTP address, API keys, TLS, request body limit). Parsed from
// the command line ahead of ServerConfig, which rejects flags it does not know.
#pragma once

#include <string>
#include <vector>

#include "engine/base/status.h"

namespace llm {

struct FrontEndOptions {
  std::string http_address = "127.0.0.1:8000";  // OpenAI HTTP API; "off" disables; loopback
  std::vector<std::string> api_keys;            // --api-key, repeatable or a comma list
  std::string api_key_file;                     // one key per line
  std::string tls_cert_file;                    // PEM; with tls_key_file, TLS on gRPC and HTTP
  std::string tls_key_file;
  int max_request_body_bytes = 8 << 20;  // HTTP bodies past this get 413
  std::string chat_template_file;        // overrides the model's chat template

  bool tls() const { return !tls_cert_file.empty(); }
};

// Removes the front-end flags (--http-address, --api-key, --api-key-file, --tls-cert-file,
// --tls-key-file, --max-request-body-bytes, --chat-template; '-' or '_', "--k v" or "--k=v")
// from `args` and returns them, validated.
StatusOr<FrontEndOptions> ExtractFrontEndOptions(std::vector<std::string>* args);
std::string FrontEndUsage();

}  // namespace llm
