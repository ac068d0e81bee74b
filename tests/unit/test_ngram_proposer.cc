// Prompt-lookup drafting (engine/speculative/ngram_proposer.h): hand cases, and a randomized
// comparison with a brute-force statement of the rule.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "engine/speculative/ngram_proposer.h"

namespace llm {
namespace {

using Tokens = std::vector<int32_t>;

NgramProposer Make(int min_n, int max_n, int k) {
  auto p = NgramProposer::Create({min_n, max_n, k});
  REQUIRE(p.ok());
  return std::move(p).value();
}

// The rule, written the slow way: for n from max_n down to min_n, every start s whose n tokens
// equal the last n and are followed by a token; the earliest wins.
Tokens BruteForce(const Tokens& c, int min_n, int max_n, int k) {
  const int len = static_cast<int>(c.size());
  for (int n = max_n; n >= min_n; --n) {
    if (n >= len) continue;
    for (int s = 0; s + n <= len - 1; ++s) {
      bool same = true;
      for (int i = 0; i < n && same; ++i) same = c[s + i] == c[len - n + i];
      if (!same) continue;
      Tokens out;
      for (int i = s + n; i < len && static_cast<int>(out.size()) < k; ++i) out.push_back(c[i]);
      return out;
    }
  }
  return {};
}

TEST_CASE("n-gram drafts follow the longest earlier match of the context's suffix",
          "[speculative]") {
  // vLLM's example: [1, 2, 3, 4, 2, 3] with n = 2 matches [2, 3] at 1 and proposes what follows.
  CHECK(Make(2, 2, 4).Propose(Tokens{1, 2, 3, 4, 2, 3}) == Tokens{4, 2, 3});
  CHECK(Make(2, 2, 2).Propose(Tokens{1, 2, 3, 4, 1, 2, 3}) == Tokens{4, 1});
  // The longest suffix wins over an earlier shorter match: [7, 8, 9] recurs at 2 (followed by
  // 5), while the one-token suffix [9] occurs first at 0 (followed by 6).
  CHECK(Make(1, 3, 1).Propose(Tokens{9, 6, 7, 8, 9, 5, 7, 8, 9}) == Tokens{5});
  // Among equally long matches, the earliest.
  CHECK(Make(2, 2, 1).Propose(Tokens{1, 2, 10, 1, 2, 20, 1, 2}) == Tokens{10});
  // Nothing recurs, or the context is too short for min_n.
  CHECK(Make(1, 4, 4).Propose(Tokens{1, 2, 3, 4, 5}).empty());
  CHECK(Make(3, 4, 4).Propose(Tokens{1, 2, 1, 2}).empty());
  CHECK(Make(1, 4, 4).Propose(Tokens{}).empty());
  CHECK(Make(1, 4, 4).Propose(Tokens{7}).empty());
  // A repeated token: the match may overlap the suffix; k bounds the draft.
  CHECK(Make(1, 2, 3).Propose(Tokens{5, 5, 5, 5, 5}) == Tokens{5, 5, 5});
  // max_tokens in place of k; none asked, none given.
  CHECK(Make(2, 2, 1).Propose(Tokens{1, 2, 3, 4, 1, 2}, 3) == Tokens{3, 4, 1});
  CHECK(Make(2, 2, 1).Propose(Tokens{1, 2, 3, 4, 1, 2}, 0).empty());
}

TEST_CASE("n-gram proposer matches the brute-force rule on random contexts", "[speculative]") {
  std::mt19937 rng(11);
  int proposed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    // Short contexts over small alphabets (many matches), and long ones (late and long matches).
    const int len = static_cast<int>(rng() % (trial % 3 == 0 ? 400 : 40));
    const int alphabet = 2 + static_cast<int>(rng() % (trial % 3 == 0 ? 30 : 6));
    Tokens c(len);
    for (int32_t& t : c) t = static_cast<int32_t>(rng() % alphabet);
    const int min_n = 1 + static_cast<int>(rng() % 3);
    const int max_n = min_n + static_cast<int>(rng() % 6);
    const int k = 1 + static_cast<int>(rng() % 5);
    const NgramProposer proposer = Make(min_n, max_n, k);
    const Tokens got = proposer.Propose(c);
    INFO("trial " << trial);
    CHECK(got == BruteForce(c, min_n, max_n, k));
    // A late proposal asks for k + 1 tokens of the same match.
    CHECK(proposer.Propose(c, k + 1) == BruteForce(c, min_n, max_n, k + 1));
    proposed += got.empty() ? 0 : 1;
  }
  CHECK(proposed > 1000);  // the comparison is not all empty drafts
}

TEST_CASE("n-gram proposer refuses bad lengths by name", "[speculative]") {
  CHECK(NgramProposer::Create({0, 2, 1}).status().message().find("min_n") != std::string::npos);
  CHECK(!NgramProposer::Create({3, 2, 1}).ok());
  CHECK(NgramProposer::Create({1, 2, 0}).status().message().find("draft tokens") !=
        std::string::npos);
}

}  // namespace
}  // namespace llm
