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

}  // namespace

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
  for (const std::string& key : all) k.digests_.push_back(Hash(key));
  return k;
}

bool ApiKeys::Allows(std::string_view authorization) const {
  if (digests_.empty()) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) return false;
  const Digest d = Hash(authorization.substr(kBearer.size()));
  bool ok = false;
  // Every key is compared, so the time does not tell which one matched.
  for (const Digest& k : digests_) ok |= CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0;
  return ok;
}

}  // namespace llm
