#include "server/front_end_options.h"

#include <fstream>

namespace llm {

StatusOr<FrontEndOptions> ExtractFrontEndOptions(std::vector<std::string>* args) {
  FrontEndOptions o;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a.rfind("--", 0) != 0) {
      rest.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    const size_t eq = key.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) key = key.substr(0, eq);
    for (char& ch : key) ch = ch == '-' ? '_' : ch;
    std::string* str = key == "http_address"    ? &o.http_address
                       : key == "api_key_file"  ? &o.api_key_file
                       : key == "tls_cert_file" ? &o.tls_cert_file
                       : key == "tls_key_file"  ? &o.tls_key_file
                       : key == "chat_template" ? &o.chat_template_file
                                                : nullptr;
    const bool known = str != nullptr || key == "api_key" || key == "max_request_body_bytes";
    if (!known) {
      rest.push_back(a);
      continue;
    }
    if (inline_value) {
      value = a.substr(2 + eq + 1);
    } else {
      if (i + 1 >= args->size()) return InvalidArgument("flag " + a + " needs a value");
      value = (*args)[++i];
    }
    if (str != nullptr) {
      *str = value;
    } else if (key == "api_key") {
      o.api_keys.push_back(value);
    } else {
      try {
        size_t pos = 0;
        const long long v = std::stoll(value, &pos);
        if (pos != value.size() || v < 1024 || v > (1LL << 30)) throw std::out_of_range(value);
        o.max_request_body_bytes = static_cast<int>(v);
      } catch (const std::exception&) {
        return InvalidArgument("max_request_body_bytes must be an integer in [1024, 2^30], got '" +
                               value + "'");
      }
    }
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return InvalidArgument("tls_cert_file and tls_key_file go together");
  }
  for (const std::string* f : {&o.tls_cert_file, &o.tls_key_file, &o.chat_template_file}) {
    if (!f->empty() && !std::ifstream(*f)) return NotFound("cannot open " + *f);
  }
  if (o.http_address != "off" && o.http_address.rfind(':') == std::string::npos) {
    return InvalidArgument("http_address must be host:port or off, got '" + o.http_address + "'");
  }
  *args = std::move(rest);
  return o;
}

std::string FrontEndUsage() {
  return "Front-end flags:\n"
         "  http_address: host:port for the OpenAI HTTP API, or off (default 127.0.0.1:8000)\n"
         "  api_key: key clients send as 'Authorization: Bearer KEY' (repeatable, or a comma "
         "list); gRPC takes the same as call metadata\n"
         "  api_key_file: file of keys, one per line\n"
         "  tls_cert_file, tls_key_file: PEM certificate chain and key; TLS on gRPC and HTTP\n"
         "  max_request_body_bytes: larger HTTP bodies get 413 (default 8 MiB)\n"
         "  chat_template: a Jinja chat template file overriding the model's\n";
}

}  // namespace llm
