#include "text/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "base/check.h"
#include "text/tokenizer/byte_level.h"

namespace llm {
namespace {

using json = nlohmann::json;
using tokenizer_internal::ByteToUnicode;
using tokenizer_internal::Regex;
using tokenizer_internal::SanitizeUtf8;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t First(uint64_t key) {
  return static_cast<int32_t>(key >> 32);
}
int32_t Second(uint64_t key) {
  return static_cast<int32_t>(key & 0xFFFFFFFFu);
}

// Pair statistics over the unique words, kept up to date as merges rewrite words, so each merge
// costs only the words that contain the merged pair.
class PairStats {
 public:
  PairStats(std::vector<std::vector<int32_t>>* words, const std::vector<int64_t>* freqs)
      : words_(*words), freqs_(*freqs) {
    for (size_t w = 0; w < words_.size(); ++w) Add(static_cast<int32_t>(w), +1);
  }

  // The most frequent pair; ties go to the lexicographically smallest (left, right) strings so
  // the result never depends on hash order. Returns false when no pair is left.
  bool Best(const std::vector<std::string>& tokens, uint64_t* best) const {
    int64_t best_count = 0;
    for (const auto& [key, count] : counts_) {
      if (count <= 0) continue;
      bool better = count > best_count;
      if (!better && count == best_count) {
        const std::string &a = tokens[First(key)], &b = tokens[Second(key)];
        const std::string &ba = tokens[First(*best)], &bb = tokens[Second(*best)];
        better = std::tie(a, b) < std::tie(ba, bb);
      }
      if (better) {
        best_count = count;
        *best = key;
      }
    }
    return best_count > 0;
  }

  // Rewrites every occurrence of `pair` as `new_id` and updates the counts.
  void Merge(uint64_t pair, int32_t new_id) {
    auto where_it = where_.find(pair);
    if (where_it == where_.end()) return;
    std::vector<int32_t> affected(where_it->second.begin(), where_it->second.end());
    where_.erase(where_it);
    const int32_t a = First(pair), b = Second(pair);
    for (int32_t w : affected) {
      std::vector<int32_t>& syms = words_[w];
      bool present = false;
      for (size_t i = 0; i + 1 < syms.size() && !present; ++i) {
        present = syms[i] == a && syms[i + 1] == b;
      }
      if (!present) continue;  // stale entry
      Add(w, -1);
      std::vector<int32_t> merged;
      merged.reserve(syms.size());
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          merged.push_back(new_id);
          ++i;
        } else {
          merged.push_back(syms[i]);
        }
      }
      syms.swap(merged);
      Add(w, +1);
    }
    counts_.erase(pair);
  }

 private:
  void Add(int32_t w, int sign) {
    const std::vector<int32_t>& syms = words_[w];
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      uint64_t key = PairKey(syms[i], syms[i + 1]);
      auto it = counts_.try_emplace(key, 0).first;
      it->second += sign * freqs_[w];
      if (it->second == 0) counts_.erase(it);
      if (sign > 0) where_[key].insert(w);
    }
  }

  std::vector<std::vector<int32_t>>& words_;
  const std::vector<int64_t>& freqs_;
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::unordered_set<int32_t>> where_;
};

json AddedToken(int32_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

json PostProcessor(const std::string& bos, int32_t bos_id) {
  auto special = [&](int type_id) {
    return json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}};
  };
  auto sequence = [](const char* id, int type_id) {
    return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  return {
      {"type", "TemplateProcessing"},
      {"single", json::array({special(0), sequence("A", 0)})},
      {"pair", json::array({special(0), sequence("A", 0), special(1), sequence("B", 1)})},
      {"special_tokens",
       {{bos, {{"id", bos}, {"ids", json::array({bos_id})}, {"tokens", json::array({bos})}}}}},
  };
}

}  // namespace

json TrainByteLevelBpe(const std::string& corpus, const BpeTrainerConfig& config) {
  const std::string pattern =
      config.pretokenizer_regex.empty() ? kLlama3PretokenizerRegex : config.pretokenizer_regex;
  auto regex_or = Regex::Compile(pattern);
  LLM_CHECK(regex_or.ok()) << regex_or.status().ToString();
  const Regex& regex = *regex_or.value();

  // Pre-tokenize exactly as the tokenizer will (Split, Isolated: gaps are words too), and count
  // unique words; an ordered map makes the word order deterministic.
  const std::string text = SanitizeUtf8(corpus);
  std::vector<std::pair<size_t, size_t>> matches;
  regex.FindAll(text, &matches);
  std::map<std::string_view, int64_t> word_counts;
  size_t last = 0;
  for (auto [b, e] : matches) {
    if (b > last) ++word_counts[std::string_view(text).substr(last, b - last)];
    ++word_counts[std::string_view(text).substr(b, e - b)];
    last = e;
  }
  if (last < text.size()) ++word_counts[std::string_view(text).substr(last)];

  // Initial vocabulary: id b is the alphabet symbol of byte b.
  const auto& alphabet = ByteToUnicode();
  std::vector<std::string> tokens(alphabet.begin(), alphabet.end());
  std::unordered_map<std::string, int32_t> token_ids;
  for (int b = 0; b < 256; ++b) token_ids[tokens[b]] = b;

  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freqs;
  for (const auto& [word, count] : word_counts) {
    words.emplace_back(word.begin(), word.end());
    for (int32_t& s : words.back()) s = static_cast<unsigned char>(s);
    freqs.push_back(count);
  }

  const size_t target = static_cast<size_t>(std::max(config.vocab_size, 256));
  PairStats stats(&words, &freqs);
  json merges = json::array();
  while (tokens.size() < target) {
    uint64_t best = 0;
    if (!stats.Best(tokens, &best)) break;  // corpus exhausted: smaller vocab
    const std::string& a = tokens[First(best)];
    const std::string& b = tokens[Second(best)];
    merges.push_back(a + " " + b);
    std::string merged = a + b;
    // Different splits can spell the same string ("a"+"bc", "ab"+"c"); reuse its id like HF.
    auto [it, inserted] = token_ids.try_emplace(merged, static_cast<int32_t>(tokens.size()));
    if (inserted) tokens.push_back(merged);
    stats.Merge(best, it->second);
  }

  json vocab = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;

  // Special tokens sit at config.vocab_size.. even if the corpus ran out of pairs first (ids
  // in between are then unused): callers size the embedding table from the config.
  json added = json::array();
  for (size_t i = 0; i < config.special_tokens.size(); ++i) {
    added.push_back(AddedToken(static_cast<int32_t>(target + i), config.special_tokens[i]));
  }

  json out;
  out["version"] = "1.0";
  out["truncation"] = nullptr;
  out["padding"] = nullptr;
  out["added_tokens"] = added;
  out["normalizer"] = nullptr;
  out["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({
                            {{"type", "Split"},
                             {"pattern", {{"Regex", pattern}}},
                             {"behavior", "Isolated"},
                             {"invert", false}},
                            {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", false}},
                        })},
  };
  out["post_processor"] =
      config.special_tokens.empty()
          ? json(nullptr)
          : PostProcessor(config.special_tokens[0], static_cast<int32_t>(target));
  out["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
  out["model"] = {
      {"type", "BPE"},
      {"dropout", nullptr},
      {"unk_token", nullptr},
      {"continuing_subword_prefix", nullptr},
      {"end_of_word_suffix", nullptr},
      {"fuse_unk", false},
      {"byte_fallback", false},
      {"ignore_merges", false},
      {"vocab", vocab},
      {"merges", merges},
  };
  return out;
}

}  // namespace llm
