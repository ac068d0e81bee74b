#include "server/api_keys.h"

#include <fstream>

#include <openssl/crypto.h>
#include <openssl/sha.h>

namespace llm {
namespace {

std::string Trim(std::string s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// RFC 9110 §11.2 token68: the characters a Bearer credential (RFC 6750 §2.1) may hold.
bool IsToken68(std::string_view s) {
  size_t i = 0;
  auto body = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~' || c == '+' || c == '/';
  };
  while (i < s.size() && body(s[i])) ++i;
  if (i == 0) return false;
  while (i < s.size() && s[i] == '=') ++i;
  return i == s.size();
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const char x = (a[i] >= 'A' && a[i] <= 'Z') ? a[i] - 'A' + 'a' : a[i];
    const char y = (b[i] >= 'A' && b[i] <= 'Z') ? b[i] - 'A' + 'a' : b[i];
    if (x != y) return false;
  }
  return true;
}

}  // namespace

std::optional<std::string_view> BearerCredential(std::string_view authorization) {
  // credentials = auth-scheme 1*SP token68 (RFC 9110 §11.4); the scheme is case-insensitive.
  const size_t sp = authorization.find(' ');
  if (sp == std::string_view::npos || !EqualsIgnoreCase(authorization.substr(0, sp), "bearer")) {
    return std::nullopt;
  }
  size_t b = sp;
  while (b < authorization.size() && authorization[b] == ' ') ++b;
  const std::string_view credential = authorization.substr(b);
  if (!IsToken68(credential)) return std::nullopt;
  return credential;
}

ApiKeys::Digest ApiKeys::Hash(std::string_view s) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

StatusOr<ApiKeys> ApiKeys::Load(const std::vector<std::string>& keys, const std::string& file) {
  std::vector<std::string> all;
  for (const std::string& entry : keys) {
    size_t start = 0;
    for (;;) {
      const size_t comma = entry.find(',', start);
      all.push_back(Trim(entry.substr(start, comma - start)));
      if (all.back().empty()) return InvalidArgument("api_key has an empty key");
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return NotFound("cannot open api_key_file " + file);
    std::string line;
    while (std::getline(in, line)) {
      line = Trim(line);
      if (line.empty() || line[0] == '#') continue;
      all.push_back(line);
    }
    if (all.empty()) return InvalidArgument("api_key_file " + file + " holds no keys");
  }
  ApiKeys k;
  for (const std::string& key : all) {
    // A key a client cannot send as a Bearer credential would silently never match.
    if (!IsToken68(key)) {
      return InvalidArgument(
          "an API key may hold only letters, digits and -._~+/ (then '=' padding): RFC 6750 "
          "Bearer token syntax");
    }
    k.digests_.push_back(Hash(key));
  }
  return k;
}

bool ApiKeys::Allows(std::string_view authorization) const {
  if (digests_.empty()) return true;
  const std::optional<std::string_view> credential = BearerCredential(authorization);
  if (!credential) return false;
  const Digest d = Hash(*credential);
  bool ok = false;
  // Every key is compared, so the time does not tell which one matched.
  for (const Digest& k : digests_) ok |= CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0;
  return ok;
}

}  // namespace llm
