// Checks on an HTTP request's head, made before any of its body is read (RFC 9112 §6). The
// HTTP library reads a chunked body, a body without a length (to EOF) and a compressed body
// without counting it against the body limit, so those forms are refused here with a status
// that names what is not supported; a body is only read when its Content-Length is within the
// limit. Ambiguous framing (Transfer-Encoding with Content-Length, several or malformed
// Content-Lengths) is a 400: the peer may mean a different message boundary than we do.
#pragma once

#include <cstddef>
#include <optional>

#include "server/openai_protocol.h"

namespace httplib {
struct Request;
}

namespace llm {

// nullopt: the body may be read. Otherwise the error to send; the connection must then be
// closed, since the body (if any) was not read and its bytes must not be taken for a request.
std::optional<OpenAiError> CheckRequestHead(const httplib::Request& req, size_t max_body_bytes);

}  // namespace llm
