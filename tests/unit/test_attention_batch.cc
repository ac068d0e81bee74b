// CheckAttentionBatch: a well-formed batch passes, and each way a scheduler bug could corrupt a
// block table or index array is reported instead of reaching a kernel.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_backend.h"

namespace llm {
namespace {

// A random mixed batch: prefill chunks and decodes of 1..4 tokens, pages from a shuffled pool.
AttentionBatch RandomBatch(std::mt19937& rng, int bs, int num_blocks) {
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  AttentionBatch b;
  b.q_indptr = {0};
  b.page_indptr = {0};
  size_t next = 0;
  for (int s = 0; s < 6; ++s) {
    const int kv = 1 + static_cast<int>(rng() % 300);
    const int q = s % 2 == 0 ? 1 + static_cast<int>(rng() % std::min(kv, 4)) : kv;
    const int pages = (kv + bs - 1) / bs;
    const size_t first = b.page_indices.size();
    for (int i = 0; i < pages; ++i) b.page_indices.push_back(pool[next++]);
    for (int p = kv - q; p < kv; ++p) {
      b.slot_mapping.push_back(b.page_indices[first + p / bs] * bs + p % bs);
    }
    b.q_indptr.push_back(b.q_indptr.back() + q);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.kv_lens.push_back(kv);
  }
  b.num_seqs = 6;
  b.num_tokens = b.q_indptr.back();
  return b;
}

TEST_CASE("CheckAttentionBatch accepts well-formed batches and names what is malformed",
          "[attention]") {
  std::mt19937 rng(std::random_device{}());
  constexpr int kBs = 16, kBlocks = 200;
  const AttentionBatch good = RandomBatch(rng, kBs, kBlocks);
  REQUIRE(CheckAttentionBatch(good, kBs, kBlocks).ok());
  REQUIRE(CheckAttentionBatch(AttentionBatch{{}, {}, {0}, {}, {0}, {}, {}}, kBs, kBlocks).ok());

  struct Corruption {
    const char* name;
    std::function<void(AttentionBatch&)> apply;
    const char* message;  // a fragment the status must contain
  };
  const std::vector<Corruption> cases = {
      {"page id past the cache", [](AttentionBatch& b) { b.page_indices[3] = kBlocks; },
       "outside the cache"},
      {"page id below -1", [](AttentionBatch& b) { b.page_indices[0] = -2; }, "page -2"},
      {"slot below -1", [](AttentionBatch& b) { b.slot_mapping[1] = -2; }, "slot -2"},
      {"page_indptr past the page list", [](AttentionBatch& b) { b.page_indptr.back() += 1; },
       "page indices"},
      {"too few pages for kv_len", [](AttentionBatch& b) { b.kv_lens[1] += kBs * 40; }, "pages of"},
      {"more new tokens than kv_len", [](AttentionBatch& b) { b.kv_lens[0] = 0; }, "kv_len 0"},
      {"slot past the cache", [](AttentionBatch& b) { b.slot_mapping[0] = kBlocks * kBs; }, "slot"},
      {"num_tokens disagrees with q_indptr", [](AttentionBatch& b) { b.num_tokens += 1; },
       "num_tokens"},
      {"missing kv_lens entry", [](AttentionBatch& b) { b.kv_lens.pop_back(); }, "kv_lens"},
      {"q_indptr not from 0", [](AttentionBatch& b) { b.q_indptr[0] = 1; }, "start at 0"},
      {"decreasing page_indptr",
       [](AttentionBatch& b) { std::swap(b.page_indptr[2], b.page_indptr[3]); }, "decreases"},
  };
  for (const Corruption& c : cases) {
    INFO(c.name);
    AttentionBatch bad = good;
    c.apply(bad);
    const Status s = CheckAttentionBatch(bad, kBs, kBlocks);
    REQUIRE_FALSE(s.ok());
    CHECK(s.ToString().find(c.message) != std::string::npos);
  }
  // Slot -1 appends nothing (a graph bucket's padding row), page -1 is a block freed left of every
  // sliding window: both allowed.
  AttentionBatch padded = good;
  padded.slot_mapping.back() = -1;
  padded.page_indices[0] = -1;
  CHECK(CheckAttentionBatch(padded, kBs, kBlocks).ok());
  // The same batch over a cache one block smaller than its largest page id is rejected.
  const int max_page = *std::max_element(good.page_indices.begin(), good.page_indices.end());
  CHECK_FALSE(CheckAttentionBatch(good, kBs, max_page).ok());
  CHECK(CheckAttentionBatch(good, kBs, max_page + 1).ok());
}

}  // namespace
}  // namespace llm
