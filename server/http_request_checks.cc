#include "server/http_request_checks.h"

#include <httplib.h>

namespace llm {
namespace {

OpenAiError Refuse(int status, std::string message) {
  OpenAiError e;
  e.http_status = status;
  e.message = std::move(message);
  return e;
}

bool AllDigits(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;  // 18 digits cannot overflow uint64
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::optional<OpenAiError> CheckRequestHead(const httplib::Request& req, size_t max_body_bytes) {
  const size_t lengths = req.get_header_value_count("Content-Length");
  if (req.has_header("Transfer-Encoding")) {
    if (lengths > 0) {
      return Refuse(400, "a request must not carry both Transfer-Encoding and Content-Length");
    }
    return Refuse(411, "Transfer-Encoding is not supported on requests; send Content-Length");
  }
  if (lengths > 1) return Refuse(400, "a request must carry at most one Content-Length");
  if (req.has_header("Content-Encoding")) {
    const std::string enc = req.get_header_value("Content-Encoding");
    if (enc != "identity") {
      return Refuse(415, "Content-Encoding is not supported on requests; send the body as is");
    }
  }
  if (lengths == 1) {
    const std::string value = req.get_header_value("Content-Length");
    if (!AllDigits(value)) return Refuse(400, "Content-Length must be a decimal number");
    if (std::stoull(value) > max_body_bytes) {
      return Refuse(413, "request body exceeds max_request_body_bytes (" +
                             std::to_string(max_body_bytes) + ")");
    }
    return std::nullopt;
  }
  // The library would read a length-less request body to EOF, without a limit.
  if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
      req.method == "DELETE" || req.method == "PRI") {
    return Refuse(411, "a " + req.method + " request must carry Content-Length");
  }
  return std::nullopt;
}

}  // namespace llm
