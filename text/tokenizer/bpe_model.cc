#include "text/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>
#include <tuple>

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"

namespace llm::tokenizer_internal {

using json = nlohmann::json;

namespace {

// Word cache bounds: long words are rare and cheap to skip; the map is cleared when full.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCacheEntries = size_t{1} << 16;

// A candidate merge of the adjacent symbols `left` and `right` inside one word.
struct MergeCandidate {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t new_id;
  // Lowest rank first; among equal ranks the leftmost, as in HF's BPE.
  bool operator>(const MergeCandidate& o) const {
    return std::tie(rank, left) > std::tie(o.rank, o.left);
  }
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

size_t Utf8Length(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& model) {
  if (!model.is_object()) return InvalidArgument("tokenizer.json: 'model' is not an object");
  // HF omits "type" in some old files; vocab + merges then still mean BPE.
  if (model.contains("type")) {
    const std::string type = TypeOf(model);
    if (type != "BPE") return InvalidArgument("unsupported model type: " + type);
  }
  if (!IsNullOrMissing(model, "dropout")) {
    return InvalidArgument("unsupported model option: dropout (BPE dropout is for training)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!StringOr(model, key, "").empty()) {
      return InvalidArgument(std::string("unsupported model option: ") + key);
    }
  }
  auto m = std::unique_ptr<BpeModel>(new BpeModel);
  m->ignore_merges_ = BoolOr(model, "ignore_merges", false);
  m->byte_fallback_ = BoolOr(model, "byte_fallback", false);
  m->fuse_unk_ = BoolOr(model, "fuse_unk", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return InvalidArgument("tokenizer.json: model.vocab missing or not an object");
  }
  for (const auto& [token, id_json] : model["vocab"].items()) {
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) {
      return InvalidArgument("vocab id out of range for token '" + token + "'");
    }
    m->vocab_[token] = static_cast<int32_t>(id);
  }
  m->byte_fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m->vocab_.find(std::string_view(name));
    if (it != m->vocab_.end()) m->byte_fallback_ids_[b] = it->second;
  }
  if (model.contains("merges") && !model["merges"].is_null()) {
    const json& merges = model["merges"];
    if (!merges.is_array()) return InvalidArgument("tokenizer.json: model.merges is not an array");
    m->merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& entry = merges[rank];
      std::string a, b;
      if (entry.is_string()) {
        // HF splits on ' ' and requires exactly two parts.
        const std::string& s = entry.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return InvalidArgument("malformed merge: '" + s + "'");
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (entry.is_array() && entry.size() == 2) {
        a = entry[0].get<std::string>();
        b = entry[1].get<std::string>();
      } else {
        return InvalidArgument("malformed merge at rank " + std::to_string(rank));
      }
      auto ia = m->vocab_.find(a), ib = m->vocab_.find(b), iab = m->vocab_.find(a + b);
      if (ia == m->vocab_.end() || ib == m->vocab_.end() || iab == m->vocab_.end()) {
        return InvalidArgument("merge '" + a + " " + b + "' uses a token missing from the vocab");
      }
      // The first occurrence of a pair wins, as in HF.
      m->merges_.try_emplace(PairKey(ia->second, ib->second), static_cast<int32_t>(rank),
                             iab->second);
    }
  }
  if (!IsNullOrMissing(model, "unk_token")) {
    const std::string unk = model["unk_token"].get<std::string>();
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end()) {
      return InvalidArgument("model.unk_token '" + unk + "' is not in the vocab");
    }
    m->unk_id_ = it->second;
  }
  return m;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> result = Bpe(word);
  ids->insert(ids->end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();  // crude but bounded
    cache_.try_emplace(std::string(word), std::move(result));
  }
}

std::vector<int32_t> BpeModel::Bpe(std::string_view word) const {
  if (ignore_merges_) {
    // A pre-token that is itself a vocab entry is emitted whole.
    auto it = vocab_.find(word);
    if (it != vocab_.end()) return {it->second};
  }
  // Symbols form a doubly linked list; merged-away symbols get id -1.
  struct Symbol {
    int32_t id, prev, next;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto add = [&](int32_t id) {
    const int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back({id, i - 1, i + 1});
  };
  bool last_was_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len =
        std::min(Utf8Length(static_cast<unsigned char>(word[pos])), word.size() - pos);
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      add(it->second);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_fallback_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) add(byte_fallback_ids_[b]);
        last_was_unk = false;
        continue;
      }
    }
    // Unknown character: unk (runs fused into one when fuse_unk), or dropped without unk.
    if (!unk_id_) continue;
    if (!(fuse_unk_ && last_was_unk)) add(*unk_id_);
    last_was_unk = true;
  }
  if (syms.empty()) return {};
  syms.back().next = -1;

  std::priority_queue<MergeCandidate, std::vector<MergeCandidate>, std::greater<>> heap;
  auto push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    auto it = merges_.find(PairKey(syms[left].id, syms[right].id));
    if (it != merges_.end()) heap.push({it->second.first, left, right, it->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i, i + 1);
  while (!heap.empty()) {
    const MergeCandidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    if (l.id < 0 || l.next != c.right || syms[c.right].id < 0) continue;  // stale
    auto it = merges_.find(PairKey(l.id, syms[c.right].id));
    if (it == merges_.end() || it->second.first != c.rank) continue;  // left changed since
    l.id = c.new_id;
    syms[c.right].id = -1;
    l.next = syms[c.right].next;
    if (l.next >= 0) syms[l.next].prev = c.left;
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  std::vector<int32_t> out;
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  return out;
}

}  // namespace llm::tokenizer_internal
