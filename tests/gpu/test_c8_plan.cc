// BuildC8Plan's invariants on random batches (host only: runs in CI without a GPU, see
// gpu_main.cc). The GPU tests check the kernels that consume a plan; these check the plan itself:
// every query row covered once, split chunks contiguous and merged exactly once, the per-item
// sequence fields (block-table base, causal position) equal to the batch's, and the limits the
// fused merge and the graph grids rely on.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/c8/c8_kernel_args.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

struct PlanCase {
  AttentionBatch batch;
  C8Shape shape;
  C8PlanConfig config;
  int decode_tiles = 0;  // what a graph bucket's grid must hold at least (max_decode_items)
};

PlanCase RandomCase(std::mt19937& rng) {
  PlanCase c;
  const int groups[] = {1, 4, 8};
  const int group = groups[rng() % 3];
  c.shape.num_kv_heads = 1 + static_cast<int>(rng() % 8);
  c.shape.num_q_heads = c.shape.num_kv_heads * group;
  c.shape.block_size = (rng() % 2) ? 16 : 64;
  c.config.num_sms = 132;
  c.config.ctas_per_sm = 1 + static_cast<int>(rng() % 3);
  c.config.force_split = rng() % 5 == 0;
  const bool decode_only = rng() % 2 == 0;
  AttentionBatch& b = c.batch;
  b.num_seqs = 1 + static_cast<int>(rng() % 40);
  b.q_indptr = {0};
  b.page_indptr = {0};
  for (int s = 0; s < b.num_seqs; ++s) {
    // Decode rows: 1..4 query tokens (as many as fit 16 rows); else sometimes a prefill chunk.
    const int max_decode = std::max(1, 16 / group);
    int q_len = 1 + static_cast<int>(rng() % std::min(4, max_decode));
    if (!decode_only && rng() % 3 == 0) q_len = 1 + static_cast<int>(rng() % 300);
    const int kv_len = q_len + static_cast<int>(rng() % (rng() % 4 == 0 ? 20000 : 700));
    b.q_indptr.push_back(b.q_indptr.back() + q_len);
    b.kv_lens.push_back(kv_len);
    const int pages = (kv_len + c.shape.block_size - 1) / c.shape.block_size;
    for (int p = 0; p < pages; ++p) b.page_indices.push_back(static_cast<int32_t>(rng() % 100000));
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
  }
  b.num_tokens = b.q_indptr.back();
  if (decode_only && !c.config.force_split && rng() % 2 == 0) {
    c.config.max_decode_items = b.num_seqs + static_cast<int>(rng() % 200);  // a graph bucket
  }
  return c;
}

// The sequence whose query rows hold flattened row `row`.
int SeqOfRow(const AttentionBatch& b, int row) {
  const auto it = std::upper_bound(b.q_indptr.begin(), b.q_indptr.end(), row);
  return static_cast<int>(it - b.q_indptr.begin()) - 1;
}

// Every query row of c's batch covered once by `plan`, its items consistent with the batch, its
// split tiles contiguous and merged once, a graph bucket's item bound kept.
void CheckPlan(const PlanCase& c, const C8Plan& plan) {
  const AttentionBatch& b = c.batch;
  const int group = c.shape.num_q_heads / c.shape.num_kv_heads;
  INFO("seqs " << b.num_seqs << " group " << group << " bs " << c.shape.block_size
               << " force_split " << c.config.force_split << " max_decode_items "
               << c.config.max_decode_items);

  std::vector<int> covered(b.num_tokens, 0);
  std::vector<int> merge_seen(plan.merges.size(), 0);
  std::vector<int> partial_seen(plan.num_partials, 0);
  for (int kind = 0; kind < 2; ++kind) {
    const auto& items = kind == 0 ? plan.decode_items : plan.prefill_items;
    const int rows_cap = kind == 0 ? detail::kDecodeRows : detail::kPartialRows;
    for (const C8WorkItem& it : items) {
      REQUIRE(it.q_len > 0);
      const int s = SeqOfRow(b, it.q_start);
      REQUIRE(s >= 0);
      REQUIRE(s < b.num_seqs);
      const int seq_q_begin = b.q_indptr[s], seq_q_len = b.q_indptr[s + 1] - seq_q_begin;
      REQUIRE(it.q_start + it.q_len <= b.q_indptr[s + 1]);  // one sequence per tile
      CHECK(it.q_len * group <= rows_cap);
      CHECK(it.page_base == b.page_indptr[s]);
      CHECK(it.q_pos0 == b.kv_lens[s] - seq_q_len + (it.q_start - seq_q_begin));
      const int causal_end = it.q_pos0 + it.q_len;  // the tile's last query sees keys < this
      REQUIRE(0 <= it.kv_start);
      REQUIRE(it.kv_start < it.kv_end);
      CHECK(it.kv_end <= causal_end);
      CHECK(it.kv_start % 64 == 0);  // page-aligned tiles: the kernel's copy mapping needs it
      if (it.partial < 0) {
        CHECK(it.merge == -1);
        CHECK(it.kv_start == 0);
        CHECK(it.kv_end == causal_end);
        for (int r = it.q_start; r < it.q_start + it.q_len; ++r) ++covered[r];
        continue;
      }
      REQUIRE(it.merge >= 0);
      REQUIRE(it.merge < static_cast<int>(plan.merges.size()));
      const C8MergeItem& m = plan.merges[it.merge];
      CHECK(m.q_start == it.q_start);
      CHECK(m.q_len == it.q_len);
      REQUIRE(it.partial >= m.first_partial);
      REQUIRE(it.partial < m.first_partial + m.num_partials);
      ++partial_seen[it.partial];
      ++merge_seen[it.merge];
    }
  }
  // Each split tile: chunk i of n is partial first_partial + i, contiguous, ending at the
  // causal end; at most kMaxSplits chunks (the merging CTA's weight array).
  std::vector<std::vector<const C8WorkItem*>> chunks(plan.merges.size());
  for (const auto* items : {&plan.decode_items, &plan.prefill_items}) {
    for (const C8WorkItem& it : *items) {
      if (it.merge >= 0) chunks[it.merge].push_back(&it);
    }
  }
  for (size_t mi = 0; mi < plan.merges.size(); ++mi) {
    const C8MergeItem& m = plan.merges[mi];
    INFO("merge " << mi);
    CHECK(m.num_partials >= 2);
    CHECK(m.num_partials <= detail::kMaxSplits);
    REQUIRE(merge_seen[mi] == m.num_partials);
    std::sort(chunks[mi].begin(), chunks[mi].end(),
              [](const C8WorkItem* x, const C8WorkItem* y) { return x->partial < y->partial; });
    int expect_start = 0;
    for (int i = 0; i < m.num_partials; ++i) {
      CHECK(chunks[mi][i]->partial == m.first_partial + i);
      CHECK(chunks[mi][i]->kv_start == expect_start);
      expect_start = chunks[mi][i]->kv_end;
    }
    CHECK(expect_start == chunks[mi][0]->q_pos0 + m.q_len);
    for (int r = m.q_start; r < m.q_start + m.q_len; ++r) ++covered[r];
  }
  for (int p = 0; p < plan.num_partials; ++p) CHECK(partial_seen[p] == 1);
  for (int r = 0; r < b.num_tokens; ++r) {
    INFO("row " << r);
    CHECK(covered[r] == 1);
  }
  if (c.config.max_decode_items > 0) {
    CHECK(static_cast<int>(plan.decode_items.size()) <=
          std::max(c.config.max_decode_items, std::max(c.decode_tiles, b.num_seqs)));
  }
}

TEST_CASE("C8 plan: random batches cover every query row once with consistent items",
          "[host][c8]") {
  GPU_TEST_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    INFO("iter " << iter);
    const PlanCase c = RandomCase(rng);
    CheckPlan(c, BuildC8Plan(c.shape, c.batch, c.config));
  }
}

// A graph step of q = 1..5 rows per sequence (1 + K, C8PlanConfig::decode_query_len = q): every
// row on decode tiles, several per sequence where q x GQA group exceeds one tile's 16 rows, within
// the bucket's item bound; the same batch planned eagerly puts such sequences on prefill tiles.
TEST_CASE("C8 plan: graph verify steps put every row on decode tiles", "[host][c8]") {
  GPU_TEST_RNG(rng);
  for (int iter = 0; iter < 300; ++iter) {
    PlanCase c;
    const int groups[] = {1, 2, 4, 8};
    const int group = groups[rng() % 4];
    const int q = 1 + static_cast<int>(rng() % 5);
    c.shape.num_kv_heads = 1 + static_cast<int>(rng() % 8);
    c.shape.num_q_heads = c.shape.num_kv_heads * group;
    c.shape.block_size = (rng() % 2) ? 16 : 64;
    c.config.num_sms = 132;
    c.config.ctas_per_sm = 1 + static_cast<int>(rng() % 3);
    c.config.force_split = rng() % 5 == 0;
    c.config.decode_query_len = q;
    const int tile_tokens = 16 / group;
    AttentionBatch& b = c.batch;
    b.num_seqs = 1 + static_cast<int>(rng() % 40);
    b.q_indptr = {0};
    b.page_indptr = {0};
    for (int s = 0; s < b.num_seqs; ++s) {
      const int kv_len = q + static_cast<int>(rng() % (rng() % 4 == 0 ? 20000 : 700));
      b.q_indptr.push_back(b.q_indptr.back() + q);
      b.kv_lens.push_back(kv_len);
      const int pages = (kv_len + c.shape.block_size - 1) / c.shape.block_size;
      for (int p = 0; p < pages; ++p)
        b.page_indices.push_back(static_cast<int32_t>(rng() % 100000));
      b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    }
    b.num_tokens = b.q_indptr.back();
    c.decode_tiles = b.num_seqs * ((q + tile_tokens - 1) / tile_tokens);
    if (!c.config.force_split) {
      c.config.max_decode_items = c.decode_tiles + static_cast<int>(rng() % 200);
    }
    INFO("iter " << iter << " q " << q << " group " << group);
    const C8Plan plan = BuildC8Plan(c.shape, b, c.config);
    CHECK(plan.prefill_items.empty());
    CHECK(plan.decode_rows == std::min(q, tile_tokens) * group);
    CheckPlan(c, plan);
    C8PlanConfig eager = c.config;
    eager.decode_query_len = 0;
    eager.max_decode_items = 0;
    CHECK(BuildC8Plan(c.shape, b, eager).prefill_items.empty() == (q <= tile_tokens));
  }
}

// n sequences of kv tokens, one query token each.
AttentionBatch DecodeBatch(int n, int kv) {
  AttentionBatch b;
  b.num_seqs = n;
  b.q_indptr = {0};
  b.page_indptr = {0};
  for (int s = 0; s < n; ++s) {
    b.q_indptr.push_back(s + 1);
    b.kv_lens.push_back(kv);
    for (int p = 0; p < (kv + 63) / 64; ++p) b.page_indices.push_back(s * 1000 + p);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
  }
  b.num_tokens = n;
  return b;
}

// The plan for n x kv decode with Llama-3-8B heads (32 q / 8 kv) on a 132-SM grid, the size of
// the GPU machine the planner's costs were fitted on.
C8Plan Plan132Sms(CacheType cache, int n, int kv, C8PlanConfig config) {
  C8Shape shape;
  shape.num_q_heads = 32;
  shape.num_kv_heads = 8;
  shape.cache = cache;
  config.num_sms = 132;
  return BuildC8Plan(shape, DecodeBatch(n, kv), config);
}

// Splits per sequence the planner chooses for n x kv decode on a 132-SM grid.
int Splits(CacheType cache, int n, int kv, int ctas_per_sm) {
  C8PlanConfig config;
  config.ctas_per_sm = ctas_per_sm;
  return static_cast<int>(Plan132Sms(cache, n, kv, config).decode_items.size()) / n;
}

// The split choices behind the timings in docs/BENCHMARKS.md: a batch that already fills several
// waves of CTAs runs whole (a split only adds a merge), a 1.3-wave grid is split into about three,
// and a lone sequence is spread over the GPU in 16 chunks (more chunks make the final merge cost
// more than they save).
TEST_CASE("C8 plan: the split cost model keeps full batches whole and spreads small ones",
          "[host][c8]") {
  CHECK(Splits(CacheType::kInt8, 256, 1500, 3) == 1);
  CHECK(Splits(CacheType::kInt8, 256, 1500, 2) == 1);
  CHECK(Splits(CacheType::kInt8, 64, 4096, 3) == 3);
  CHECK(Splits(CacheType::kBf16, 64, 4096, 3) == 3);
  CHECK(Splits(CacheType::kBf16, 32, 16384, 3) == 3);
  CHECK(Splits(CacheType::kBf16, 1, 4096, 3) == 16);  // 256-token chunks: 128 CTAs
  CHECK(Splits(CacheType::kInt8, 1, 4096, 3) == 16);
}

// The ring depth the planner picks on sm_90 occupancies (3, 2 and 1 CTAs per SM for 2, 3 and 4
// stages), with the items it plans for that ring: the choices behind c8_attention_bench
// --stage-sweep 1.
C8Plan RingPlan(CacheType cache, int n, int kv) {
  C8PlanConfig config;
  config.ctas_per_sm = cache == CacheType::kBf16 ? 2 : 3;  // the cache type's default ring
  config.ring_ctas_per_sm[2] = 3;
  config.ring_ctas_per_sm[3] = 2;
  config.ring_ctas_per_sm[4] = 1;
  return Plan132Sms(cache, n, kv, config);
}

TEST_CASE("C8 plan: the decode ring depth follows the grid", "[host][c8]") {
  // One wave at one CTA per SM, chunks of >= 4 tiles: 4 stages.
  C8Plan p = RingPlan(CacheType::kBf16, 1, 4096);
  CHECK(p.decode_stages == 4);
  CHECK(p.decode_items.size() * 8 <= 132);
  p = RingPlan(CacheType::kBf16, 8, 4096);
  CHECK(p.decode_stages == 4);
  CHECK(p.decode_items.size() * 8 <= 132);
  // int8 chunks of 256 tokens are two 128-token tiles: no use for a deeper ring.
  CHECK(RingPlan(CacheType::kInt8, 1, 4096).decode_stages != 4);
  // Long chunks: 3 stages; short ones: 2 stages at 3 CTAs per SM.
  p = RingPlan(CacheType::kInt8, 64, 4096);
  CHECK(p.decode_stages == 3);
  CHECK(p.decode_items.size() == 64);
  CHECK(RingPlan(CacheType::kBf16, 64, 4096).decode_stages == 3);
  CHECK(RingPlan(CacheType::kBf16, 32, 16384).decode_stages == 3);
  CHECK(RingPlan(CacheType::kInt8, 256, 1500).decode_stages == 2);
  // Without occupancies the cache type's default ring runs; a forced depth is kept.
  CHECK(Splits(CacheType::kBf16, 1, 4096, 2) > 1);
  C8PlanConfig config;
  CHECK(Plan132Sms(CacheType::kBf16, 4, 4096, config).decode_stages == 0);
  config.decode_stages = 2;
  config.ring_ctas_per_sm[4] = 1;
  CHECK(Plan132Sms(CacheType::kBf16, 4, 4096, config).decode_stages == 2);
}

// ---- Pinned plans: BuildC8Plan's choices on a table of decode shapes and, digested, on a wider
// sweep and on random batches, as the planner produced them before it moved onto the shared
// split-KV search (kernels/split_kv.h). A change to the split rule must change these on purpose.

// FNV-1a over every field of a plan: any change to the items, merges or counts changes it.
uint64_t PlanDigest(const C8Plan& p, uint64_t h = 1469598103934665603ull) {
  auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto* items : {&p.decode_items, &p.prefill_items}) {
    mix(static_cast<int64_t>(items->size()));
    for (const C8WorkItem& w : *items) {
      for (int64_t v :
           {w.q_start, w.q_len, w.kv_start, w.kv_end, w.partial, w.merge, w.page_base, w.q_pos0}) {
        mix(v);
      }
    }
  }
  mix(static_cast<int64_t>(p.merges.size()));
  for (const C8MergeItem& m : p.merges) {
    for (int64_t v : {m.q_start, m.q_len, m.first_partial, m.num_partials}) mix(v);
  }
  for (int64_t v : {p.num_partials, p.decode_tile_tokens, p.decode_stages, p.decode_rows,
                    p.prefill_tile_tokens}) {
    mix(v);
  }
  return h;
}

// One pinned decode shape: n sequences of kv tokens, Llama-3-8B heads (32 q / 8 kv), 132 SMs, at
// occupancy 0 (3 CTAs per SM, no ring choice), 1 (2 per SM), 2 (sm_90's ring occupancies: 3, 2
// and 1 CTAs per SM for 2, 3 and 4 stages) or 3 (1 per SM).
struct PinRow {
  CacheType cache;
  int n, kv, occupancy;
  int stages, decode_items, merges, partials;  // the plan's
};

C8PlanConfig PinConfig(CacheType cache, int occupancy) {
  C8PlanConfig config;
  config.num_sms = 132;
  config.ctas_per_sm = occupancy == 0 ? 3 : occupancy == 1 ? 2 : 1;
  if (occupancy == 2) {
    config.ctas_per_sm = cache == CacheType::kBf16 ? 2 : 3;
    config.ring_ctas_per_sm[2] = 3;
    config.ring_ctas_per_sm[3] = 2;
    config.ring_ctas_per_sm[4] = 1;
  }
  return config;
}

C8Plan PinPlan(CacheType cache, int n, int kv, int occupancy, int q_heads = 32,
               int graph_items = 0) {
  C8Shape shape;
  shape.num_q_heads = q_heads;
  shape.num_kv_heads = 8;
  shape.cache = cache;
  C8PlanConfig config = PinConfig(cache, occupancy);
  config.max_decode_items = graph_items;
  return BuildC8Plan(shape, DecodeBatch(n, kv), config);
}

// Every plan of a wider sweep (three cache types, GQA groups 4 and 8, graph buckets), digested.
uint64_t SweepDigest() {
  uint64_t h = 1469598103934665603ull;
  for (CacheType cache : {CacheType::kBf16, CacheType::kInt8, CacheType::kFp8E4M3}) {
    for (int n : {1, 3, 8, 21, 64, 256}) {
      for (int kv : {100, 1500, 4096, 16384, 65536}) {
        for (int occupancy : {0, 2, 3}) {
          for (int q_heads : {32, 64}) {
            for (int graph_items : {0, n + 8}) {
              h = PlanDigest(PinPlan(cache, n, kv, occupancy, q_heads, graph_items), h);
            }
          }
        }
      }
    }
  }
  return h;
}

TEST_CASE("C8 plan: pinned decode plans", "[host][c8]") {
  const PinRow rows[] = {
      {CacheType::kBf16, 1, 1500, 0, 0, 12, 1, 12},
      {CacheType::kBf16, 1, 1500, 2, 2, 12, 1, 12},
      {CacheType::kBf16, 1, 4096, 0, 0, 16, 1, 16},
      {CacheType::kBf16, 1, 4096, 2, 4, 16, 1, 16},
      {CacheType::kBf16, 1, 16384, 0, 0, 32, 1, 32},
      {CacheType::kBf16, 1, 16384, 2, 4, 16, 1, 16},
      {CacheType::kBf16, 8, 1500, 0, 0, 48, 8, 48},
      {CacheType::kBf16, 8, 1500, 2, 4, 16, 8, 16},
      {CacheType::kBf16, 8, 4096, 0, 0, 48, 8, 48},
      {CacheType::kBf16, 8, 4096, 2, 4, 16, 8, 16},
      {CacheType::kBf16, 8, 16384, 0, 0, 48, 8, 48},
      {CacheType::kBf16, 8, 16384, 2, 4, 16, 8, 16},
      {CacheType::kBf16, 64, 1500, 0, 0, 192, 64, 192},
      {CacheType::kBf16, 64, 1500, 2, 3, 64, 0, 0},
      {CacheType::kBf16, 64, 4096, 0, 0, 192, 64, 192},
      {CacheType::kBf16, 64, 4096, 2, 3, 64, 0, 0},
      {CacheType::kBf16, 64, 16384, 0, 0, 192, 64, 192},
      {CacheType::kBf16, 64, 16384, 2, 3, 64, 0, 0},
      {CacheType::kBf16, 256, 1500, 0, 0, 256, 0, 0},
      {CacheType::kBf16, 256, 1500, 2, 3, 256, 0, 0},
      {CacheType::kBf16, 256, 4096, 0, 0, 768, 256, 768},
      {CacheType::kBf16, 256, 4096, 2, 3, 256, 0, 0},
      {CacheType::kBf16, 256, 16384, 0, 0, 1280, 256, 1280},
      {CacheType::kBf16, 256, 16384, 2, 3, 256, 0, 0},
      {CacheType::kInt8, 1, 1500, 0, 0, 6, 1, 6},
      {CacheType::kInt8, 1, 1500, 2, 2, 6, 1, 6},
      {CacheType::kInt8, 1, 4096, 0, 0, 16, 1, 16},
      {CacheType::kInt8, 1, 4096, 2, 2, 16, 1, 16},
      {CacheType::kInt8, 1, 16384, 0, 0, 26, 1, 26},
      {CacheType::kInt8, 1, 16384, 2, 4, 16, 1, 16},
      {CacheType::kInt8, 8, 1500, 0, 0, 48, 8, 48},
      {CacheType::kInt8, 8, 1500, 2, 4, 16, 8, 16},
      {CacheType::kInt8, 8, 4096, 0, 0, 48, 8, 48},
      {CacheType::kInt8, 8, 4096, 2, 4, 16, 8, 16},
      {CacheType::kInt8, 8, 16384, 0, 0, 48, 8, 48},
      {CacheType::kInt8, 8, 16384, 2, 4, 16, 8, 16},
      {CacheType::kInt8, 64, 1500, 0, 0, 192, 64, 192},
      {CacheType::kInt8, 64, 1500, 2, 2, 192, 64, 192},
      {CacheType::kInt8, 64, 4096, 0, 0, 192, 64, 192},
      {CacheType::kInt8, 64, 4096, 2, 3, 64, 0, 0},
      {CacheType::kInt8, 64, 16384, 0, 0, 192, 64, 192},
      {CacheType::kInt8, 64, 16384, 2, 3, 64, 0, 0},
      {CacheType::kInt8, 256, 1500, 0, 0, 256, 0, 0},
      {CacheType::kInt8, 256, 1500, 2, 2, 256, 0, 0},
      {CacheType::kInt8, 256, 4096, 0, 0, 512, 256, 512},
      {CacheType::kInt8, 256, 4096, 2, 3, 256, 0, 0},
      {CacheType::kInt8, 256, 16384, 0, 0, 1024, 256, 1024},
      {CacheType::kInt8, 256, 16384, 2, 3, 256, 0, 0},
  };
  for (const PinRow& r : rows) {
    INFO("cache " << static_cast<int>(r.cache) << " n " << r.n << " kv " << r.kv << " occupancy "
                  << r.occupancy);
    const C8Plan p = PinPlan(r.cache, r.n, r.kv, r.occupancy);
    CHECK(p.decode_stages == r.stages);
    CHECK(static_cast<int>(p.decode_items.size()) == r.decode_items);
    CHECK(static_cast<int>(p.merges.size()) == r.merges);
    CHECK(p.num_partials == r.partials);
  }
  CHECK(SweepDigest() == 0xbed8195ad12b0c4bull);
  std::mt19937 rng(1234);  // RandomCase's batches, prefill chunks and graph buckets included
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 500; ++i) {
    const PlanCase c = RandomCase(rng);
    h = PlanDigest(BuildC8Plan(c.shape, c.batch, c.config), h);
  }
  CHECK(h == 0x45241f92347849caull);
}

}  // namespace
}  // namespace llm::cuda
