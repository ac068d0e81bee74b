// MLA decode on the GPU (kernels/cuda/mla/mla_decode.h, backend "cuda_mla") against the CPU oracle
// CpuMlaDecode, on fresh random inputs every run: odd KV lengths (1, 63, 65, 1000, 4097, ...),
// shuffled block tables, batches mixing decodes of 1..8 query tokens with a prefill sequence (whose
// rows must stay untouched), 16/32/64/128 query heads, bf16 and fp8-e4m3 caches, with split-KV
// forced, disabled, and chosen by the planner.
//
// Checks per case:
//   1. Append: the cache bytes after Run equal the host model exactly: the bf16 input bits for a
//      bf16 cache, CpuMlaAppendLatent's QuantizeFp8 bytes for fp8; every other byte unchanged.
//   2. Attention: out_latent of the decode rows against CpuMlaDecode over the cache the GPU read
//      (bf16 values widened to fp32, or the fp8 bytes with the layer scale), q as the bf16 values.
//      The kernel rounds P to 16 bits (or to two e4m3 terms, ~8 bits, with q likewise, on the
//      e4m3-MMA fp8 path) and the output to bf16: |gpu - ref| <= 2e-2 + 1e-2 |ref| per element
//      and a relative L2 error below 1e-2 (measured errors are ~10x smaller).
//   3. Rows of non-decode sequences keep their poison (NaN) bits; decode rows are all finite.
//
// "[mla_sanitize]" is a quick subset for compute-sanitizer:
//   compute-sanitizer --tool memcheck build/<dir>/tests/gpu_tests "[mla_sanitize]"
//   compute-sanitizer --tool racecheck build/<dir>/tests/gpu_tests "[mla_sanitize]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_mla_attention.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/mla/mla_decode.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

constexpr int kC = kMlaLatentDim, kR = kMlaRopeDim, kL = kMlaCacheDim;

enum class Split { kNone, kForced, kPlanner };
enum class Path { kDirect, kRegistry };

struct MlaCase {
  int heads;
  MlaCacheType cache;
  Split split;
  std::vector<std::pair<int, int>>
      seqs;  // (q_len, kv_len); q_len > kMlaMaxDecodeQueryLen: prefill, left alone
  float softmax_scale = 0.0721688f;  // 1 / sqrt(192), DeepSeek's q/k head dim
  Path path = Path::kDirect;
  int block_size = 64;
  MlaKernel kernel = MlaKernel::kAuto;
  MlaFp8Math fp8_math = MlaFp8Math::kAuto;
  MlaBf16Schedule schedule = MlaBf16Schedule::kAuto;
  // Cache row i of a sequence of length n is scaled by 1 + kv_ramp * i / n (the appended rows by
  // 1 + kv_ramp): scores keep growing along the context, so the running max keeps moving.
  float kv_ramp = 0.f;
};

std::string Name(const MlaCase& c) {
  const char* split[] = {"no split", "forced split", "planner split"};
  std::string s = std::string(c.cache == MlaCacheType::kBf16 ? "bf16" : "fp8") +
                  " heads=" + std::to_string(c.heads) + " " + split[static_cast<int>(c.split)] +
                  " scale=" + std::to_string(c.softmax_scale) +
                  (c.path == Path::kRegistry ? " via registry" : "") +
                  (c.kernel == MlaKernel::kPortable ? " portable kernel"
                   : c.kernel == MlaKernel::kWgmma  ? " wgmma kernel"
                                                    : "") +
                  (c.fp8_math == MlaFp8Math::kF16 ? " f16-MMA fp8 kernel" : "") +
                  (c.schedule == MlaBf16Schedule::kRing ? " ring schedule" : "") +
                  (c.kv_ramp != 0.f ? " kv_ramp=" + std::to_string(c.kv_ramp) : "") +
                  " seqs(q,kv)=";
  for (auto [q, kv] : c.seqs) s += "(" + std::to_string(q) + "," + std::to_string(kv) + ")";
  return s;
}

// Device memory freed on scope exit, so a failing REQUIRE does not leak.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { REQUIRE(cudaMalloc(&p, std::max<size_t>(bytes, 16)) == 0); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <typename T>
void ToDevice(const DeviceBuffer& d, const std::vector<T>& h) {
  CUDA_REQUIRE(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<T> FromDevice(const DeviceBuffer& d, size_t n) {
  std::vector<T> h(n);
  CUDA_REQUIRE(cudaMemcpy(h.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

int DeviceArch() {
  int dev = 0;
  cudaDeviceProp prop{};
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  return prop.major * 10 + prop.minor;
}

// Runs one case; returns the number of split-KV partials the plan used (-1 via the registry).
int RunCaseOnce(const MlaCase& c, std::mt19937& rng) {
  INFO(Name(c));
  const int H = c.heads, bs = c.block_size;
  const bool fp8 = c.cache == MlaCacheType::kFp8E4M3;
  const size_t esize = fp8 ? 1 : 2;
  const float cache_scale = fp8 ? 4.0f / kFp8E4M3Max : 1.0f;  // |x| <= 4 representable
  std::normal_distribution<float> nd(0.f, 1.f);

  // Batch: block ids shuffled over a pool with spare blocks.
  int num_blocks = 0;
  const AttentionBatch b = ShuffledPagedBatch(c.seqs, bs, 5, rng, &num_blocks);
  const int T = b.num_tokens;
  const MlaShape ref_shape{H, kC, kR, bs};

  // Cache image: old tokens written on the host in the cache format, NaN bytes everywhere else
  // (0xff is NaN in bf16 pairs and in e4m3), so a read outside [0, kv_len) shows in the output.
  const size_t cache_rows = static_cast<size_t>(num_blocks) * bs;
  std::vector<uint8_t> cache(cache_rows * kL * esize, 0xff);
  for (int s = 0; s < b.num_seqs; ++s) {
    const int q_len = b.q_indptr[s + 1] - b.q_indptr[s];
    for (int i = 0; i < b.kv_lens[s] - q_len; ++i) {
      const size_t row =
          static_cast<size_t>(b.page_indices[b.page_indptr[s] + i / bs]) * bs + i % bs;
      const float ramp = 1.f + c.kv_ramp * static_cast<float>(i) / b.kv_lens[s];
      for (int d = 0; d < kL; ++d) {
        const float x = nd(rng) * ramp;
        if (fp8) {
          cache[row * kL + d] = QuantizeFp8(x, cache_scale);
        } else {
          const uint16_t v = F32ToBf16(x);
          std::memcpy(&cache[(row * kL + d) * 2], &v, 2);
        }
      }
    }
  }
  // Activations, bf16 as the GPU model produces them.
  std::vector<uint16_t> latent_new(static_cast<size_t>(T) * kL),
      q_latent(static_cast<size_t>(T) * H * kC), q_pe(static_cast<size_t>(T) * H * kR);
  for (auto& x : latent_new) x = F32ToBf16(nd(rng) * (1.f + c.kv_ramp));
  for (auto& x : q_latent) x = F32ToBf16(nd(rng));
  for (auto& x : q_pe) x = F32ToBf16(nd(rng));

  DeviceBuffer d_cache(cache.size()), d_latent_new(latent_new.size() * 2),
      d_q_latent(q_latent.size() * 2), d_q_pe(q_pe.size() * 2),
      d_out(static_cast<size_t>(T) * H * kC * 2);
  ToDevice(d_cache, cache);
  ToDevice(d_latent_new, latent_new);
  ToDevice(d_q_latent, q_latent);
  ToDevice(d_q_pe, q_pe);
  CUDA_REQUIRE(cudaMemset(d_out.p, 0xff, static_cast<size_t>(T) * H * kC * 2));  // NaN poison

  int num_partials = -1;
  if (c.path == Path::kDirect) {
    MlaDecode attn(MlaDecodeShape{H, bs, c.cache, c.kernel, c.fp8_math, c.schedule});
    INFO("items on the wgmma kernel (16/32/64 rows): "
         << attn.uses_wgmma(0) << attn.uses_wgmma(1) << attn.uses_wgmma(2)
         << ", fp8 on e4m3 MMA: " << attn.uses_fp8_mma() << ", seesaw: " << attn.uses_seesaw(0)
         << attn.uses_seesaw(1) << attn.uses_seesaw(2));
    MlaPlanConfig pc = attn.plan_config();
    pc.min_chunk_tokens = 64;
    if (c.split == Split::kNone) pc.max_splits = 1;
    pc.force_split = c.split == Split::kForced;
    const MlaPlan plan = BuildMlaPlan(attn.shape(), b, pc);
    num_partials = plan.num_partials;
    if (c.split == Split::kNone) CHECK(plan.num_partials == 0);
    REQUIRE(attn.Upload(b, plan, nullptr).ok());
    MlaDecode::LayerArgs la;
    la.q_latent = d_q_latent.p;
    la.q_pe = d_q_pe.p;
    la.latent_new = d_latent_new.p;
    la.out_latent = d_out.p;
    la.cache = d_cache.p;
    la.cache_scale = cache_scale;
    la.softmax_scale = c.softmax_scale;
    const Status st = attn.Run(la, nullptr);
    INFO(st.ToString());
    REQUIRE(st.ok());
    CUDA_REQUIRE(cudaDeviceSynchronize());
  } else {
    AttentionSpec spec;
    spec.device = DeviceKind::kCuda;
    spec.device_arch = DeviceArch();
    spec.kind = AttentionKind::kMla;
    spec.kv_dtype = fp8 ? DType::kFp8E4M3 : DType::kBF16;
    spec.num_q_heads = H;
    spec.num_kv_heads = 1;
    spec.head_dim = kL;
    spec.mla_rope_dim = kR;
    spec.block_size = bs;
    std::string table;
    auto be = BackendRegistry::Global().Create(spec, "cuda_mla", &table);
    INFO(table);
    REQUIRE(be.ok());
    MlaAttentionBackend* mla = be.value()->mla();
    REQUIRE(mla != nullptr);
    CHECK(mla->name() == "cuda_mla");
    CHECK(mla->BlockBytes() == static_cast<size_t>(bs) * kL * esize);
    mla->set_stream(nullptr);
    REQUIRE(mla->Plan(b).ok());
    MlaParams p;
    p.q_latent = d_q_latent.p;
    p.q_pe = d_q_pe.p;
    p.latent_new = d_latent_new.p;
    p.out_latent = d_out.p;
    p.cache = d_cache.p;
    p.cache_scale = cache_scale;
    p.softmax_scale = c.softmax_scale;
    REQUIRE(mla->RunMla(p).ok());
    CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  CUDA_REQUIRE(cudaGetLastError());

  // 1. Append, bit for bit.
  std::vector<float> latent_new_f(latent_new.size());
  for (size_t i = 0; i < latent_new.size(); ++i) latent_new_f[i] = Bf16ToF32(latent_new[i]);
  std::vector<uint8_t> expect = cache;
  if (fp8) {
    CpuMlaAppendLatent(ref_shape, b, latent_new_f.data(), DType::kFp8E4M3, cache_scale,
                       expect.data());
  } else {
    for (int t = 0; t < T; ++t) {
      std::memcpy(&expect[static_cast<size_t>(b.slot_mapping[t]) * kL * 2],
                  &latent_new[static_cast<size_t>(t) * kL], kL * 2);
    }
  }
  const std::vector<uint8_t> cache_gpu = FromDevice<uint8_t>(d_cache, cache.size());
  size_t byte_mismatch = 0;
  for (size_t i = 0; i < expect.size(); ++i) byte_mismatch += cache_gpu[i] != expect[i];
  CHECK(byte_mismatch == 0);

  // 2. Attention against the oracle over the same cache values.
  std::vector<float> qlf(q_latent.size()), qpf(q_pe.size());
  for (size_t i = 0; i < qlf.size(); ++i) qlf[i] = Bf16ToF32(q_latent[i]);
  for (size_t i = 0; i < qpf.size(); ++i) qpf[i] = Bf16ToF32(q_pe[i]);
  std::vector<float> cache_f32;
  MlaDecodeParams dp;
  dp.shape = ref_shape;
  if (fp8) {
    dp.cache_dtype = DType::kFp8E4M3;
    dp.cache = expect.data();
    dp.cache_scale = cache_scale;
  } else {
    cache_f32.resize(cache_rows * kL);
    for (size_t i = 0; i < cache_f32.size(); ++i) {
      uint16_t v;
      std::memcpy(&v, &expect[i * 2], 2);
      cache_f32[i] = Bf16ToF32(v);
    }
    dp.cache_dtype = DType::kF32;
    dp.cache = cache_f32.data();
  }
  dp.q_latent = qlf.data();
  dp.q_pe = qpf.data();
  dp.softmax_scale = c.softmax_scale;
  std::vector<float> ref(static_cast<size_t>(T) * H * kC, 0.f);
  dp.out_latent = ref.data();
  const std::vector<int32_t> decode_seqs = MlaDecodeSeqs(b);
  CpuMlaDecode(dp, b, decode_seqs);

  const std::vector<uint16_t> out = FromDevice<uint16_t>(d_out, ref.size());
  double err2 = 0, ref2 = 0, max_err = 0;
  size_t bad = 0, non_finite = 0, touched = 0;
  // Per-element bound: bf16 output rounding plus q and P carried with ~8 significant bits (bf16,
  // or an e4m3 hi + lo pair, ~7 bits where lo nears e4m3's subnormals). A peaked softmax (scale
  // 0.5 below) turns S's rounding into P's, and one element of a 64-head fp8 case out of ~10^5
  // once reached 0.0225 (seed 2390790852, relative L2 error 0.0018): fp8 gets 3e-2.
  const double atol = fp8 ? 3e-2 : 2e-2;
  std::vector<bool> is_decode_row(T, false);
  for (int s : decode_seqs) {
    for (int t = b.q_indptr[s]; t < b.q_indptr[s + 1]; ++t) is_decode_row[t] = true;
  }
  for (int t = 0; t < T; ++t) {
    for (size_t i = static_cast<size_t>(t) * H * kC; i < static_cast<size_t>(t + 1) * H * kC; ++i) {
      if (!is_decode_row[t]) {
        touched += out[i] != 0xffff;  // 3. prefill rows are the caller's
        continue;
      }
      const float gv = Bf16ToF32(out[i]), rv = ref[i];
      if (!std::isfinite(gv)) {
        ++non_finite;
        continue;
      }
      const double e = std::fabs(static_cast<double>(gv) - rv);
      err2 += e * e;
      ref2 += static_cast<double>(rv) * rv;
      max_err = std::max(max_err, e);
      bad += e > atol + 1e-2 * std::fabs(rv);
    }
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  INFO("relative L2 error " << rel << ", max abs error " << max_err << ", elements out of "
                            << "tolerance " << bad << ", non-finite " << non_finite
                            << ", prefill elements written " << touched);
  CHECK(non_finite == 0);
  CHECK(touched == 0);
  CHECK(bad == 0);
  CHECK(rel < 1e-2);
  return num_partials;
}

// Runs the case on the automatic choice and, where the sm_90a kernel can run (bf16 cache on
// sm_90), once more on the portable kernel (which sm_120 runs) and, where kAuto took the
// seesaw schedule, once more on the ring schedule. An fp8 case runs once more on the fp8 kernel
// kAuto did not choose, where both can run (sm_89+), so both are checked on one device.
int RunCase(const MlaCase& c, std::mt19937& rng) {
  const int partials = RunCaseOnce(c, rng);
  if (c.path == Path::kDirect && c.cache == MlaCacheType::kBf16 && MlaWgmmaAvailable()) {
    MlaCase other = c;
    other.kernel = MlaKernel::kPortable;
    RunCaseOnce(other, rng);
    if (c.block_size % 64 == 0) {
      // kAuto runs 64-row items (64 and 128 heads; 16 x 4 and 32 x 2 query tokens) on the seesaw
      // schedule and padded smaller items on the ring: the other schedule takes every item once.
      MlaCase other_schedule = c;
      other_schedule.schedule = c.heads >= 64 ? MlaBf16Schedule::kRing : MlaBf16Schedule::kSeesaw;
      RunCaseOnce(other_schedule, rng);
    }
  }
  if (c.path == Path::kDirect && c.cache == MlaCacheType::kFp8E4M3) {
    // kAuto puts 16-row fp8 items on the transposed wgmma kernel (Hopper): the portable kernel
    // runs them too.
    MlaCase other = c;
    other.kernel = MlaKernel::kPortable;
    if (MlaWgmmaAvailable()) RunCaseOnce(other, rng);
    if (MlaFp8MmaAvailable()) {  // every item on the portable kernel, with the other fp8 math
      const bool auto_e4m3 =
          MlaDecode(MlaDecodeShape{c.heads, c.block_size, c.cache}).uses_fp8_mma();
      other.fp8_math = auto_e4m3 ? MlaFp8Math::kF16 : MlaFp8Math::kE4m3;
      RunCaseOnce(other, rng);
    }
  }
  return partials;
}

// Decodes of 1..8 query tokens over odd lengths (first token of a prompt, block edges 63/64/65,
// long tails), and a prefill chunk the decode kernel must leave alone; in random order.
std::vector<std::pair<int, int>> MixedBatch(std::mt19937& rng) {
  std::vector<std::pair<int, int>> seqs = {{1, 1},   {4, 4},   {2, 63},  {3, 65},
                                           {1, 64},  {4, 129}, {1, 300}, {2, 1000},
                                           {3, 517}, {9, 40},  {5, 90},  {8, 300}};
  std::uniform_int_distribution<int> kv(5, 700);
  std::uniform_int_distribution<int> ql(1, 4);
  const int q = ql(rng);
  seqs.push_back({q, kv(rng)});
  std::shuffle(seqs.begin(), seqs.end(), rng);
  return seqs;
}

TEST_CASE("MLA decode matches the CPU reference: every head count, both caches, split or not",
          "[gpu][mla]") {
  GPU_TEST_RNG(rng);
  for (MlaCacheType cache : {MlaCacheType::kBf16, MlaCacheType::kFp8E4M3}) {
    for (int heads : {16, 32, 64, 128}) {
      for (Split split : {Split::kNone, Split::kForced}) {
        const int partials = RunCase({heads, cache, split, MixedBatch(rng)}, rng);
        if (split == Split::kForced) CHECK(partials > 0);
      }
    }
  }
}

TEST_CASE("MLA decode: long contexts, planner-chosen split-KV and a single unsplit CTA",
          "[gpu][mla]") {
  GPU_TEST_RNG(rng);
  for (MlaCacheType cache : {MlaCacheType::kBf16, MlaCacheType::kFp8E4M3}) {
    // A small batch of long contexts: the planner must split to fill the GPU.
    CHECK(RunCase({16, cache, Split::kPlanner, {{1, 4097}, {2, 4096}, {4, 2049}}}, rng) > 0);
    CHECK(RunCase({128, cache, Split::kPlanner, {{1, 4097}}}, rng) > 0);
    // One CTA streams all 4097 tokens (online softmax over 129 tiles).
    RunCase({128, cache, Split::kNone, {{1, 4097}}}, rng);
    RunCase({32, cache, Split::kNone, {{3, 4099}, {1, 1}}}, rng);
  }
}

TEST_CASE("MLA decode: sharply peaked softmax and block size 128", "[gpu][mla]") {
  GPU_TEST_RNG(rng);
  for (MlaCacheType cache : {MlaCacheType::kBf16, MlaCacheType::kFp8E4M3}) {
    for (int heads : {64, 16}) {  // (fp8 on Hopper: 32-row and 16-row items on wgmma)
      MlaCase c{heads, cache, Split::kForced, MixedBatch(rng)};
      c.softmax_scale = 0.5f;  // score std ~12: the running max moves and rescales often
      RunCase(c, rng);
    }
    MlaCase big{16, cache, Split::kPlanner, MixedBatch(rng)};
    big.block_size = 128;
    RunCase(big, rng);
  }
}

TEST_CASE("MLA decode: scores that keep growing along long contexts", "[gpu][mla]") {
  // The sm_90a kernel moves a row's softmax offset only when the max passes it by more than 2^8
  // (lazy rescaling); here it moves on tile after tile of one unsplit CTA, and P nears 256.
  GPU_TEST_RNG(rng);
  for (int heads : {64, 128, 16}) {
    MlaCase c{heads, MlaCacheType::kBf16, Split::kNone, {{1, 3001}, {2, 2049}, {4, 777}, {1, 64}}};
    c.softmax_scale = 0.5f;
    c.kv_ramp = 3.f;
    RunCase(c, rng);
  }
}

TEST_CASE("MLA decode through the registry: cuda_mla appends and attends via RunMla",
          "[gpu][mla]") {
  GPU_TEST_RNG(rng);
  MlaCase fp8{16, MlaCacheType::kFp8E4M3, Split::kPlanner, MixedBatch(rng)};
  fp8.path = Path::kRegistry;
  RunCase(fp8, rng);
  MlaCase bf16{128, MlaCacheType::kBf16, Split::kPlanner, {{1, 2000}, {2, 65}, {17, 30}}};
  bf16.path = Path::kRegistry;
  RunCase(bf16, rng);
}

TEST_CASE("MLA plan: rows per work item follow max_item_rows", "[host][mla]") {
  // Two decode sequences: 1 query token over 100 keys, 2 over 300 (one chunk each: no split).
  AttentionBatch b;
  b.num_seqs = 2;
  b.num_tokens = 3;
  b.q_indptr = {0, 1, 3};
  b.kv_lens = {100, 300};
  b.page_indptr = {0, 2, 7};
  b.page_indices = {0, 1, 2, 3, 4, 5, 6};
  b.slot_mapping = {99, 64 * 6 + 299 % 64, 64 * 6 + 298 % 64};
  MlaPlanConfig pc;
  pc.max_splits = 1;
  auto check_heads = [](const std::vector<MlaWorkItem>& items, int heads_per_item) {
    for (const MlaWorkItem& it : items) {
      CHECK(it.num_heads == heads_per_item);
      CHECK(it.head_start % heads_per_item == 0);
      CHECK(it.partial == -1);
    }
  };
  for (int max_rows : {64, 32}) {
    INFO("max_item_rows " << max_rows);
    pc.max_item_rows = max_rows;
    const int v = max_rows == 64 ? 2 : 1;
    // 128 heads: 128 / max_rows items per query token.
    const MlaPlan p128 = BuildMlaPlan(MlaDecodeShape{128, 64, MlaCacheType::kFp8E4M3}, b, pc);
    CHECK(p128.items[v].size() == static_cast<size_t>(3 * 128 / max_rows));
    CHECK(p128.items[3 - v].empty());
    check_heads(p128.items[v], max_rows);
    // 16 heads: max_rows / 16 query tokens per item, so the 2-token sequence is one item either
    // way, of 32 rows (2 tokens x 16 heads) in the variant that holds 32.
    const MlaPlan p16 = BuildMlaPlan(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3}, b, pc);
    CHECK(p16.items[0].size() == 1);  // the 1-token sequence: 16 rows
    REQUIRE(p16.items[1].size() == 1);
    CHECK(p16.items[1][0].q_len == 2);
    CHECK(p16.items[1][0].kv_end == 300);
  }
  // 16 heads x 4 query tokens: one 64-row item, or two of 32 rows (2 tokens each).
  AttentionBatch b4;
  b4.num_seqs = 1;
  b4.num_tokens = 4;
  b4.q_indptr = {0, 4};
  b4.kv_lens = {200};
  b4.page_indptr = {0, 4};
  b4.page_indices = {3, 1, 0, 2};
  b4.slot_mapping = {2 * 64 + 4, 2 * 64 + 5, 2 * 64 + 6, 2 * 64 + 7};
  pc.max_item_rows = 64;
  CHECK(BuildMlaPlan(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3}, b4, pc).items[2].size() == 1);
  pc.max_item_rows = 32;
  const MlaPlan p4 = BuildMlaPlan(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3}, b4, pc);
  REQUIRE(p4.items[1].size() == 2);
  CHECK(p4.items[1][0].q_len == 2);
  CHECK(p4.items[1][1].q_start == 2);
  CHECK(p4.items[1][0].kv_end == 198);  // causal: its last token sits at position 197
  CHECK(p4.items[1][1].kv_end == 200);
}

TEST_CASE("MLA decode: kernel choice per device and cache type", "[gpu][mla]") {
  const bool hopper = MlaWgmmaAvailable();
  INFO("sm_90a MLA kernel available: " << hopper);
  CHECK(MlaDecode(MlaDecodeShape{128, 64, MlaCacheType::kBf16}).uses_wgmma() == hopper);
  CHECK(MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kBf16}).uses_wgmma(0) == hopper);
  CHECK(MlaDecode(MlaDecodeShape{32, 64, MlaCacheType::kBf16}).uses_wgmma(1) == hopper);
  CHECK(MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kBf16, MlaKernel::kWgmma}).uses_wgmma(0) ==
        hopper);
  CHECK_FALSE(MlaDecode(MlaDecodeShape{128, 64, MlaCacheType::kFp8E4M3}).uses_wgmma());
  // fp8: 16- and 32-row items have a wgmma kernel, 64-row items do not.
  CHECK(MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3}).uses_wgmma(0) == hopper);
  CHECK(
      MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3, MlaKernel::kWgmma}).uses_wgmma(0) ==
      hopper);
  CHECK(
      MlaDecode(MlaDecodeShape{32, 64, MlaCacheType::kFp8E4M3, MlaKernel::kWgmma}).uses_wgmma(1) ==
      hopper);
  CHECK_FALSE(
      MlaDecode(MlaDecodeShape{64, 64, MlaCacheType::kFp8E4M3, MlaKernel::kWgmma}).uses_wgmma(2));
  CHECK_FALSE(
      MlaDecode(MlaDecodeShape{128, 64, MlaCacheType::kBf16, MlaKernel::kPortable}).uses_wgmma());
  // Forcing wgmma where it cannot run is an error at upload, not a silent fallback.
  AttentionBatch b;
  b.num_seqs = 1;
  b.num_tokens = 1;
  b.q_indptr = {0, 1};
  b.kv_lens = {1};
  b.page_indptr = {0, 1};
  b.page_indices = {0};
  b.slot_mapping = {0};
  for (MlaCacheType cache : {MlaCacheType::kBf16, MlaCacheType::kFp8E4M3}) {
    MlaDecode forced(MlaDecodeShape{128, 64, cache, MlaKernel::kWgmma});
    const Status st = forced.Upload(b, BuildMlaPlan(forced.shape(), b, MlaPlanConfig{}), nullptr);
    CHECK(st.ok() == hopper);
    if (!hopper) CHECK(st.code() == StatusCode::kInvalidArgument);
  }
  // bf16 schedule: seesaw by default where every 64-token tile sits in one page; the ring for
  // other block sizes and on request; seesaw forced onto a block size it cannot take is refused.
  using Sched = MlaBf16Schedule;
  CHECK(MlaDecode(MlaDecodeShape{128, 64, MlaCacheType::kBf16}).uses_seesaw() == hopper);
  CHECK(MlaDecode(MlaDecodeShape{128, 128, MlaCacheType::kBf16}).uses_seesaw() == hopper);
  CHECK_FALSE(MlaDecode(MlaDecodeShape{128, 32, MlaCacheType::kBf16}).uses_seesaw());
  CHECK_FALSE(MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kBf16}).uses_seesaw(0));
  CHECK(MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kBf16, MlaKernel::kAuto, MlaFp8Math::kAuto,
                                 Sched::kSeesaw})
            .uses_seesaw(0) == hopper);
  CHECK_FALSE(MlaDecode(MlaDecodeShape{128, 64, MlaCacheType::kFp8E4M3}).uses_seesaw());
  CHECK_FALSE(MlaDecode(MlaDecodeShape{128, 64, MlaCacheType::kBf16, MlaKernel::kAuto,
                                       MlaFp8Math::kAuto, Sched::kRing})
                  .uses_seesaw());
  CHECK_FALSE(
      MlaDecode(MlaDecodeShape{128, 64, MlaCacheType::kBf16, MlaKernel::kPortable}).uses_seesaw());
  {
    MlaDecode bad(MlaDecodeShape{128, 32, MlaCacheType::kBf16, MlaKernel::kAuto, MlaFp8Math::kAuto,
                                 Sched::kSeesaw});
    const Status st = bad.Upload(b, BuildMlaPlan(bad.shape(), b, MlaPlanConfig{}), nullptr);
    CHECK(st.code() == StatusCode::kInvalidArgument);
  }
  // fp8 math: e4m3 MMA can run wherever the device's binary is sm_89+ (sm_90 too) and is
  // kAuto's choice except on Hopper; f16 on request; forcing e4m3 where it cannot run is an
  // upload error too.
  const bool e4m3 = MlaFp8MmaAvailable();
  INFO("e4m3-MMA fp8 kernel available: " << e4m3);
  if (hopper) CHECK(e4m3);
  CHECK(MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3}).uses_fp8_mma() ==
        (e4m3 && !hopper));
  CHECK(
      MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3, MlaKernel::kAuto, MlaFp8Math::kE4m3})
          .uses_fp8_mma() == e4m3);
  CHECK_FALSE(
      MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3, MlaKernel::kAuto, MlaFp8Math::kF16})
          .uses_fp8_mma());
  CHECK_FALSE(MlaDecode(MlaDecodeShape{16, 64, MlaCacheType::kBf16}).uses_fp8_mma());
  MlaDecode forced(
      MlaDecodeShape{16, 64, MlaCacheType::kFp8E4M3, MlaKernel::kAuto, MlaFp8Math::kE4m3});
  CHECK(forced.Upload(b, BuildMlaPlan(forced.shape(), b, MlaPlanConfig{}), nullptr).ok() == e4m3);
}

TEST_CASE("MLA decode: quick subset for compute-sanitizer", "[gpu][mla_sanitize]") {
  std::mt19937 rng(12345);
  const std::vector<std::pair<int, int>> seqs = {{1, 1}, {4, 70}, {2, 130}, {6, 20}};
  for (MlaCacheType cache : {MlaCacheType::kBf16, MlaCacheType::kFp8E4M3}) {
    RunCase({16, cache, Split::kForced, seqs}, rng);
    RunCase({128, cache, Split::kNone, seqs}, rng);
    RunCase({32, cache, Split::kForced, seqs}, rng);
  }
}

}  // namespace
}  // namespace llm::cuda
