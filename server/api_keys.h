// API keys for both front ends. A request carries `Authorization: Bearer KEY` (an HTTP header,
// or the same key as gRPC call metadata). Keys are compared as SHA-256 digests with
// CRYPTO_memcmp, so the time taken says nothing about how much of a key matched or its length.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace llm {

// The token of an `Authorization` value "Bearer TOKEN": scheme case-insensitive, one or more
// spaces, then an RFC 9110 token68 and nothing else (RFC 9110 §11.4, RFC 6750 §2.1); nullopt for
// any other form.
std::optional<std::string_view> BearerCredential(std::string_view authorization);

class ApiKeys {
 public:
  ApiKeys() = default;  // no keys: every request is allowed

  // `keys` entries may be comma lists; `file` (optional) holds one key per line ('#' comments and
  // blank lines skipped). An empty key, or one that is not a token68, is an error.
  static StatusOr<ApiKeys> Load(const std::vector<std::string>& keys, const std::string& file);

  bool enabled() const { return !digests_.empty(); }
  // True when no keys are configured, or BearerCredential(authorization) is a configured key.
  bool Allows(std::string_view authorization) const;

 private:
  using Digest = std::array<unsigned char, 32>;
  static Digest Hash(std::string_view s);
  std::vector<Digest> digests_;
};

}  // namespace llm
