#include "grammar/vocabulary.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "grammar/expr.h"

namespace llm::grammar {

std::shared_ptr<const Vocabulary> Vocabulary::Create(std::vector<std::string> tokens,
                                                     std::vector<int32_t> eos_ids,
                                                     std::vector<int32_t> special_ids) {
  auto v = std::make_shared<Vocabulary>();
  v->tokens_ = std::move(tokens);
  v->eos_ids_ = std::move(eos_ids);
  std::unordered_set<int32_t> excluded(special_ids.begin(), special_ids.end());
  excluded.insert(v->eos_ids_.begin(), v->eos_ids_.end());
  for (int32_t id = 0; id < static_cast<int32_t>(v->tokens_.size()); ++id) {
    if (!v->tokens_[id].empty() && !excluded.count(id)) v->sorted_.push_back(id);
  }
  v->ordinary_.assign(v->tokens_.size(), 0);
  for (int32_t id : v->sorted_) v->ordinary_[id] = 1;
  std::unordered_set<int32_t> eos(v->eos_ids_.begin(), v->eos_ids_.end());
  for (int32_t id : special_ids) {
    if (id >= 0 && id < static_cast<int32_t>(v->tokens_.size()) && !v->tokens_[id].empty() &&
        !eos.count(id) && v->ordinary_[id] == 0) {
      v->ordinary_[id] = 2;
      v->special_ids_.push_back(id);
    }
  }
  std::sort(v->sorted_.begin(), v->sorted_.end(),
            [&](int32_t a, int32_t b) { return v->tokens_[a] < v->tokens_[b]; });
  BuildSkipTables(*v, v->sorted_, v->sorted_skip_);
  v->sorted_offsets_.push_back(0);
  for (size_t i = 0; i < v->sorted_.size(); ++i) {
    const std::string& t = v->tokens_[v->sorted_[i]];
    uint32_t lcp = 0;
    if (i > 0) {
      const std::string& prev = v->tokens_[v->sorted_[i - 1]];
      while (lcp < prev.size() && lcp < t.size() && prev[lcp] == t[lcp]) ++lcp;
    }
    v->sorted_lcp_.push_back(lcp);
    v->sorted_bytes_ += t;
    v->sorted_offsets_.push_back(static_cast<uint32_t>(v->sorted_bytes_.size()));
  }
  return v;
}

void BuildSkipTables(const Vocabulary& vocab, const std::vector<int32_t>& ids,
                     std::vector<uint32_t>* skip) {
  for (size_t d = 1; d <= kSkipDepth; ++d) {
    auto& t = skip[d - 1];
    t.assign(ids.size(), static_cast<uint32_t>(ids.size()));
    for (size_t i = ids.size(); i-- > 1;) {
      const std::string &a = vocab.token(ids[i - 1]), &b = vocab.token(ids[i]);
      bool shared = a.size() >= d && b.size() >= d && a.compare(0, d, b, 0, d) == 0;
      t[i - 1] = shared ? t[i] : static_cast<uint32_t>(i);
    }
  }
}

bool Vocabulary::IsEos(int32_t id) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

namespace {

using nlohmann::json;

bool HasType(const json& node, const std::string& type) {
  if (!node.is_object()) return false;
  if (node.value("type", "") == type) return true;
  for (const char* key : {"decoders", "pretokenizers"}) {
    if (node.contains(key) && node[key].is_array()) {
      for (const auto& k : node[key])
        if (HasType(k, type)) return true;
    }
  }
  return false;
}

// GPT-2's printable stand-ins for bytes, reversed: code point -> byte.
std::unordered_map<uint32_t, uint8_t> ByteLevelDecodeTable() {
  std::unordered_map<uint32_t, uint8_t> table;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    table[printable ? static_cast<uint32_t>(b) : next++] = static_cast<uint8_t>(b);
  }
  return table;
}

// Decodes UTF-8 into code points; false on malformed input.
bool DecodeUtf8(const std::string& s, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return true;
}

}  // namespace

Result<std::shared_ptr<const Vocabulary>> Vocabulary::FromHfTokenizerJson(
    const std::string& json_text, std::vector<int32_t> eos_ids) {
  using R = Result<std::shared_ptr<const Vocabulary>>;
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model"))
    return R::Error("tokenizer.json: not a tokenizer file");
  const json& model = j["model"];
  bool byte_level = HasType(j.value("decoder", json()), "ByteLevel") ||
                    HasType(j.value("pre_tokenizer", json()), "ByteLevel");
  std::vector<std::pair<std::string, int32_t>> entries;
  if (model.contains("vocab") && model["vocab"].is_object()) {
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it)
      entries.emplace_back(it.key(), it.value().get<int32_t>());
  } else if (model.contains("vocab") && model["vocab"].is_array()) {  // Unigram: [piece, score]
    int32_t id = 0;
    for (const auto& e : model["vocab"]) entries.emplace_back(e[0].get<std::string>(), id++);
  } else {
    return R::Error("tokenizer.json: model.vocab missing");
  }
  std::vector<int32_t> special;
  std::unordered_set<int32_t> added_ids;
  std::vector<std::pair<std::string, int32_t>> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& t : j["added_tokens"]) {
      int32_t id = t.value("id", -1);
      if (id < 0) continue;
      added_ids.insert(id);
      if (t.value("special", false)) special.push_back(id);
      added.emplace_back(t.value("content", ""), id);
    }
  }
  int32_t n = 0;
  for (auto& [s, id] : entries) n = std::max(n, id + 1);
  for (auto& [s, id] : added) n = std::max(n, id + 1);
  std::vector<std::string> tokens(n);
  auto decode_table = byte_level ? ByteLevelDecodeTable() : std::unordered_map<uint32_t, uint8_t>{};
  for (auto& [s, id] : entries) {
    if (added_ids.count(id)) continue;
    std::string bytes;
    if (byte_level) {
      std::vector<uint32_t> cps;
      if (!DecodeUtf8(s, cps)) continue;
      bool ok = true;
      for (uint32_t cp : cps) {
        auto it = decode_table.find(cp);
        if (it == decode_table.end()) {
          ok = false;
          break;
        }
        bytes += static_cast<char>(it->second);
      }
      if (!ok) continue;
    } else if (s.size() == 6 && s.rfind("<0x", 0) == 0 && s[5] == '>') {
      bytes = std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
    } else {
      for (size_t i = 0; i < s.size();) {  // U+2581 (metaspace) stands for a space
        if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
          bytes += ' ';
          i += 3;
        } else {
          bytes += s[i++];
        }
      }
    }
    tokens[id] = std::move(bytes);
  }
  for (auto& [s, id] : added) tokens[id] = s;  // added tokens are literal text
  auto v = Create(std::move(tokens), std::move(eos_ids), std::move(special));
  std::const_pointer_cast<Vocabulary>(v)->byte_level_ = byte_level;
  return v;
}

}  // namespace llm::grammar
