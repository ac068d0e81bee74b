// Paged-KV FMHA forward on the GPU (kernels/fmha/fmha_launcher.h) against the CPU reference
// (kernels/cpu/cpu_fmha.h), which reads the same bf16/fp16 inputs and computes in fp32.
//
// Every case draws fresh random inputs and poisons with NaN everything the kernel must not read:
// unused pool blocks, block-table columns past a sequence's end, block slots past seqlen_k, keys
// no query row can see (outside every window) and whole blocks outside every window (their table
// entries point at an all-NaN block); the output and lse buffers start as NaN, so a missed write
// or a stray read shows up as NaN. Compared:
//   out: max |gpu - ref| <= 3 ulp(dtype) * max|v| and rms(gpu - ref) <= ulp(dtype) * 2 * rms(ref)
//        (sources of error: P rounded to bf16/fp16 before P.V, and the final rounding), rows with
//        no visible key and no sink logit exactly 0;
//   lse: |gpu - ref| <= 2e-3 + 1e-4 |ref|, -inf exactly where the reference has -inf.
// Coverage: batch and group (varlen) mode, paged (block sizes 16/32/64/80, shuffled tables) and
// contiguous KV (permuted cache_batch_idx), GQA ratios 1/2/4/8 and MQA, head dims 64/128/256,
// bf16/fp16, masks none / causal top-left / causal bottom-right / windows (both sides, one side,
// with sink tokens), learned sink logits, ALiBi, soft-cap, with and without LSE, ragged lengths
// not multiple of any tile, seqlen_k < seqlen_q (rows that see nothing), empty sequences, decode
// shapes (1-4 query rows, long KV) and prefill shapes (hundreds of rows), and split-KV (explicit
// and automatic) with the merge. Prefill-shaped cases run on every kernel the device has: the
// portable one and, on Hopper (FmhaWgmmaAvailable), the wgmma one, against the same reference.
//
// Run (GPU machine):     build/cuda/tests/gpu_tests "[fmha]"
// Quick subset:          build/cuda/tests/gpu_tests "[fmha][quick]"
// Under the sanitizer:   compute-sanitizer --tool memcheck build/cuda/tests/gpu_tests
// "[fmha][quick]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/cpu/cpu_fmha.h"
#include "kernels/fmha/fmha_launcher.h"
#include "tests/unit/fmha_mask.h"

namespace llm {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

struct Seq {
  int q;  // query rows
  int k;  // keys (seqlen_k)
};

struct Case {
  FmhaDType dtype = FmhaDType::kBf16;
  int hq = 8, hkv = 2, d = 128;
  int block_size = 16;  // 0: contiguous KV
  bool group_mode = false;
  bool permute_rows = false;  // contiguous: shuffled cache_batch_idx
  bool packed_keys = false;   // contiguous: keys packed at seqstart_k offsets (not cache rows)
  std::vector<Seq> seqs;      // batch mode: every q must be equal
  FmhaMask mask;
  float scale_mult = 1.0f;  // softmax_scale = scale_mult / sqrt(d)
  float softcap = 0.0f;
  bool alibi = false;
  bool sink_logits = false;
  bool lse = true;
  int num_splits = 1;  // 1: none, 0: automatic (with a workspace), > 1: explicit
};

const char* MaskName(FmhaMaskType t) {
  switch (t) {
    case FmhaMaskType::kNone:
      return "none";
    case FmhaMaskType::kCausalTopLeft:
      return "causal_tl";
    case FmhaMaskType::kCausalBottomRight:
      return "causal_br";
    case FmhaMaskType::kWindow:
      return "window";
  }
  return "?";
}

std::string Describe(const Case& c) {
  // Appends only (GCC 12 warns falsely about "literal" + std::string temporaries).
  std::string s = c.dtype == FmhaDType::kBf16 ? "bf16" : "fp16";
  auto add = [&s](const char* key, int v) {
    s += key;
    s += std::to_string(v);
  };
  add(" hq=", c.hq);
  add(" hkv=", c.hkv);
  add(" d=", c.d);
  if (c.block_size > 0) {
    add(" paged bs=", c.block_size);
  } else {
    s += c.packed_keys ? " packed" : c.permute_rows ? " contiguous permuted" : " contiguous";
  }
  s += c.group_mode ? " group" : " batch";
  s += " mask=";
  s += MaskName(c.mask.type);
  if (c.mask.type == FmhaMaskType::kWindow) {
    add("(", c.mask.window_left);
    add(",", c.mask.window_right);
    s += ")";
  }
  if (c.mask.sink_tokens) add(" sink_tokens=", c.mask.sink_tokens);
  if (c.scale_mult != 1.f) add(" scale*", static_cast<int>(c.scale_mult));
  if (c.softcap > 0.f) add(" softcap=", static_cast<int>(c.softcap));
  if (c.alibi) s += " alibi";
  if (c.sink_logits) s += " sink_logits";
  if (!c.lse) s += " no_lse";
  if (c.num_splits != 1) add(" splits=", c.num_splits);
  s += " seqs(q,k)=";
  for (const Seq& q : c.seqs) {
    add("(", q.q);
    add(",", q.k);
    s += ")";
  }
  return s;
}

uint16_t ToBits(FmhaDType t, float x) {
  return t == FmhaDType::kBf16 ? F32ToBf16(x) : F32ToF16(x);
}
float FromBits(FmhaDType t, uint16_t b) {
  return t == FmhaDType::kBf16 ? Bf16ToF32(b) : F16ToF32(b);
}
uint16_t NanBits(FmhaDType t) {
  return t == FmhaDType::kBf16 ? 0x7fc0 : 0x7e00;
}

// Device buffer freed at scope exit.
struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(p);
  }
};

template <typename T>
void Upload(DevBuf& b, const std::vector<T>& v) {
  CUDA_REQUIRE(cudaMalloc(&b.p, std::max<size_t>(v.size() * sizeof(T), 16)));
  if (!v.empty()) {
    CUDA_REQUIRE(cudaMemcpy(b.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
}

// Reads back the GPU output and lse and compares them with the CPU reference (tolerances in the
// file comment).
void CompareToReference(const Case& c, size_t out_elems, int D, int hq, float max_abs_v,
                        const std::vector<float>& ref, const std::vector<float>& ref_lse,
                        const DevBuf& dout, const DevBuf& dlse) {
  std::vector<uint16_t> out(out_elems);
  std::vector<float> lse(ref_lse.size());
  if (!out.empty()) {
    CUDA_REQUIRE(cudaMemcpy(out.data(), dout.p, out.size() * 2, cudaMemcpyDeviceToHost));
    CUDA_REQUIRE(cudaMemcpy(lse.data(), dlse.p, lse.size() * 4, cudaMemcpyDeviceToHost));
  }

  // Compare.
  const float ulp = c.dtype == FmhaDType::kBf16 ? 1.f / 256 : 1.f / 2048;
  const float tol_max = 3.f * ulp * std::max(max_abs_v, 1.f);
  double err2 = 0, ref2 = 0, max_err = 0;
  size_t worst = 0, bad_zero = 0, non_finite = 0, bad_lse = 0, worst_lse = 0;
  double max_lse_err = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const float g = FromBits(c.dtype, out[i]);
    if (!std::isfinite(g)) {
      ++non_finite;
      continue;
    }
    const double e = std::fabs(static_cast<double>(g) - ref[i]);
    err2 += e * e;
    ref2 += static_cast<double>(ref[i]) * ref[i];
    if (e > max_err) {
      max_err = e;
      worst = i;
    }
    const size_t row = i / D;
    if (c.lse && std::isinf(ref_lse[row]) && g != 0.f) ++bad_zero;
  }
  if (c.lse) {
    for (size_t r = 0; r < lse.size(); ++r) {
      if (std::isinf(ref_lse[r])) {
        if (!(std::isinf(lse[r]) && lse[r] < 0)) ++bad_lse;
        continue;
      }
      const double e = std::fabs(static_cast<double>(lse[r]) - ref_lse[r]);
      if (!(e <= 2e-3 + 1e-4 * std::fabs(ref_lse[r]))) ++bad_lse;
      if (!(e <= max_lse_err)) {
        max_lse_err = std::isfinite(e) ? e : 1e30;
        worst_lse = r;
      }
    }
  }
  const double n = std::max<size_t>(out.size(), 1);
  const double rms_err = std::sqrt(err2 / n), rms_ref = std::sqrt(ref2 / n);
  const size_t wr = worst / D;
  INFO("worst element: token " << wr / hq << " head " << wr % hq << " d " << worst % D << ": gpu "
                               << (out.empty() ? 0.f : FromBits(c.dtype, out[worst])) << " ref "
                               << (ref.empty() ? 0.f : ref[worst]));
  INFO("max err " << max_err << " (tol " << tol_max << ", max|v| " << max_abs_v << "), rms err "
                  << rms_err << " (rms ref " << rms_ref << ")");
  INFO("lse: " << bad_lse << " bad, max err " << max_lse_err << " at row " << worst_lse << " (gpu "
               << (lse.empty() ? 0.f : lse[worst_lse]) << " ref "
               << (ref_lse.empty() ? 0.f : ref_lse[worst_lse]) << ")");
  CHECK(non_finite == 0);
  CHECK(max_err <= tol_max);
  CHECK(rms_err <= 2.0 * ulp * rms_ref + 1e-6);
  CHECK(bad_zero == 0);
  CHECK(bad_lse == 0);
}

void RunCase(const Case& c, std::mt19937& rng) {
  INFO(Describe(c));
  const int batch = static_cast<int>(c.seqs.size());
  const int D = c.d, hq = c.hq, hkv = c.hkv, bs = c.block_size;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);

  FmhaParams p;
  p.dtype = c.dtype;
  p.batch = batch;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = D;
  p.mask = c.mask;
  p.softmax_scale = c.scale_mult / std::sqrt(static_cast<float>(D));
  p.softcap = c.softcap;

  // Query layout.
  std::vector<int32_t> seqstart{0}, seqlen_k;
  int max_q = 0, max_k = 0;
  for (const Seq& s : c.seqs) {
    seqstart.push_back(seqstart.back() + s.q);
    seqlen_k.push_back(s.k);
    max_q = std::max(max_q, s.q);
    max_k = std::max(max_k, s.k);
  }
  if (c.group_mode) {
    p.max_seqlen_q = max_q;
  } else {
    for (const Seq& s : c.seqs) REQUIRE(s.q == c.seqs[0].q);
    p.seqlen_q = batch ? c.seqs[0].q : 0;
  }
  const int total_q = seqstart.back();

  // Which keys some row of each sequence can see (everything else gets NaN).
  std::vector<std::vector<char>> needed(batch);
  for (int b = 0; b < batch; ++b) {
    needed[b].assign(c.seqs[b].k, 0);
    for (int i = 0; i < c.seqs[b].q; ++i) {
      for (int j = 0; j < c.seqs[b].k; ++j) {
        needed[b][j] |= FmhaKeyVisible(c.mask, i, j, c.seqs[b].q, c.seqs[b].k);
      }
    }
  }

  // q: [total_q, hq, D]
  std::vector<uint16_t> q(static_cast<size_t>(total_q) * hq * D);
  for (auto& x : q) x = ToBits(c.dtype, nd(rng));

  // K/V cache, NaN-poisoned, then the needed keys written. V gets a per-channel offset so that
  // averages over long rows do not shrink towards zero.
  std::vector<float> v_offset(D);
  for (auto& x : v_offset) x = ud(rng);
  std::vector<int32_t> block_table, cache_idx, seqstart_k;
  size_t cache_elems = 0;
  std::vector<uint16_t> kc, vc;
  auto key_offset = [&](int b, int j, int h) -> size_t {
    if (bs > 0) {
      const int blk = block_table[static_cast<size_t>(b) * p.max_blocks_per_seq + j / bs];
      return ((static_cast<size_t>(blk) * hkv + h) * bs + j % bs) * D;
    }
    if (c.packed_keys) return ((static_cast<size_t>(seqstart_k[b]) + j) * hkv + h) * D;
    const int row = cache_idx.empty() ? b : cache_idx[b];
    return ((static_cast<size_t>(row) * p.cache_seqlen + j) * hkv + h) * D;
  };
  if (bs > 0) {
    p.block_size = bs;
    p.max_blocks_per_seq = std::max(1, (max_k + bs - 1) / bs + 1);  // + a column never used
    int used = 0;
    for (int b = 0; b < batch; ++b) used += (c.seqs[b].k + bs - 1) / bs;
    const int num_blocks = used + 3;  // block 0 of the shuffled pool is the all-NaN block
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    const int poison = pool[0];
    int next = 1;
    block_table.assign(static_cast<size_t>(batch) * p.max_blocks_per_seq, poison);
    for (int b = 0; b < batch; ++b) {
      const int nb = (c.seqs[b].k + bs - 1) / bs;
      for (int i = 0; i < nb; ++i) {
        bool any = false;
        for (int j = i * bs; j < std::min(c.seqs[b].k, (i + 1) * bs); ++j) any |= needed[b][j];
        // Blocks wholly outside every window keep the poison entry (the engine may have freed
        // them): the kernel must never dereference them.
        block_table[static_cast<size_t>(b) * p.max_blocks_per_seq + i] =
            any ? pool[next++] : poison;
      }
    }
    cache_elems = static_cast<size_t>(num_blocks) * hkv * bs * D;
  } else if (c.packed_keys) {
    // NaN rows between sequences: a read past seqlen_k shows.
    seqstart_k = {std::uniform_int_distribution<int>(0, 3)(rng)};
    for (int b = 0; b < batch; ++b) {
      seqstart_k.push_back(seqstart_k.back() + c.seqs[b].k +
                           std::uniform_int_distribution<int>(0, 3)(rng));
    }
    p.max_seqlen_k = std::max(max_k, 1);
    cache_elems = (static_cast<size_t>(seqstart_k.back()) + 2) * hkv * D;
  } else {
    p.cache_seqlen = max_k + 5;
    const int rows = batch + 2;
    if (c.permute_rows) {
      std::vector<int32_t> perm(rows);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      cache_idx.assign(perm.begin(), perm.begin() + batch);
    }
    cache_elems = static_cast<size_t>(rows) * p.cache_seqlen * hkv * D;
  }
  kc.assign(cache_elems, NanBits(c.dtype));
  vc.assign(cache_elems, NanBits(c.dtype));
  float max_abs_v = 0.f;
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < c.seqs[b].k; ++j) {
      if (!needed[b][j]) continue;
      for (int h = 0; h < hkv; ++h) {
        const size_t at = key_offset(b, j, h);
        for (int x = 0; x < D; ++x) {
          kc[at + x] = ToBits(c.dtype, nd(rng));
          vc[at + x] = ToBits(c.dtype, nd(rng) + v_offset[x]);
          max_abs_v = std::max(max_abs_v, std::fabs(FromBits(c.dtype, vc[at + x])));
        }
      }
    }
  }
  std::vector<float> alibi, sinks;
  if (c.alibi) {
    for (int h = 0; h < hq; ++h) alibi.push_back(std::exp2(-8.f * (h + 1) / hq));
  }
  if (c.sink_logits) {
    for (int h = 0; h < hq; ++h) sinks.push_back(1.5f + 2.f * ud(rng));
  }

  // CPU reference on the host copies.
  FmhaParams hp = p;
  hp.q = q.data();
  hp.k = kc.data();
  hp.v = vc.data();
  hp.seqstart_q = c.group_mode ? seqstart.data() : nullptr;
  hp.seqlen_k = seqlen_k.data();
  hp.block_table = bs > 0 ? block_table.data() : nullptr;
  hp.cache_batch_idx = cache_idx.empty() ? nullptr : cache_idx.data();
  hp.seqstart_k = c.packed_keys ? seqstart_k.data() : nullptr;
  hp.alibi_slopes = c.alibi ? alibi.data() : nullptr;
  hp.sink_logits = c.sink_logits ? sinks.data() : nullptr;
  std::vector<float> ref(static_cast<size_t>(total_q) * hq * D);
  std::vector<float> ref_lse(static_cast<size_t>(total_q) * hq);
  hp.lse = c.lse ? ref_lse.data() : nullptr;
  CpuFmhaForward(hp, ref.data());

  // GPU.
  DevBuf dq, dk, dv, dout, dlse, dstart, dlen, dbt, didx, dalibi, dsink, dws, dstart_k;
  Upload(dq, q);
  Upload(dk, kc);
  Upload(dv, vc);
  Upload(dstart, seqstart);
  Upload(dlen, seqlen_k);
  Upload(dbt, block_table);
  Upload(didx, cache_idx);
  Upload(dstart_k, seqstart_k);
  Upload(dalibi, alibi);
  Upload(dsink, sinks);
  const size_t out_bytes = std::max<size_t>(q.size() * 2, 16);
  CUDA_REQUIRE(cudaMalloc(&dout.p, out_bytes));
  CUDA_REQUIRE(cudaMalloc(&dlse.p, std::max<size_t>(ref_lse.size() * 4, 16)));
  FmhaParams dp = p;
  dp.q = dq.p;
  dp.k = dk.p;
  dp.v = dv.p;
  dp.out = dout.p;
  dp.lse = c.lse ? dlse.get<float>() : nullptr;
  dp.seqstart_q = c.group_mode ? dstart.get<int32_t>() : nullptr;
  dp.seqlen_k = dlen.get<int32_t>();
  dp.block_table = bs > 0 ? dbt.get<int32_t>() : nullptr;
  dp.cache_batch_idx = cache_idx.empty() ? nullptr : didx.get<int32_t>();
  dp.seqstart_k = c.packed_keys ? dstart_k.get<int32_t>() : nullptr;
  dp.alibi_slopes = c.alibi ? dalibi.get<float>() : nullptr;
  dp.sink_logits = c.sink_logits ? dsink.get<float>() : nullptr;
  FmhaLaunchOptions opt;
  opt.num_splits = c.num_splits;
  if (c.num_splits != 1) {
    opt.workspace_bytes = FmhaWorkspaceBytes(dp, c.num_splits);
    if (c.num_splits == 0) {
      INFO("automatic split count " << FmhaAutoSplits(dp));
      CHECK(FmhaAutoSplits(dp) >= 1);
    }
    if (opt.workspace_bytes) {
      CUDA_REQUIRE(cudaMalloc(&dws.p, opt.workspace_bytes));
      opt.workspace = dws.p;
    }
  }
  // Prefill-shaped launches (more than 16 packed rows) run on every kernel this device has: the
  // portable one and, on Hopper, the wgmma one (head dims 64 and 128 only).
  std::vector<FmhaKernel> kernels{FmhaKernel::kPortable};
  if (static_cast<int64_t>(max_q) * (hq / hkv) > 16 && FmhaWgmmaAvailable() && c.d != 256) {
    kernels.push_back(FmhaKernel::kWgmma);
  }
  for (const FmhaKernel kernel : kernels) {
    INFO("kernel " << (kernel == FmhaKernel::kWgmma ? "wgmma" : "portable"));
    CUDA_REQUIRE(cudaMemset(dout.p, 0xff, out_bytes));  // NaN: every element must be written
    CUDA_REQUIRE(cudaMemset(dlse.p, 0xff, std::max<size_t>(ref_lse.size() * 4, 16)));
    opt.kernel = kernel;
    const Status st = FmhaForward(dp, opt, nullptr);
    INFO(st.ToString());
    REQUIRE(st.ok());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CompareToReference(c, q.size(), D, hq, max_abs_v, ref, ref_lse, dout, dlse);
    // The same launch writing e4m3 bytes (FmhaParams::out_fp8, split merges included): each is
    // the fp32 output times the inverse scale rounded once to e4m3, so within half an e4m3 step
    // (2^-4 relative, or 2^-10 x scale below the normal range) of the 16-bit output (itself
    // within 2^-8 of it). The scale puts the largest output at 2/3 of e4m3's range.
    std::vector<uint16_t> out16(q.size());
    CUDA_REQUIRE(cudaMemcpy(out16.data(), dout.p, q.size() * 2, cudaMemcpyDeviceToHost));
    float max_out = 1e-3f;
    for (float x : ref) max_out = std::max(max_out, std::fabs(x));
    const float scale = 1.5f * max_out / kFp8E4M3Max;
    DevBuf d8;
    CUDA_REQUIRE(cudaMalloc(&d8.p, std::max<size_t>(q.size(), 16)));
    CUDA_REQUIRE(cudaMemset(d8.p, 0x7f, std::max<size_t>(q.size(), 16)));  // e4m3 NaN
    FmhaParams dp8 = dp;
    dp8.out = nullptr;
    dp8.out_fp8 = d8.p;
    dp8.out_fp8_inv_scale = 1.f / scale;
    const Status st8 = FmhaForward(dp8, opt, nullptr);
    INFO(st8.ToString());
    REQUIRE(st8.ok());
    std::vector<uint8_t> out8(q.size());
    CUDA_REQUIRE(cudaMemcpy(out8.data(), d8.p, q.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      const float got = DequantizeFp8(out8[i], scale), want = FromBits(c.dtype, out16[i]);
      const float tol = 0.07f * std::fabs(want) + std::ldexp(scale, -10) + 1e-6f;
      if (!(std::fabs(got - want) <= tol) && bad++ < 3) {
        UNSCOPED_INFO("fp8 output element " << i << ": " << got << " against " << want);
      }
    }
    CHECK(bad == 0);
  }
}

using test::Mask;

// Head dim 256 (Gemma 2 / 3: 64-row prefill tiles, 64-thread decode tiles): every feature the
// engine passes (windows, soft-cap, sinks, GQA, paged KV) on decode and prefill shapes.
std::vector<Case> HeadDim256Cases() {
  using M = FmhaMaskType;
  std::vector<Case> v;
  Case c;
  c.d = 256;
  // Decode, Gemma-3-12B-like GQA 2, paged block 16, group mode: causal, then a sliding window.
  c.hq = 16, c.hkv = 8, c.group_mode = true;
  c.seqs = {{1, 1}, {1, 700}, {1, 1025}, {1, 33}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  c.mask = Mask(M::kWindow, 511, 0);
  v.push_back(c);
  // Decode with soft-cap (Gemma 2) and large logits, GQA 8, fp16, block 64, and split-KV.
  c = Case{};
  c.d = 256, c.dtype = FmhaDType::kFp16, c.hq = 16, c.hkv = 2, c.block_size = 64;
  c.group_mode = true;
  c.seqs = {{2, 900}, {1, 64}, {1, 1500}};
  c.mask = Mask(M::kCausalBottomRight);
  c.scale_mult = 6.f, c.softcap = 50.f;
  v.push_back(c);
  c.num_splits = 0;
  v.push_back(c);
  c.mask = Mask(M::kWindow, 300, 0, 4);
  c.softcap = 0.f, c.scale_mult = 1.f;
  c.sink_logits = true, c.num_splits = 3;
  v.push_back(c);
  // Prefill: causal ragged batch, window + soft-cap, sinks (tokens and logits), MQA, split.
  c = Case{};
  c.d = 256, c.hq = 8, c.hkv = 4;
  c.seqs = {{70, 70}, {70, 150}, {70, 99}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  c.mask = Mask(M::kWindow, 40, 0);
  c.scale_mult = 6.f, c.softcap = 30.f;
  v.push_back(c);
  c = Case{};
  c.d = 256, c.hq = 4, c.hkv = 1, c.block_size = 32, c.group_mode = true;
  c.seqs = {{130, 160}, {3, 40}, {17, 17}};
  c.mask = Mask(M::kWindow, 50, 0, 4);
  c.sink_logits = true;
  v.push_back(c);
  c.mask = Mask(M::kCausalTopLeft);
  c.alibi = true, c.lse = false, c.sink_logits = false;
  v.push_back(c);
  c = Case{};
  c.d = 256, c.dtype = FmhaDType::kFp16, c.hq = 2, c.hkv = 2, c.block_size = 0;
  c.seqs = {{40, 300}};
  c.mask = Mask(M::kCausalBottomRight);
  c.num_splits = 3;
  v.push_back(c);
  // Packed keys (fresh prefill chunks).
  c = Case{};
  c.d = 256, c.block_size = 0, c.packed_keys = true, c.group_mode = true, c.hq = 16, c.hkv = 8;
  c.seqs = {{100, 100}, {1, 1}, {65, 65}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  return v;
}

// Each feature at least once, small enough for compute-sanitizer.
std::vector<Case> QuickCases() {
  using M = FmhaMaskType;
  std::vector<Case> v;
  Case c;
  // Prefill, batch mode, paged, ragged keys (bottom-right: seqlen_k >= seqlen_q here).
  c.seqs = {{37, 37}, {37, 100}, {37, 61}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  // Decode, group mode, GQA 8, fp16, block 64, long-ish KV.
  c = Case{};
  c.dtype = FmhaDType::kFp16;
  c.hq = 32, c.hkv = 4, c.d = 64, c.block_size = 64, c.group_mode = true;
  c.seqs = {{1, 1}, {2, 65}, {3, 300}, {4, 777}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  // Contiguous KV, permuted cache rows, top-left causal with seqlen_k < and > seqlen_q.
  c = Case{};
  c.block_size = 0, c.permute_rows = true, c.group_mode = true, c.d = 64;
  c.seqs = {{50, 20}, {33, 90}, {17, 17}};
  c.mask = Mask(M::kCausalTopLeft);
  v.push_back(c);
  // Bottom-right causal with seqlen_k < seqlen_q: the first rows see nothing (0 / -inf), and the
  // same with sink logits (lse = the sink).
  c = Case{};
  c.group_mode = true;
  c.seqs = {{40, 9}, {5, 0}, {0, 12}, {21, 30}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  c.sink_logits = true;
  v.push_back(c);
  // Sliding window + sink tokens (StreamingLLM), paged block 16, prefill.
  c = Case{};
  c.hq = 4, c.hkv = 4;
  c.seqs = {{150, 200}};
  c.mask = Mask(M::kWindow, 40, 0, 4);
  v.push_back(c);
  // Two-sided window, group mode, block 32.
  c = Case{};
  c.block_size = 32, c.group_mode = true, c.hq = 16, c.hkv = 4;
  c.seqs = {{70, 70}, {3, 150}, {1, 33}};
  c.mask = Mask(M::kWindow, 17, 5);
  v.push_back(c);
  // Window unbounded on the left, bounded right; and bounded left, unbounded right.
  c.mask = Mask(M::kWindow, -1, 3);
  v.push_back(c);
  c.mask = Mask(M::kWindow, 9, -1, 2);
  v.push_back(c);
  // No mask + ALiBi, fp16, head_dim 128, contiguous without cache_batch_idx.
  c = Case{};
  c.dtype = FmhaDType::kFp16, c.block_size = 0;
  c.seqs = {{19, 45}, {19, 19}};
  c.mask = Mask(M::kNone);
  c.alibi = true;
  v.push_back(c);
  // Soft-cap with large logits; MQA.
  c = Case{};
  c.hq = 8, c.hkv = 1;
  c.seqs = {{24, 80}};
  c.mask = Mask(M::kCausalBottomRight);
  c.scale_mult = 6.f, c.softcap = 8.f;
  v.push_back(c);
  // Learned sink logits with ALiBi and top-left causal, no LSE output.
  c = Case{};
  c.seqs = {{33, 33}, {33, 48}};
  c.mask = Mask(M::kCausalTopLeft);
  c.sink_logits = true, c.alibi = true, c.lse = false;
  v.push_back(c);
  // Split-KV: explicit and automatic, decode with window + sinks (a split may be empty).
  c = Case{};
  c.hq = 32, c.hkv = 8, c.block_size = 64, c.group_mode = true;
  c.seqs = {{1, 1500}, {2, 900}};
  c.mask = Mask(M::kWindow, 700, 0, 8);
  c.num_splits = 5;
  v.push_back(c);
  c.mask = Mask(M::kCausalBottomRight);
  c.sink_logits = true;
  c.num_splits = 0;
  v.push_back(c);
  // Split-KV on prefill tiles.
  c = Case{};
  c.dtype = FmhaDType::kFp16, c.d = 64;
  c.seqs = {{40, 300}};
  c.mask = Mask(M::kCausalBottomRight);
  c.num_splits = 3;
  v.push_back(c);
  // Packed keys (seqstart_k, the fresh K/V of varlen prefill chunks): causal GQA prefill on
  // both kernels, d 128 and 64, a window with fp16, and a decode-shaped split.
  c = Case{};
  c.block_size = 0, c.packed_keys = true, c.group_mode = true, c.hq = 32, c.hkv = 8;
  c.seqs = {{300, 300}, {1, 1}, {129, 129}, {64, 64}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  c.d = 64, c.dtype = FmhaDType::kFp16;
  c.mask = Mask(M::kWindow, 50, 0, 3);
  v.push_back(c);
  c = Case{};
  c.block_size = 0, c.packed_keys = true, c.group_mode = true;
  c.seqs = {{1, 900}, {3, 40}};
  c.mask = Mask(M::kCausalBottomRight);
  c.num_splits = 4;
  v.push_back(c);
  // Block size not a power of two.
  c = Case{};
  c.block_size = 80, c.hq = 4, c.hkv = 2;
  c.seqs = {{3, 413}, {3, 80}};
  c.mask = Mask(M::kCausalBottomRight);
  v.push_back(c);
  for (const Case& d256 : HeadDim256Cases()) v.push_back(d256);
  return v;
}

// Random cases: decode-like (1-4 rows, long KV) and prefill-like (hundreds of rows).
std::vector<Case> SweepCases(std::mt19937& rng, int n) {
  using M = FmhaMaskType;
  std::vector<Case> v;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int groups[] = {1, 2, 4, 8};
  const int block_sizes[] = {0, 16, 32, 64, 48};
  for (int i = 0; i < n; ++i) {
    Case c;
    c.dtype = pick(0, 1) ? FmhaDType::kBf16 : FmhaDType::kFp16;
    const int dims[] = {64, 128, 256};
    c.d = dims[pick(0, 2)];
    c.hkv = pick(1, 4);
    c.hq = c.hkv * groups[pick(0, 3)];
    c.block_size = block_sizes[pick(0, 4)];
    c.permute_rows = pick(0, 1);
    c.group_mode = pick(0, 2) > 0;
    const bool decode = pick(0, 1);
    const int batch = pick(1, 3);
    const int q_batch = decode ? pick(1, 4) : pick(64, 300);
    for (int b = 0; b < batch; ++b) {
      const int q = c.group_mode ? (decode ? pick(1, 4) : pick(1, 300)) : q_batch;
      const int k = decode ? pick(1, 2500) : q + pick(0, 300);
      c.seqs.push_back({q, k});
    }
    switch (pick(0, 5)) {
      case 0:
        c.mask = Mask(M::kNone);
        break;
      case 1:
        c.mask = Mask(M::kCausalTopLeft);
        break;
      case 2:
      case 3:
        c.mask = Mask(M::kCausalBottomRight);
        break;
      default:
        c.mask = Mask(M::kWindow, pick(-1, 400), pick(-1, 1) < 0 ? -1 : pick(0, 20),
                      pick(0, 1) ? pick(0, 40) : 0);
        break;
    }
    c.alibi = pick(0, 3) == 0;
    c.sink_logits = pick(0, 3) == 0;
    if (pick(0, 4) == 0) c.softcap = 10.f, c.scale_mult = 4.f;
    c.lse = pick(0, 4) > 0;
    c.num_splits = decode && pick(0, 1) ? 0 : 1;
    v.push_back(c);
  }
  return v;
}

TEST_CASE("FMHA forward: every feature against the CPU reference", "[gpu][fmha][quick]") {
  std::mt19937 rng(1234);
  for (const Case& c : QuickCases()) {
    SECTION(Describe(c)) {
      RunCase(c, rng);
    }
  }
}

TEST_CASE("FMHA forward: randomized shapes and features", "[gpu][fmha][sweep]") {
  const uint32_t seed = 20240607;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : SweepCases(rng, 48)) RunCase(c, rng);
}

TEST_CASE("FMHA forward: long decode and prefill shapes", "[gpu][fmha][sweep]") {
  std::mt19937 rng(99);
  Case c;
  c.hq = 32, c.hkv = 8, c.block_size = 64, c.group_mode = true;
  c.seqs = {{1, 4096}, {1, 3001}, {4, 2048}};
  c.mask = Mask(FmhaMaskType::kCausalBottomRight);
  RunCase(c, rng);  // unsplit
  c.num_splits = 0;
  RunCase(c, rng);  // automatic split
  c = Case{};
  c.hq = 32, c.hkv = 8, c.block_size = 64;
  c.seqs = {{512, 512}, {512, 700}};
  c.mask = Mask(FmhaMaskType::kCausalBottomRight);
  RunCase(c, rng);
  c.dtype = FmhaDType::kFp16;
  c.mask = Mask(FmhaMaskType::kWindow, 127, 0, 4);
  RunCase(c, rng);
  // Head dim 256: Gemma-3-like decode, unsplit and split, and a causal prefill.
  c = Case{};
  c.d = 256, c.hq = 16, c.hkv = 8, c.block_size = 16, c.group_mode = true;
  c.seqs = {{1, 4096}, {1, 3001}, {2, 2048}};
  c.mask = Mask(FmhaMaskType::kCausalBottomRight);
  RunCase(c, rng);
  c.num_splits = 0;
  RunCase(c, rng);
  c = Case{};
  c.d = 256, c.hq = 16, c.hkv = 8, c.block_size = 16;
  c.seqs = {{512, 512}, {512, 700}};
  c.mask = Mask(FmhaMaskType::kWindow, 1023, 0);
  c.softcap = 50.f;
  RunCase(c, rng);
}

// Parameters that pass the checks (one decode row, GQA 4) with every array at `buf`, which the
// checks never read; the cases below change one thing at a time.
FmhaParams CheckedParams(void* buf) {
  FmhaParams p;
  p.batch = 1;
  p.num_q_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.seqlen_q = 1;
  p.q = p.k = p.v = p.out = buf;
  p.seqlen_k = static_cast<const int32_t*>(buf);
  return p;
}

TEST_CASE("FMHA forward: unsupported parameters are rejected", "[gpu][fmha][quick]") {
  DevBuf buf;
  CUDA_REQUIRE(cudaMalloc(&buf.p, 4096));
  FmhaParams p = CheckedParams(buf.p);
  p.block_size = 16;
  p.block_table = buf.get<int32_t>();
  p.max_blocks_per_seq = 4;
  REQUIRE(FmhaCheckParams(p).ok());
  auto rejected = [](const FmhaParams& x, const std::string& what) {
    const Status s = FmhaForward(x, nullptr);
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find(what) != std::string::npos);
  };
  FmhaParams x = p;
  x.head_dim = 96;
  rejected(x, "head_dim 96");
  x = p;
  x.head_dim = 256;
  x.seqlen_q = 64;
  FmhaLaunchOptions w256;
  w256.kernel = FmhaKernel::kWgmma;  // the Hopper kernel has no head_dim 256
  const Status s256 = FmhaForward(x, w256, nullptr);
  CHECK(s256.code() == StatusCode::kInvalidArgument);
  CHECK(s256.message().find("head_dim 256") != std::string::npos);
  x = p;
  x.num_q_heads = 6;
  x.num_kv_heads = 4;
  rejected(x, "multiple of num_kv_heads");
  x = p;
  x.block_size = 24;
  rejected(x, "multiple of 16");
  x = p;
  x.q = buf.get<char>() + 2;
  rejected(x, "16-byte aligned");
  x = p;
  x.block_size = 0;
  x.cache_seqlen = 0;
  rejected(x, "cache_seqlen");
  FmhaLaunchOptions opt;
  opt.num_splits = 4;  // no workspace
  const Status s = FmhaForward(p, opt, nullptr);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("workspace") != std::string::npos);
  if (!FmhaWgmmaAvailable()) {  // forcing the Hopper kernel elsewhere is an error, not a fallback
    x = p;
    x.seqlen_q = 64;
    FmhaLaunchOptions w;
    w.kernel = FmhaKernel::kWgmma;
    const Status sw = FmhaForward(x, w, nullptr);
    CHECK(sw.code() == StatusCode::kInvalidArgument);
    CHECK(sw.message().find("wgmma") != std::string::npos);
  }
}

TEST_CASE("FMHA params: packed keys need max_seqlen_k and no cache rows", "[host][fmha]") {
  alignas(16) static int32_t host[64] = {};  // only checked, never read
  FmhaParams p = CheckedParams(host);
  p.batch = 2;
  p.seqlen_q = 3;
  p.seqstart_k = host;
  p.max_seqlen_k = 40;  // cache_seqlen stays 0: packed keys do not use it
  INFO(FmhaCheckParams(p).ToString());
  CHECK(FmhaCheckParams(p).ok());
  FmhaParams x = p;
  x.max_seqlen_k = 0;
  CHECK(FmhaCheckParams(x).code() == StatusCode::kInvalidArgument);
  CHECK(FmhaCheckParams(x).message().find("max_seqlen_k") != std::string::npos);
  x = p;
  x.cache_batch_idx = host;
  CHECK(FmhaCheckParams(x).code() == StatusCode::kInvalidArgument);
  CHECK(FmhaCheckParams(x).message().find("cache_batch_idx") != std::string::npos);
  x = p;
  x.seqstart_k = nullptr;  // contiguous cache rows again: cache_seqlen is required
  CHECK(FmhaCheckParams(x).message().find("cache_seqlen") != std::string::npos);
}

}  // namespace
}  // namespace llm
