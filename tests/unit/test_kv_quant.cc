// Tests for the 8-bit KV cache: the element formats of base/quant.h (round trips, ties to
// even, saturation, NaN), the CPU C8 append + attention against the fp32 reference run on the
// dequantized cache, the bytes and scales the append writes, backend selection, the KV cache
// config strings, and loading scales from checkpoints and calibration files.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/quant.h"
#include "engine/loader/kv_cache_quant.h"
#include "engine/loader/safetensors.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_c8_attention.h"
#include "kernels/cpu/cpu_paged_attention.h"
#include "kvcache/block_allocator.h"
#include "server/server_config.h"
#include "tests/unit/paged_batch.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// Element formats

TEST_CASE("int8: exact round trip of every code", "[kv_quant]") {
  for (const float scale : {1.0f, 0.037f, 3.5f}) {
    for (int q = -127; q <= 127; ++q) {
      const float x = DequantizeInt8(static_cast<int8_t>(q), scale);
      CHECK(x == static_cast<float>(q) * scale);
      CHECK(QuantizeInt8(x, scale) == q);
    }
  }
}

TEST_CASE("int8: rint ties to even, saturation at +-127, NaN", "[kv_quant]") {
  CHECK(QuantizeInt8(0.5f, 1.0f) == 0);
  CHECK(QuantizeInt8(1.5f, 1.0f) == 2);
  CHECK(QuantizeInt8(2.5f, 1.0f) == 2);
  CHECK(QuantizeInt8(3.5f, 1.0f) == 4);
  CHECK(QuantizeInt8(-0.5f, 1.0f) == 0);
  CHECK(QuantizeInt8(-2.5f, 1.0f) == -2);
  CHECK(QuantizeInt8(-3.5f, 1.0f) == -4);
  CHECK(QuantizeInt8(126.5f, 1.0f) == 126);
  CHECK(QuantizeInt8(2.49999f, 1.0f) == 2);
  CHECK(QuantizeInt8(2.50001f, 1.0f) == 3);
  // Ties after the division by the scale: 5 / 2 = 2.5.
  CHECK(QuantizeInt8(5.0f, 2.0f) == 2);
  CHECK(QuantizeInt8(7.0f, 2.0f) == 4);
  // Saturation, and -128 is never produced.
  CHECK(QuantizeInt8(127.5f, 1.0f) == 127);
  CHECK(QuantizeInt8(1000.0f, 1.0f) == 127);
  CHECK(QuantizeInt8(-127.5f, 1.0f) == -127);
  CHECK(QuantizeInt8(-128.0f, 1.0f) == -127);
  CHECK(QuantizeInt8(-1e30f, 1.0f) == -127);
  CHECK(QuantizeInt8(std::numeric_limits<float>::infinity(), 1.0f) == 127);
  CHECK(QuantizeInt8(-std::numeric_limits<float>::infinity(), 1.0f) == -127);
  CHECK(QuantizeInt8(std::numeric_limits<float>::quiet_NaN(), 1.0f) == 0);
  // The byte the cache stores is the two's-complement int8.
  CHECK(QuantizeKvElement(DType::kI8, -1.0f, 1.0f) == 0xff);
  CHECK(QuantizeKvElement(DType::kI8, -127.0f, 1.0f) == 0x81);
  CHECK(DequantizeKvElement(DType::kI8, 0x81, 0.5f) == -63.5f);
}

TEST_CASE("fp8 e4m3fn: every finite code round-trips, and known values", "[kv_quant]") {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) {
      CHECK(std::isnan(Fp8E4M3ToFloat(static_cast<uint8_t>(b))));
      continue;
    }
    const float f = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    CHECK(std::isfinite(f));
    CHECK(FloatToFp8E4M3(f) == b);
  }
  CHECK(Fp8E4M3ToFloat(0x7e) == 448.0f);
  CHECK(Fp8E4M3ToFloat(0xfe) == -448.0f);
  CHECK(Fp8E4M3ToFloat(0x38) == 1.0f);
  CHECK(Fp8E4M3ToFloat(0x08) == 0.015625f);         // smallest normal 2^-6
  CHECK(Fp8E4M3ToFloat(0x01) == 0.001953125f);      // smallest subnormal 2^-9
  CHECK(Fp8E4M3ToFloat(0x07) == 7 * 0.001953125f);  // largest subnormal
}

TEST_CASE("fp8 e4m3fn: round to nearest even at every midpoint", "[kv_quant]") {
  // Positive codes 0x00..0x7e are increasing in value; check each gap's midpoint and neighbours.
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    const float hi = Fp8E4M3ToFloat(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact in fp32
    const uint8_t even = static_cast<uint8_t>(c % 2 == 0 ? c : c + 1);
    INFO("code " << c << " lo " << lo << " hi " << hi);
    CHECK(FloatToFp8E4M3(mid) == even);
    CHECK(FloatToFp8E4M3(-mid) == (even | 0x80));
    CHECK(FloatToFp8E4M3(std::nextafter(mid, 0.0f)) == c);
    CHECK(FloatToFp8E4M3(std::nextafter(mid, 1000.0f)) == c + 1);
  }
  CHECK(FloatToFp8E4M3(1.0625f) == 0x38);        // 1 + 1/16: tie between 1.0 and 1.125 -> 1.0
  CHECK(FloatToFp8E4M3(1.1875f) == 0x3a);        // tie between 1.125 and 1.25 -> 1.25
  CHECK(FloatToFp8E4M3(0.0009765625f) == 0x00);  // 2^-10: tie between 0 and 2^-9 -> 0
}

TEST_CASE("fp8 e4m3fn: saturation at +-448, NaN, zero sign", "[kv_quant]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, 1e38f, inf}) {
    CHECK(FloatToFp8E4M3(x) == 0x7e);
    CHECK(FloatToFp8E4M3(-x) == 0xfe);
  }
  CHECK(FloatToFp8E4M3(std::numeric_limits<float>::quiet_NaN()) == 0x7f);
  CHECK(FloatToFp8E4M3(0.0f) == 0x00);
  CHECK(FloatToFp8E4M3(-0.0f) == 0x80);
  CHECK(FloatToFp8E4M3(1e-30f) == 0x00);
  // With a scale: x / scale is what gets encoded.
  CHECK(QuantizeFp8(896.0f, 2.0f) == 0x7e);
  CHECK(QuantizeFp8(-1e9f, 2.0f) == 0xfe);
  CHECK(DequantizeFp8(0x7e, 0.5f) == 224.0f);
  CHECK(QuantizeKvElement(DType::kFp8E4M3, 3.0f, 2.0f) == FloatToFp8E4M3(1.5f));
  CHECK(DequantizeKvElement(DType::kFp8E4M3, 0x38, 0.25f) == 0.25f);
}

TEST_CASE("dynamic scale: absmax / 448, 1 for zero, NaN ignored, inf gives 1", "[kv_quant]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1.0f, -3.0f, 2.0f};
  CHECK(KvDynamicScale(DType::kFp8E4M3, x.data(), 3) == 3.0f / 448.0f);
  CHECK(KvDynamicScale(DType::kI8, x.data(), 3) == 3.0f / 127.0f);
  // The absmax element lands on the largest code (possibly by saturation).
  CHECK(QuantizeFp8(-3.0f, 3.0f / 448.0f) == 0xfe);
  x = {0.0f, -0.0f, 0.0f};
  CHECK(KvDynamicScale(DType::kFp8E4M3, x.data(), 3) == 1.0f);
  x = {nan, 0.5f, nan};
  CHECK(KvDynamicScale(DType::kFp8E4M3, x.data(), 3) == 0.5f / 448.0f);
  x = {nan, nan};
  CHECK(KvDynamicScale(DType::kFp8E4M3, x.data(), 2) == 1.0f);
  x = {1.0f, -inf};
  CHECK(KvDynamicScale(DType::kFp8E4M3, x.data(), 2) == 1.0f);
  x = {1e-44f};  // absmax / 448 underflows to 0
  CHECK(KvDynamicScale(DType::kFp8E4M3, x.data(), 1) == 1.0f);
}

// ---------------------------------------------------------------------------------------------
// CPU C8 attention

struct SeqSpec {
  int kv_len;  // tokens in the cache after this step
  int q_len;   // new tokens this step
};

struct C8Case {
  int block_size, head_dim, num_q_heads, num_kv_heads;
  std::vector<SeqSpec> seqs;
  uint32_t seed;
};

struct Mode {
  DType dtype;
  KvQuant quant;
};

std::string ModeName(const Mode& m) {
  return std::string(DTypeName(m.dtype)) + "/" + KvQuantName(m.quant);
}

// A step whose earlier tokens were appended by a previous step, on an 8-bit cache whose blocks
// are handed out in shuffled order.
struct C8Setup {
  PagedAttentionShape shape;
  Mode mode;
  int num_blocks = 0;
  AttentionBatch prior, batch;
  std::vector<float> prior_k, prior_v;        // [prior tokens, Hkv, D]
  std::vector<float> q, k_new, v_new;         // this step
  std::vector<uint8_t> k_cache, v_cache;      // [blocks, Hkv, bs, D] bytes
  std::vector<float> k_scale, v_scale;        // static scales
  std::vector<float> k_bscale, v_bscale;      // dynamic [blocks, Hkv, bs]
  static constexpr uint8_t kSentinel = 0x7f;  // fp8 NaN: reading an unwritten slot poisons

  QuantKvCacheView View() {
    QuantKvCacheView v;
    v.shape = shape;
    v.dtype = mode.dtype;
    v.quant = mode.quant;
    v.k = k_cache.data();
    v.v = v_cache.data();
    if (mode.quant == KvQuant::kDynamicPerToken) {
      v.k_block_scales = k_bscale.data();
      v.v_block_scales = v_bscale.data();
    } else {
      v.k_scale = k_scale.data();
      v.v_scale = v_scale.data();
    }
    return v;
  }
};

// headroom: static scales are absmax * headroom / qmax, so below 1 the largest values saturate.
C8Setup BuildC8(const C8Case& c, const Mode& mode, float headroom = 0.9f) {
  C8Setup s;
  s.mode = mode;
  s.shape = {c.num_q_heads, c.num_kv_heads, c.head_dim, c.block_size};
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.05f, 4.0f);
  const int hkv = c.num_kv_heads, d = c.head_dim, bs = c.block_size;
  const size_t row = static_cast<size_t>(hkv) * d;
  // Channels of very different size (what per-channel scales are for).
  std::vector<float> k_mag(row), v_mag(row);
  for (float& x : k_mag) x = mag(rng);
  for (float& x : v_mag) x = mag(rng);

  int needed = 0;
  for (const SeqSpec& q : c.seqs) needed += BlocksForTokens(q.kv_len, bs);
  s.num_blocks = needed + 3;
  std::vector<int32_t> perm(static_cast<size_t>(s.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);

  AttentionBatch& b = s.batch;
  b.num_seqs = static_cast<int>(c.seqs.size());
  b.q_indptr = {0};
  b.page_indptr = {0};
  size_t next_page = 0;
  for (const SeqSpec& q : c.seqs) {
    const std::vector<int32_t> slots =
        test::AppendSequence(b, perm, &next_page, q.kv_len, q.q_len, bs);
    for (int p = 0; p < q.kv_len; ++p) {
      const int32_t slot = slots[p];
      const bool is_new = p >= q.kv_len - q.q_len;
      (is_new ? b.slot_mapping : s.prior.slot_mapping).push_back(slot);
      std::vector<float>& k = is_new ? s.k_new : s.prior_k;
      std::vector<float>& v = is_new ? s.v_new : s.prior_v;
      for (size_t i = 0; i < row; ++i) {
        k.push_back(uni(rng) * k_mag[i]);
        v.push_back(uni(rng) * v_mag[i]);
      }
    }
  }
  b.num_tokens = b.q_indptr.back();
  s.prior.num_tokens = static_cast<int>(s.prior.slot_mapping.size());
  s.q.resize(static_cast<size_t>(b.num_tokens) * c.num_q_heads * d);
  for (float& x : s.q) x = uni(rng);

  // Static scales from the data's absmax.
  const float qmax = KvQuantMax(mode.dtype);
  const bool per_channel = mode.quant == KvQuant::kStaticPerChannel;
  const size_t width = per_channel ? row : static_cast<size_t>(hkv);
  s.k_scale.assign(width, 0.0f);
  s.v_scale.assign(width, 0.0f);
  for (const auto* src : {&s.prior_k, &s.k_new, &s.prior_v, &s.v_new}) {
    std::vector<float>& dst = (src == &s.prior_k || src == &s.k_new) ? s.k_scale : s.v_scale;
    for (size_t i = 0; i < src->size(); ++i) {
      const size_t ch = i % row;
      float& m = dst[per_channel ? ch : ch / d];
      m = std::max(m, std::fabs((*src)[i]) * headroom / qmax);
    }
  }
  const size_t cache_bytes = static_cast<size_t>(s.num_blocks) * row * bs;
  s.k_cache.assign(cache_bytes, C8Setup::kSentinel);
  s.v_cache.assign(cache_bytes, C8Setup::kSentinel);
  const size_t slots = static_cast<size_t>(s.num_blocks) * hkv * bs;
  s.k_bscale.assign(slots, std::numeric_limits<float>::quiet_NaN());
  s.v_bscale.assign(slots, std::numeric_limits<float>::quiet_NaN());
  if (s.prior.num_tokens > 0) {
    CpuAppendKvQuant(s.View(), s.prior, s.prior_k.data(), s.prior_v.data());
  }
  return s;
}

// The expected bytes and scale of one appended token-head vector, straight from quant.h.
void ExpectRow(const C8Setup& s, bool is_k, const float* x, int slot, int h) {
  const PagedAttentionShape& sh = s.shape;
  const int d = sh.head_dim, block = slot / sh.block_size, off = slot % sh.block_size;
  const size_t at = ((static_cast<size_t>(block) * sh.num_kv_heads + h) * sh.block_size + off);
  const uint8_t* bytes = (is_k ? s.k_cache : s.v_cache).data() + at * d;
  std::vector<float> scales(d);
  if (s.mode.quant == KvQuant::kDynamicPerToken) {
    float absmax = 0.0f;
    for (int i = 0; i < d; ++i) absmax = std::max(absmax, std::fabs(x[i]));
    const float scale = absmax > 0.0f ? absmax / 448.0f : 1.0f;
    REQUIRE((is_k ? s.k_bscale : s.v_bscale)[at] == scale);
    std::fill(scales.begin(), scales.end(), scale);
  } else {
    const std::vector<float>& st = is_k ? s.k_scale : s.v_scale;
    for (int i = 0; i < d; ++i) {
      scales[i] =
          s.mode.quant == KvQuant::kStaticPerChannel ? st[static_cast<size_t>(h) * d + i] : st[h];
    }
  }
  for (int i = 0; i < d; ++i) {
    const uint8_t want = s.mode.dtype == DType::kI8
                             ? static_cast<uint8_t>(QuantizeInt8(x[i], scales[i]))
                             : QuantizeFp8(x[i], scales[i]);
    if (bytes[i] != want) {
      FAIL_CHECK("slot " << slot << " head " << h << " ch " << i << ": byte " << int(bytes[i])
                         << " != " << int(want));
      return;
    }
  }
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
  }
  return std::isnan(diff) ? INFINITY : diff / ref;
}

const std::vector<Mode> kModes = {
    {DType::kI8, KvQuant::kStaticPerHead},        {DType::kI8, KvQuant::kStaticPerChannel},
    {DType::kFp8E4M3, KvQuant::kStaticPerHead},   {DType::kFp8E4M3, KvQuant::kStaticPerChannel},
    {DType::kFp8E4M3, KvQuant::kDynamicPerToken},
};

const std::vector<C8Case> kCases = {
    // GQA 4:1; decode, 3-token decode, whole prompt, single-token prompt.
    {16, 64, 8, 2, {{17, 1}, {40, 3}, {65, 65}, {1, 1}}, 1},
    // Odd block size, MHA, a prefill chunk in the middle of a sequence, odd lengths.
    {5, 16, 4, 4, {{23, 7}, {9, 9}, {31, 1}}, 2},
    // MQA, head_dim 128.
    {32, 128, 8, 1, {{70, 2}, {33, 33}}, 3},
    // Group of 3, multi-token decode across a block boundary.
    {16, 32, 6, 2, {{129, 4}, {15, 2}}, 4},
};

TEST_CASE("CPU C8 attention equals the fp32 reference on the dequantized cache", "[kv_quant]") {
  const Mode mode = GENERATE(from_range(kModes));
  const C8Case c = GENERATE(from_range(kCases));
  const float headroom = GENERATE(0.9f, 1.0f);
  INFO(ModeName(mode) << " headroom " << headroom << " block " << c.block_size << " head_dim "
                      << c.head_dim << " heads " << c.num_q_heads << "/" << c.num_kv_heads
                      << " seed " << c.seed);
  C8Setup s = BuildC8(c, mode, headroom);
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // Through the registered backend, as the CPU model runner calls it.
  AttentionSpec spec;
  spec.kv_dtype = mode.dtype;
  spec.kv_quant = mode.quant;
  spec.num_q_heads = c.num_q_heads;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.block_size = c.block_size;
  std::string table;
  auto backend = BackendRegistry::Global().Create(spec, "", &table);
  REQUIRE(backend.ok());
  REQUIRE((*backend)->name() == "cpu_c8");
  const size_t slots = static_cast<size_t>(c.num_kv_heads) * c.block_size;
  CHECK((*backend)->BlockBytes() ==
        2 * slots * c.head_dim +
            (mode.quant == KvQuant::kDynamicPerToken ? 2 * slots * sizeof(float) : 0));
  REQUIRE((*backend)->Plan(s.batch).ok());
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  const QuantKvCacheView view = s.View();
  AttentionParams p;
  p.q = s.q.data();
  p.k_new = s.k_new.data();
  p.v_new = s.v_new.data();
  p.out = out.data();
  p.cache.k = view.k;
  p.cache.v = view.v;
  p.cache.k_scale = view.k_scale;
  p.cache.v_scale = view.v_scale;
  p.cache.k_block_scales = view.k_block_scales;
  p.cache.v_block_scales = view.v_block_scales;
  p.softmax_scale = softmax_scale;
  REQUIRE((*backend)->Run(p).ok());

  // The plain function gives the same bits.
  std::vector<float> direct(s.q.size());
  CpuPagedAttentionQuant(view, s.batch, s.q.data(), softmax_scale, direct.data());
  CHECK(direct == out);

  // Oracle: dequantize the whole cache, run the fp32 reference on it.
  const size_t elems = s.k_cache.size();
  std::vector<float> kf(elems), vf(elems);
  CpuDequantizeKvCache(view, s.num_blocks, kf.data(), vf.data());
  std::vector<float> ref(s.q.size());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), kf.data(), vf.data(), softmax_scale, ref.data());
  const double rel = MaxRelDiff(out, ref);
  INFO("max rel diff vs reference on dequantized cache " << rel);
  CHECK(rel <= 1e-5);

  // Every appended byte and dynamic scale is exactly what quant.h defines.
  const int hkv = c.num_kv_heads, d = c.head_dim;
  for (int pass = 0; pass < 2; ++pass) {
    const AttentionBatch& b = pass == 0 ? s.prior : s.batch;
    const std::vector<float>& k = pass == 0 ? s.prior_k : s.k_new;
    const std::vector<float>& v = pass == 0 ? s.prior_v : s.v_new;
    for (int t = 0; t < b.num_tokens; ++t) {
      for (int h = 0; h < hkv; ++h) {
        const size_t at = (static_cast<size_t>(t) * hkv + h) * d;
        ExpectRow(s, true, k.data() + at, b.slot_mapping[t], h);
        ExpectRow(s, false, v.data() + at, b.slot_mapping[t], h);
      }
    }
  }
  // Slots nobody wrote still hold the sentinel (the append touches only its own slots).
  std::vector<char> written(static_cast<size_t>(s.num_blocks) * c.block_size, 0);
  for (int32_t slot : s.prior.slot_mapping) written[slot] = 1;
  for (int32_t slot : s.batch.slot_mapping) written[slot] = 1;
  size_t untouched_bad = 0;
  for (size_t slot = 0; slot < written.size(); ++slot) {
    if (written[slot]) continue;
    const size_t block = slot / c.block_size, off = slot % c.block_size;
    for (int h = 0; h < hkv; ++h) {
      const size_t at = ((block * hkv + h) * c.block_size + off) * d;
      for (int i = 0; i < d; ++i) {
        untouched_bad += s.k_cache[at + i] != C8Setup::kSentinel;
        untouched_bad += s.v_cache[at + i] != C8Setup::kSentinel;
      }
    }
  }
  CHECK(untouched_bad == 0);

  // And without saturation the quantized attention stays near exact fp32 attention on the
  // original K/V (a loose sanity bound: the errors are those of 8-bit K/V, not of the kernel).
  if (headroom < 1.0f && mode.quant != KvQuant::kDynamicPerToken) return;
  std::vector<float> k32(elems, 0.0f), v32(elems, 0.0f), exact(s.q.size());
  CpuAppendKv(s.shape, s.prior, s.prior_k.data(), s.prior_v.data(), k32.data(), v32.data());
  CpuAppendKv(s.shape, s.batch, s.k_new.data(), s.v_new.data(), k32.data(), v32.data());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), k32.data(), v32.data(), softmax_scale,
                    exact.data());
  const double quant_err = MaxRelDiff(out, exact);
  INFO("max rel error vs fp32 attention " << quant_err);
  CHECK(quant_err < (mode.dtype == DType::kI8 ? 0.02 : 0.08));
}

// gpt-oss's learned sinks and the windowed models' sliding windows: the C8 backend (as the model
// runner calls it) gives the bits of the fp32 reference on the dequantized cache, and both the
// sink and the window change the result (so the comparison could fail).
TEST_CASE("CPU C8 attention with sink logits and windows equals the fp32 reference", "[kv_quant]") {
  const Mode mode = GENERATE(from_range(kModes));
  const C8Case c = GENERATE(from_range(kCases));
  const int window_left = GENERATE(-1, 0, 5, 16);
  INFO(ModeName(mode) << " block " << c.block_size << " heads " << c.num_q_heads << "/"
                      << c.num_kv_heads << " window_left " << window_left);
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<float> sinks(c.num_q_heads);
  std::mt19937 rng(c.seed + 7);
  std::uniform_real_distribution<float> sink_dist(-2.0f, 3.0f);
  for (float& x : sinks) x = sink_dist(rng);

  AttentionSpec spec;
  spec.kv_dtype = mode.dtype;
  spec.kv_quant = mode.quant;
  spec.num_q_heads = c.num_q_heads;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.block_size = c.block_size;
  spec.features = kFeatureCausal | kFeatureSlidingWindow | kFeatureSinks;
  auto backend = BackendRegistry::Global().Create(spec, "", nullptr);
  REQUIRE(backend.ok());
  REQUIRE((*backend)->name() == "cpu_c8");

  C8Setup s = BuildC8(c, mode);
  REQUIRE((*backend)->Plan(s.batch).ok());
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  const QuantKvCacheView view = s.View();
  AttentionParams p;
  p.q = s.q.data();
  p.k_new = s.k_new.data();
  p.v_new = s.v_new.data();
  p.out = out.data();
  p.cache.k = view.k;
  p.cache.v = view.v;
  p.cache.k_scale = view.k_scale;
  p.cache.v_scale = view.v_scale;
  p.cache.k_block_scales = view.k_block_scales;
  p.cache.v_block_scales = view.v_block_scales;
  p.softmax_scale = softmax_scale;
  p.window_left = window_left;
  p.sink_logits = sinks.data();
  REQUIRE((*backend)->Run(p).ok());

  const size_t elems = s.k_cache.size();
  std::vector<float> kf(elems), vf(elems), ref(s.q.size()), no_sink(s.q.size());
  CpuDequantizeKvCache(view, s.num_blocks, kf.data(), vf.data());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), kf.data(), vf.data(), softmax_scale, ref.data(),
                    window_left, 0.0f, sinks.data());
  CHECK(out == ref);
  CpuPagedAttentionQuant(view, s.batch, s.q.data(), softmax_scale, no_sink.data(), window_left);
  CHECK(no_sink != out);
  if (window_left >= 0) {
    std::vector<float> unwindowed(s.q.size());
    CpuPagedAttentionQuant(view, s.batch, s.q.data(), softmax_scale, unwindowed.data(), -1,
                           sinks.data());
    CHECK(unwindowed != out);
  }
}

TEST_CASE("CPU C8: a NaN input element is stored as int8 0 / fp8 NaN", "[kv_quant]") {
  for (const Mode& mode : kModes) {
    C8Setup s = BuildC8({4, 8, 2, 1, {{3, 3}}, 7}, mode);
    s.k_new[5] = std::numeric_limits<float>::quiet_NaN();  // token 0, channel 5
    CpuAppendKvQuant(s.View(), s.batch, s.k_new.data(), s.v_new.data());
    const int slot = s.batch.slot_mapping[0];
    const size_t at = static_cast<size_t>(slot / 4) * 4 * 8 + static_cast<size_t>(slot % 4) * 8;
    CHECK(s.k_cache[at + 5] == (mode.dtype == DType::kI8 ? 0x00 : 0x7f));
    if (mode.quant == KvQuant::kDynamicPerToken) {  // the NaN does not spoil the row's scale
      CHECK(std::isfinite(s.k_bscale[static_cast<size_t>(slot / 4) * 4 + slot % 4]));
    }
  }
}

TEST_CASE("BackendRegistry picks cpu_c8 for 8-bit caches and rejects mismatched specs",
          "[kv_quant]") {
  AttentionSpec spec;
  spec.num_q_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.block_size = 16;
  for (const Mode& m : kModes) {
    spec.kv_dtype = m.dtype;
    spec.kv_quant = m.quant;
    const Selection sel = BackendRegistry::Global().Select(spec);
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == "cpu_c8");
    CHECK(Contains(sel.Table(spec), KvQuantName(m.quant)));
  }
  spec.kv_dtype = DType::kF32;
  spec.kv_quant = KvQuant::kNone;
  REQUIRE(BackendRegistry::Global().Select(spec).info != nullptr);
  CHECK(BackendRegistry::Global().Select(spec).info->name == "cpu_reference");
  // An fp32 cache with scales, or an 8-bit cache without, fits nothing.
  spec.kv_quant = KvQuant::kStaticPerHead;
  auto created = BackendRegistry::Global().Create(spec, "", nullptr);
  REQUIRE_FALSE(created.ok());
  CHECK(Contains(created.status().message(), "no kv quant static_per_head"));
  spec.kv_dtype = DType::kI8;
  spec.kv_quant = KvQuant::kNone;
  CHECK(BackendRegistry::Global().Select(spec).info == nullptr);
}

// ---------------------------------------------------------------------------------------------
// Config strings

TEST_CASE("ParseKvCacheType accepts the documented strings only", "[kv_quant]") {
  auto t = ParseKvCacheType("auto", "per_head");
  REQUIRE(t.ok());
  CHECK(t->dtype == DType::kF32);
  CHECK(t->quant == KvQuant::kNone);
  t = ParseKvCacheType("int8", "per_channel");
  REQUIRE(t.ok());
  CHECK(t->dtype == DType::kI8);
  CHECK(t->quant == KvQuant::kStaticPerChannel);
  t = ParseKvCacheType("fp8_e4m3", "per_head");
  REQUIRE(t.ok());
  CHECK(t->dtype == DType::kFp8E4M3);
  CHECK(t->quant == KvQuant::kStaticPerHead);
  t = ParseKvCacheType("fp8_e4m3_dynamic", "per_head");
  REQUIRE(t.ok());
  CHECK(t->quant == KvQuant::kDynamicPerToken);
  CHECK_FALSE(t->is_static());

  auto bad = ParseKvCacheType("int4", "per_head");
  REQUIRE_FALSE(bad.ok());
  CHECK(Contains(bad.status().message(), "kv_cache_dtype"));
  bad = ParseKvCacheType("int8", "per_tensor");
  REQUIRE_FALSE(bad.ok());
  CHECK(Contains(bad.status().message(), "kv_scale_granularity"));
  CHECK(Contains(bad.status().message(), "per-tensor"));
}

TEST_CASE("ServerConfig carries the KV cache keys into the engine config", "[kv_quant]") {
  auto c =
      ParseServerConfig({"--model-dir", "/m", "--kv-cache-dtype", "fp8_e4m3",
                         "--kv-scale-granularity", "per_channel", "--kv-scales-file", "/s.json"});
  REQUIRE(c.ok());
  const EngineConfig& e = c->engine;
  CHECK(e.model.kv_cache_dtype == "fp8_e4m3");
  CHECK(e.model.kv_scale_granularity == "per_channel");
  CHECK(e.model.kv_scales_file == "/s.json");
  CHECK(ServerConfig().engine.model.kv_cache_dtype == "auto");
  auto bad = ParseServerConfig({"--model-dir", "/m", "--kv-cache-dtype", "fp16"});
  REQUIRE_FALSE(bad.ok());
  CHECK(Contains(bad.status().message(), "--kv-cache-dtype"));
  bad = ParseServerConfig(
      {"--model-dir", "/m", "--kv-cache-dtype", "int8", "--kv-scale-granularity", "per_tensor"});
  REQUIRE_FALSE(bad.ok());
  CHECK(Contains(bad.status().message(), "--kv-scale-granularity"));
  CHECK(Contains(bad.status().message(), "'per_tensor'"));
  // Every choice the option table offers is one ParseKvCacheType maps.
  for (const char* dtype : kKvCacheDtypeChoices) {
    for (const char* g : kKvScaleGranularityChoices) CHECK(ParseKvCacheType(dtype, g).ok());
  }
}

// ---------------------------------------------------------------------------------------------
// Scales: checkpoint and calibration file

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("llm_test_kv_quant_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

ModelConfig SmallConfig() {
  ModelConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  return c;
}

TensorToWrite F32Tensor(const std::string& name, std::vector<int64_t> shape,
                        const std::vector<float>& v) {
  TensorToWrite t{name, DType::kF32, std::move(shape), {}};
  t.data.resize(v.size() * sizeof(float));
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

// A model directory holding only `tensors` (plus a dummy so the file is never empty).
std::unique_ptr<WeightStore> Store(const TempDir& dir, std::vector<TensorToWrite> tensors) {
  tensors.push_back(F32Tensor("model.norm.weight", {1}, {1.0f}));
  REQUIRE(WriteSafetensors(dir.file("model.safetensors"), tensors).ok());
  auto w = WeightStore::Open(dir.str());
  REQUIRE(w.ok());
  return std::move(w).value();
}

std::string Attn(int layer, const std::string& rest) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + rest;
}

const KvCacheType kInt8Head{DType::kI8, KvQuant::kStaticPerHead};
const KvCacheType kFp8Head{DType::kFp8E4M3, KvQuant::kStaticPerHead};
const KvCacheType kFp8Channel{DType::kFp8E4M3, KvQuant::kStaticPerChannel};

TEST_CASE("KV scales: missing scales name the layer and how to produce them", "[kv_quant]") {
  TempDir dir;
  const ModelConfig c = SmallConfig();
  SECTION("none at all") {
    auto w = Store(dir, {});
    auto s = LoadKvCacheScales(c, *w, kInt8Head, "");
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kFailedPrecondition);
    const std::string& m = s.status().message();
    CHECK(Contains(m, "layer 0"));
    CHECK(Contains(m, "model.layers.0.self_attn.k_scale"));
    CHECK(Contains(m, "llm-calibrate-kv"));
    CHECK(Contains(m, "kv_scales_file"));
  }
  SECTION("layer 1 lacks its V scale") {
    auto w = Store(dir, {F32Tensor(Attn(0, "k_scale"), {2}, {1, 1}),
                         F32Tensor(Attn(0, "v_scale"), {2}, {1, 1}),
                         F32Tensor(Attn(1, "attn.k_scale"), {2}, {1, 1})});
    auto s = LoadKvCacheScales(c, *w, kFp8Head, "");
    REQUIRE_FALSE(s.ok());
    CHECK(Contains(s.status().message(), "layer 1"));
    CHECK(Contains(s.status().message(), "V cache scales"));
  }
}

TEST_CASE("KV scales: per-tensor and malformed checkpoint scales are rejected", "[kv_quant]") {
  TempDir dir;
  const ModelConfig c = SmallConfig();
  std::vector<TensorToWrite> t;
  std::string expect;
  SECTION("scalar") {
    t = {F32Tensor(Attn(0, "k_scale"), {}, {0.5f})};
    expect = "per-tensor";
  }
  SECTION("[1] with two KV heads") {
    t = {F32Tensor(Attn(0, "k_scale"), {1}, {0.5f})};
    expect = "per-tensor";
  }
  SECTION("wrong shape") {
    t = {F32Tensor(Attn(0, "k_scale"), {3}, {1, 1, 1})};
    expect = "expected [2] (per head)";
  }
  SECTION("zero scale") {
    t = {F32Tensor(Attn(0, "k_scale"), {2}, {1, 0})};
    expect = "positive";
  }
  t.push_back(F32Tensor(Attn(0, "v_scale"), {2}, {1, 1}));
  auto w = Store(dir, t);
  auto s = LoadKvCacheScales(c, *w, kFp8Head, "");
  REQUIRE_FALSE(s.ok());
  INFO(s.status().message());
  CHECK(Contains(s.status().message(), expect));
  CHECK(Contains(s.status().message(), "model.layers.0.self_attn.k_scale"));
}

TEST_CASE("KV scales: checkpoint names, shapes and conversions", "[kv_quant]") {
  TempDir dir;
  const ModelConfig c = SmallConfig();
  const std::vector<float> chan = {1, 2, 3, 4, 8, 7, 6, 5};
  auto w = Store(dir, {F32Tensor(Attn(0, "k_scale"), {2}, {0.5f, 0.25f}),
                       F32Tensor(Attn(0, "attn.v_scale"), {2, 4}, chan),
                       F32Tensor(Attn(1, "cache_k_scale"), {8}, chan),
                       F32Tensor(Attn(1, "v_proj.output_scale"), {2}, {2.0f, 4.0f})});
  SECTION("fp8 per head: as stored; per-channel sources reduce to the head maximum") {
    auto s = LoadKvCacheScales(c, *w, kFp8Head, "");
    REQUIRE(s.ok());
    CHECK(s->k[0] == std::vector<float>{0.5f, 0.25f});
    CHECK(s->v[0] == std::vector<float>{4, 8});
    CHECK(s->k[1] == std::vector<float>{4, 8});
    CHECK(s->v[1] == std::vector<float>{2, 4});
  }
  SECTION("fp8 per channel: per-head sources repeat over the channels") {
    auto s = LoadKvCacheScales(c, *w, kFp8Channel, "");
    REQUIRE(s.ok());
    CHECK(s->k[0] == std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f, 0.25f, 0.25f, 0.25f, 0.25f});
    CHECK(s->v[0] == chan);
    CHECK(s->k[1] == chan);
  }
  SECTION("int8: fp8 checkpoint scales keep their absmax (x 448 / 127)") {
    auto s = LoadKvCacheScales(c, *w, kInt8Head, "");
    REQUIRE(s.ok());
    CHECK(s->k[0][0] == 0.5f * 448.0f / 127.0f);
    CHECK(s->v[1][1] == 4.0f * 448.0f / 127.0f);
  }
}

TEST_CASE("KV scales: calibration file round trip and precedence", "[kv_quant]") {
  TempDir dir;
  const ModelConfig c = SmallConfig();
  KvAbsmax a;
  a.per_channel = true;
  a.num_kv_heads = 2;
  a.head_dim = 4;
  a.k = {{1, 2, 3, 4, 5, 6, 7, 0}, {127, 0, 0, 0, 0, 0, 0, 254}};
  a.v = {{0, 0, 0, 0, 0, 0, 0, 0}, {448, 1, 1, 1, 1, 1, 1, 1}};
  const std::string path = dir.file("scales.json");
  REQUIRE(WriteKvAbsmaxFile(path, a).ok());
  // The checkpoint has scales too: the file wins.
  auto w = Store(dir, {F32Tensor(Attn(0, "k_scale"), {2}, {9, 9})});

  auto s = LoadKvCacheScales(c, *w, {DType::kI8, KvQuant::kStaticPerChannel}, path);
  REQUIRE(s.ok());
  CHECK(s->k[0][0] == 1.0f / 127.0f);
  CHECK(s->k[0][7] == 1.0f);  // absmax 0 -> scale 1
  CHECK(s->k[1][0] == 1.0f);  // 127 / 127
  CHECK(s->k[1][7] == 2.0f);
  CHECK(s->v[0] == std::vector<float>(8, 1.0f));
  CHECK(Contains(s->source, "scales.json"));

  s = LoadKvCacheScales(c, *w, kFp8Head, path);  // per-channel file, per-head cache: maximum
  REQUIRE(s.ok());
  CHECK(s->k[0] == std::vector<float>{4.0f / 448.0f, 7.0f / 448.0f});
  CHECK(s->v[1] == std::vector<float>{1.0f, 1.0f / 448.0f});
}

TEST_CASE("KV scales: malformed calibration files name the problem", "[kv_quant]") {
  TempDir dir;
  const ModelConfig c = SmallConfig();
  auto w = Store(dir, {});
  const std::string path = dir.file("scales.json");
  std::string text, expect;
  SECTION("missing file") {
    expect = "cannot open";
  }
  SECTION("wrong format tag") {
    text = R"({"format": "other", "granularity": "per_head", "layers": []})";
    expect = "llm-kv-scales-v1";
  }
  SECTION("per-tensor granularity") {
    text = R"({"format": "llm-kv-scales-v1", "granularity": "per_tensor", "layers": []})";
    expect = "per-tensor";
  }
  SECTION("layer count") {
    text = R"({"format": "llm-kv-scales-v1", "granularity": "per_head",
               "layers": [{"k_absmax": [1, 1], "v_absmax": [1, 1]}]})";
    expect = "must list 2 layers";
  }
  SECTION("list length") {
    text = R"({"format": "llm-kv-scales-v1", "granularity": "per_head",
               "layers": [{"k_absmax": [1, 1], "v_absmax": [1, 1]},
                          {"k_absmax": [1, 1, 1], "v_absmax": [1, 1]}]})";
    expect = "layer 1: 'k_absmax' has 3 values, expected 2";
  }
  SECTION("negative absmax") {
    text = R"({"format": "llm-kv-scales-v1", "granularity": "per_head",
               "layers": [{"k_absmax": [1, 1], "v_absmax": [1, -1]},
                          {"k_absmax": [1, 1], "v_absmax": [1, 1]}]})";
    expect = "finite and >= 0";
  }
  SECTION("other model shape") {
    text = R"({"format": "llm-kv-scales-v1", "granularity": "per_head", "num_kv_heads": 8,
               "layers": []})";
    expect = "num_kv_heads 8";
  }
  if (!text.empty()) std::ofstream(path) << text;
  auto s = LoadKvCacheScales(c, *w, kFp8Head, path);
  REQUIRE_FALSE(s.ok());
  INFO(s.status().message());
  CHECK(Contains(s.status().message(), expect));
}

}  // namespace
}  // namespace llm
