// Tests for the KV block allocator: allocation, all-or-nothing failure, refcounts, FIFO reuse,
// and a randomized comparison against a shadow model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "kvcache/block_allocator.h"

namespace llm {
namespace {

TEST_CASE("BlockAllocator starts with every block free", "[block_allocator]") {
  BlockAllocator a(8);
  CHECK(a.num_blocks() == 8);
  CHECK(a.num_free() == 8);
  CHECK(a.num_used() == 0);
  for (int b = 0; b < 8; ++b) CHECK(a.ref_count(b) == 0);
}

TEST_CASE("BlockAllocator Allocate appends fresh blocks and Release frees them",
          "[block_allocator]") {
  BlockAllocator a(8);
  std::vector<int32_t> out = {99};  // existing content must be kept
  REQUIRE(a.Allocate(3, &out).ok());
  REQUIRE(out.size() == 4);
  CHECK(out[0] == 99);
  const std::vector<int32_t> got(out.begin() + 1, out.end());
  CHECK(got == std::vector<int32_t>{0, 1, 2});
  CHECK(a.num_free() == 5);
  CHECK(a.num_used() == 3);
  for (int32_t b : got) CHECK(a.ref_count(b) == 1);

  REQUIRE(a.Allocate(0, &out).ok());
  CHECK(out.size() == 4);
  CHECK(a.num_free() == 5);

  a.Release(got);
  CHECK(a.num_free() == 8);
  CHECK(a.num_used() == 0);
  for (int32_t b : got) CHECK(a.ref_count(b) == 0);
}

TEST_CASE("BlockAllocator failure is all-or-nothing", "[block_allocator]") {
  BlockAllocator a(4);
  std::vector<int32_t> first;
  REQUIRE(a.Allocate(3, &first).ok());

  std::vector<int32_t> out = {7, 8};
  const Status st = a.Allocate(2, &out);
  CHECK(st.code() == StatusCode::kResourceExhausted);
  CHECK_FALSE(st.message().empty());
  CHECK(out == std::vector<int32_t>{7, 8});  // nothing appended
  CHECK(a.num_free() == 1);                  // nothing taken
  CHECK(a.ref_count(3) == 0);

  // The one remaining block is still allocatable, so the failed call took nothing.
  std::vector<int32_t> last;
  REQUIRE(a.Allocate(1, &last).ok());
  CHECK(last == std::vector<int32_t>{3});
  CHECK(a.num_free() == 0);
  CHECK(a.Allocate(1, &last).code() == StatusCode::kResourceExhausted);
  CHECK(last.size() == 1);
}

TEST_CASE("BlockAllocator refcount sharing: Ref then two Releases", "[block_allocator]") {
  BlockAllocator a(4);
  std::vector<int32_t> blocks;
  REQUIRE(a.Allocate(1, &blocks).ok());
  const int32_t b = blocks[0];
  a.Ref(b);
  CHECK(a.ref_count(b) == 2);
  CHECK(a.num_free() == 3);

  a.Release({b});
  CHECK(a.ref_count(b) == 1);
  CHECK(a.num_free() == 3);  // still referenced: not back on the free list

  // While still referenced, fresh allocations must not hand it out.
  std::vector<int32_t> others;
  REQUIRE(a.Allocate(3, &others).ok());
  CHECK(std::find(others.begin(), others.end(), b) == others.end());
  a.Release(others);

  a.Release({b});
  CHECK(a.ref_count(b) == 0);
  CHECK(a.num_free() == 4);
}

TEST_CASE("BlockAllocator reuses released blocks in FIFO order", "[block_allocator]") {
  SECTION("pool fully used, then released in a chosen order") {
    BlockAllocator a(4);
    std::vector<int32_t> all;
    REQUIRE(a.Allocate(4, &all).ok());
    CHECK(all == std::vector<int32_t>{0, 1, 2, 3});
    a.Release({2});
    a.Release({0});
    a.Release({3});
    std::vector<int32_t> again;
    REQUIRE(a.Allocate(3, &again).ok());
    CHECK(again == std::vector<int32_t>{2, 0, 3});
  }
  SECTION("released blocks queue behind never-used ones") {
    BlockAllocator a(4);
    std::vector<int32_t> two;
    REQUIRE(a.Allocate(2, &two).ok());
    a.Release({1, 0});
    std::vector<int32_t> all;
    REQUIRE(a.Allocate(4, &all).ok());
    CHECK(all == std::vector<int32_t>{2, 3, 1, 0});
  }
}

TEST_CASE("BlockAllocator Acquire revives a free block or shares a used one", "[block_allocator]") {
  BlockAllocator a(4);
  std::vector<int32_t> blocks;
  REQUIRE(a.Allocate(3, &blocks).ok());  // 0, 1, 2
  a.Release({1});
  CHECK(a.is_free(1));
  CHECK(a.num_free() == 2);

  // Acquire of a free block takes it off the free list (from the middle of it here: 3, 1).
  a.Acquire(1);
  CHECK_FALSE(a.is_free(1));
  CHECK(a.ref_count(1) == 1);
  CHECK(a.num_free() == 1);
  std::vector<int32_t> more;
  REQUIRE(a.Allocate(1, &more).ok());
  CHECK(more == std::vector<int32_t>{3});
  CHECK(a.Allocate(1, &more).code() == StatusCode::kResourceExhausted);

  // Acquire of a used block adds a reference.
  a.Acquire(0);
  CHECK(a.ref_count(0) == 2);
  a.Release({0, 0, 1, 2, 3});
  CHECK(a.num_free() == 4);
  for (int b = 0; b < 4; ++b) CHECK(a.is_free(b));
}

TEST_CASE("BlockAllocator eviction hook sees a reused block before it is handed out",
          "[block_allocator]") {
  BlockAllocator a(3);
  std::vector<std::pair<int32_t, int>> hooked;  // (block, its ref count when hooked)
  a.set_eviction_hook([&](int32_t b) { hooked.emplace_back(b, a.ref_count(b)); });
  std::vector<int32_t> blocks;
  REQUIRE(a.Allocate(3, &blocks).ok());
  a.Release({2, 0});
  hooked.clear();
  std::vector<int32_t> again;
  REQUIRE(a.Allocate(2, &again).ok());
  CHECK(again == std::vector<int32_t>{2, 0});
  // Both reused blocks were reported, while still unreferenced.
  CHECK(std::count(hooked.begin(), hooked.end(), std::make_pair(int32_t{2}, 0)) == 1);
  CHECK(std::count(hooked.begin(), hooked.end(), std::make_pair(int32_t{0}, 0)) == 1);

  // A failed allocation reports nothing.
  hooked.clear();
  CHECK_FALSE(a.Allocate(2, &again).ok());
  CHECK(hooked.empty());
  // Acquire (a cache hit) is not an eviction.
  a.Release({2});
  a.Acquire(2);
  CHECK(hooked.empty());
}

TEST_CASE("BlocksForTokens rounds up", "[block_allocator]") {
  CHECK(BlocksForTokens(0, 16) == 0);
  CHECK(BlocksForTokens(1, 16) == 1);
  CHECK(BlocksForTokens(16, 16) == 1);
  CHECK(BlocksForTokens(17, 16) == 2);
  CHECK(BlocksForTokens(64, 64) == 1);
  CHECK(BlocksForTokens(130, 64) == 3);
  CHECK(BlocksForTokens(5, 1) == 5);
}

TEST_CASE("BlockAllocator randomized against a shadow model", "[block_allocator]") {
  constexpr int kBlocks = 32;
  BlockAllocator a(kBlocks);
  std::mt19937 rng(20240607);

  // Shadow: per-block refcount and a FIFO free list.
  std::vector<int> refs(kBlocks, 0);
  std::deque<int32_t> free_list;
  for (int i = 0; i < kBlocks; ++i) free_list.push_back(i);
  // One entry per reference held by the test.
  std::vector<int32_t> held;

  int num_allocs = 0, num_failures = 0, num_refs = 0, num_releases = 0, num_revives = 0;
  for (int op = 0; op < 10000; ++op) {
    const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
    if (kind < 4) {
      const int n = std::uniform_int_distribution<int>(0, 6)(rng);
      std::vector<int32_t> out;
      const Status st = a.Allocate(n, &out);
      if (n > static_cast<int>(free_list.size())) {
        REQUIRE(st.code() == StatusCode::kResourceExhausted);
        REQUIRE(out.empty());
        ++num_failures;
      } else {
        REQUIRE(st.ok());
        REQUIRE(static_cast<int>(out.size()) == n);
        for (int32_t b : out) {
          REQUIRE(b >= 0);
          REQUIRE(b < kBlocks);
          // Never handed out while referenced.
          REQUIRE(refs[b] == 0);
          // FIFO: the shadow's free-list front.
          REQUIRE(b == free_list.front());
          free_list.pop_front();
          refs[b] = 1;
          held.push_back(b);
        }
        ++num_allocs;
      }
    } else if (kind < 5) {
      if (held.empty()) continue;
      const int32_t b = held[std::uniform_int_distribution<size_t>(0, held.size() - 1)(rng)];
      a.Ref(b);
      ++refs[b];
      held.push_back(b);
      ++num_refs;
    } else if (kind < 6) {
      // Acquire any block: a free one leaves the free list from wherever it is.
      const int32_t b = std::uniform_int_distribution<int32_t>(0, kBlocks - 1)(rng);
      a.Acquire(b);
      if (refs[b] == 0) {
        free_list.erase(std::find(free_list.begin(), free_list.end(), b));
        ++num_revives;
      }
      ++refs[b];
      held.push_back(b);
    } else {
      if (held.empty()) continue;
      // Release a random batch of up to 4 distinct held references.
      const int k = std::uniform_int_distribution<int>(1, 4)(rng);
      std::vector<int32_t> batch;
      for (int j = 0; j < k && !held.empty(); ++j) {
        const size_t idx = std::uniform_int_distribution<size_t>(0, held.size() - 1)(rng);
        batch.push_back(held[idx]);
        held[idx] = held.back();
        held.pop_back();
      }
      a.Release(batch);
      for (int32_t b : batch) {
        if (--refs[b] == 0) free_list.push_back(b);
      }
      ++num_releases;
    }
    REQUIRE(a.num_free() == static_cast<int>(free_list.size()));
    REQUIRE(a.num_used() == kBlocks - static_cast<int>(free_list.size()));
    if (op % 97 == 0) {
      for (int b = 0; b < kBlocks; ++b) {
        REQUIRE(a.ref_count(b) == refs[b]);
        REQUIRE(a.is_free(b) == (refs[b] == 0));
      }
    }
  }
  // The run exercised every path.
  CHECK(num_allocs > 100);
  CHECK(num_failures > 10);
  CHECK(num_refs > 100);
  CHECK(num_releases > 100);
  CHECK(num_revives > 50);

  a.Release(held);
  CHECK(a.num_free() == kBlocks);
  for (int b = 0; b < kBlocks; ++b) CHECK(a.ref_count(b) == 0);
}

}  // namespace
}  // namespace llm
