// C8 attention on the GPU against the CPU reference, on fresh random inputs: odd lengths,
// shuffled block tables, batches mixing prefill chunks and decodes with 1..4 query tokens, GQA
// ratios 1/4/8, head dims 64/128, block sizes 16/64, bf16/int8/fp8 caches with per-head,
// per-channel and per-token scales, with and without split-KV; sliding windows (with the blocks
// left of every window freed, -1 in the block table, or kept) and learned sink logits.
//
// The append is checked bit for bit against base/quant.h; attention is checked against
// CpuPagedAttention run on the dequantized cache (the C8 reference semantics).
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/cpu/cpu_paged_attention.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/fmha/fmha_launcher.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

struct Case {
  int hq, hkv, d, bs;
  CacheType cache;
  ScaleMode scale;
  bool force_split;
  std::vector<std::pair<int, int>> seqs;  // (q_len, kv_len)
  int stages = 0;                         // decode ring depth forced on the plan (0: planner's)
  // C8Attention::SetPrefillFmha: the prefill sequences through the wgmma FMHA kernel over a bf16
  // copy of the cache. RunCase then demands that the step used it exactly when its prefill rows
  // are contiguous (the path's condition; FmhaPrefillBatch orders them so).
  bool prefill_fmha = false;
  // The layer's sliding window (-1: none) and whether the batch frees the blocks wholly left of
  // each sequence's first window (-1 in the block table, as the scheduler does for a model whose
  // every layer is windowed); sinks: random per-head sink logits.
  int window_left = -1;
  bool free_blocks = true;
  bool sinks = false;
};

std::string Name(const Case& c) {
  const char* cache[] = {"bf16", "int8", "fp8"};
  const char* scale[] = {"none", "per_head", "per_channel", "per_token"};
  return std::string(cache[static_cast<int>(c.cache)]) + "/" + scale[static_cast<int>(c.scale)] +
         " hq=" + std::to_string(c.hq) + " hkv=" + std::to_string(c.hkv) +
         " d=" + std::to_string(c.d) + " bs=" + std::to_string(c.bs) +
         (c.force_split ? " split" : "") +
         (c.stages > 0 ? " stages=" + std::to_string(c.stages) : std::string()) +
         (c.prefill_fmha ? " prefill_fmha" : "") +
         (c.window_left >= 0
              ? " window_left=" + std::to_string(c.window_left) + (c.free_blocks ? " freed" : "")
              : std::string()) +
         (c.sinks ? " sinks" : "");
}

float RoundBf16(float x) {
  return Bf16ToF32(F32ToBf16(x));
}

// Host model of one cache element: quantize per the storage definition (int8 is stored
// excess-128: byte = q ^ 0x80).
uint8_t QuantByte(CacheType c, float x, float s) {
  return c == CacheType::kInt8 ? static_cast<uint8_t>(QuantizeInt8(x, s)) ^ 0x80u
                               : QuantizeFp8(x, s);
}
float Dequant(CacheType c, uint8_t b, float s) {
  return c == CacheType::kInt8 ? DequantizeInt8(static_cast<int8_t>(b ^ 0x80u), s)
                               : DequantizeFp8(b, s);
}

// Decode steps replayed from one CUDA graph per bucket: buffers sized once for the largest step (a
// graph keeps the pointers it captured) and one C8Attention whose graph area the launches read.
struct GraphCtx {
  C8Attention* attn = nullptr;
  cudaStream_t stream = nullptr;
  int bucket = 0;
  int q = 1;       // query rows per sequence of the bucket's steps (> 1: verify steps)
  size_t cap = 0;  // bytes of each buffer below
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr, *dkc = nullptr, *dvc = nullptr;
  float *dks = nullptr, *dvs = nullptr;
  float* dsinks = nullptr;  // [num_q_heads] (a captured launch keeps the pointer)
  cudaGraphExec_t exec = nullptr;
  int replays = 0;
};

void RunCase(const Case& c, std::mt19937& rng, GraphCtx* g = nullptr) {
  INFO(Name(c) << (g ? " graph bucket " + std::to_string(g->bucket) + " x " + std::to_string(g->q)
                     : std::string()));
  const int D = c.d, bs = c.bs, hkv = c.hkv, hq = c.hq;
  const bool eight = c.cache != CacheType::kBf16;
  const int esize = eight ? 1 : 2;
  std::normal_distribution<float> nd(0.f, 1.f);

  // Batch: shuffled block ids over a pool larger than needed.
  int num_blocks = 0;
  const AttentionBatch b = ShuffledPagedBatch(c.seqs, bs, 7, rng, &num_blocks);

  // Static scales: positive, varied per head / channel.
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  const float qmax = c.cache == CacheType::kInt8 ? kInt8Max : kFp8E4M3Max;
  std::vector<float> k_scale, v_scale;
  if (c.scale == ScaleMode::kPerHead) {
    for (int h = 0; h < hkv; ++h) k_scale.push_back(3.0f * ud(rng) / qmax);
    for (int h = 0; h < hkv; ++h) v_scale.push_back(3.0f * ud(rng) / qmax);
  } else if (c.scale == ScaleMode::kPerChannel) {
    for (int i = 0; i < hkv * D; ++i) k_scale.push_back(3.0f * ud(rng) / qmax);
    for (int i = 0; i < hkv * D; ++i) v_scale.push_back(3.0f * ud(rng) / qmax);
  } else if (c.scale == ScaleMode::kPerToken) {
    k_scale.assign(static_cast<size_t>(num_blocks) * hkv * bs, 0.f);
    v_scale.assign(k_scale.size(), 0.f);
  }
  auto scale_of = [&](const std::vector<float>& sc, int block, int h, int off, int d) {
    switch (c.scale) {
      case ScaleMode::kPerHead:
        return sc[h];
      case ScaleMode::kPerChannel:
        return sc[h * D + d];
      case ScaleMode::kPerToken:
        return sc[(static_cast<size_t>(block) * hkv + h) * bs + off];
      case ScaleMode::kNone:
        break;
    }
    return 1.f;
  };

  // Cache image holding the old tokens (written on the host), poisoned elsewhere.
  const size_t cache_elems = static_cast<size_t>(num_blocks) * hkv * bs * D;
  std::vector<uint8_t> kc(cache_elems * esize, 0x7f), vc(cache_elems * esize, 0x7f);
  auto write_elem = [&](std::vector<uint8_t>& cache, std::vector<float>& sc, int block, int h,
                        int off, const float* x) {
    const size_t base = ((static_cast<size_t>(block) * hkv + h) * bs + off) * D;
    if (c.scale == ScaleMode::kPerToken) {
      float amax = 0.f;
      for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
      sc[(static_cast<size_t>(block) * hkv + h) * bs + off] = DynamicScale(amax, qmax);
    }
    for (int d = 0; d < D; ++d) {
      if (eight) {
        cache[base + d] = QuantByte(c.cache, x[d], scale_of(sc, block, h, off, d));
      } else {
        const uint16_t v = F32ToBf16(x[d]);
        std::memcpy(&cache[(base + d) * 2], &v, 2);
      }
    }
  };
  std::vector<float> row(D);
  for (int s = 0; s < b.num_seqs; ++s) {
    const int q_len = b.q_indptr[s + 1] - b.q_indptr[s], kv = b.kv_lens[s];
    for (int i = 0; i < kv - q_len; ++i) {
      const int block = b.page_indices[b.page_indptr[s] + i / bs], off = i % bs;
      for (int h = 0; h < hkv; ++h) {
        for (auto& x : row) x = RoundBf16(nd(rng));
        write_elem(kc, k_scale, block, h, off, row.data());
        for (auto& x : row) x = RoundBf16(nd(rng));
        write_elem(vc, v_scale, block, h, off, row.data());
      }
    }
  }
  // The batch the kernels get: blocks wholly left of a sequence's first window freed (-1). The
  // reference reads b, whose blocks it never reads there either.
  AttentionBatch run_b = b;
  int freed = 0;
  if (c.window_left >= 0 && c.free_blocks) {
    for (int s = 0; s < b.num_seqs; ++s) {
      const int first_pos = b.kv_lens[s] - (b.q_indptr[s + 1] - b.q_indptr[s]);
      const int lo = std::max(0, first_pos - c.window_left);
      for (int blk = 0; blk < lo / bs; ++blk) run_b.page_indices[b.page_indptr[s] + blk] = -1;
      freed += lo / bs;
    }
  }
  std::vector<float> sinks;
  float* dsinks = nullptr;
  if (c.sinks) {
    std::uniform_real_distribution<float> sd(-1.0f, 4.0f);
    for (int h = 0; h < hq; ++h) sinks.push_back(sd(rng));
  }
  // New tokens: q, k, v as bf16.
  const int T = b.num_tokens;
  std::vector<uint16_t> q16(static_cast<size_t>(T) * hq * D), k16(static_cast<size_t>(T) * hkv * D),
      v16(k16.size());
  for (auto& x : q16) x = F32ToBf16(nd(rng));
  for (auto& x : k16) x = F32ToBf16(nd(rng));
  for (auto& x : v16) x = F32ToBf16(nd(rng));

  // Device buffers.
  const size_t guard = static_cast<size_t>(hkv) * bs * D * esize;  // one block
  const size_t scale_guard = static_cast<size_t>(hkv) * bs * 4;    // its per-token scales
  void *dq, *dk, *dv, *dout, *dkc, *dvc;
  float *dks = nullptr, *dvs = nullptr;
  if (g != nullptr) {
    REQUIRE(std::max({q16.size() * 2, kc.size(), k_scale.size() * 4}) <= g->cap);
    dq = g->dq, dk = g->dk, dv = g->dv, dout = g->dout, dkc = g->dkc, dvc = g->dvc;
    if (!k_scale.empty()) dks = g->dks, dvs = g->dvs;
  } else {
    CUDA_REQUIRE(cudaMalloc(&dq, q16.size() * 2));
    CUDA_REQUIRE(cudaMalloc(&dk, k16.size() * 2));
    CUDA_REQUIRE(cudaMalloc(&dv, v16.size() * 2));
    CUDA_REQUIRE(cudaMalloc(&dout, q16.size() * 2));
    // One NaN block (bf16 and e4m3 0xff) before each cache: where block -1 would be. A read of a
    // freed block multiplies its NaN V by a zero probability: NaN in the output.
    CUDA_REQUIRE(cudaMalloc(&dkc, kc.size() + guard));
    CUDA_REQUIRE(cudaMalloc(&dvc, vc.size() + guard));
    CUDA_REQUIRE(cudaMemset(dkc, 0xff, guard));
    CUDA_REQUIRE(cudaMemset(dvc, 0xff, guard));
    dkc = static_cast<uint8_t*>(dkc) + guard;
    dvc = static_cast<uint8_t*>(dvc) + guard;
  }
  CUDA_REQUIRE(cudaMemcpy(dq, q16.data(), q16.size() * 2, cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemcpy(dk, k16.data(), k16.size() * 2, cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemcpy(dv, v16.data(), v16.size() * 2, cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemcpy(dkc, kc.data(), kc.size(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemcpy(dvc, vc.data(), vc.size(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemset(dout, 0xff, q16.size() * 2));  // poison: NaN bf16
  if (!k_scale.empty()) {
    if (g == nullptr) {
      void *ks_base, *vs_base;
      CUDA_REQUIRE(cudaMalloc(&ks_base, k_scale.size() * 4 + scale_guard));
      CUDA_REQUIRE(cudaMalloc(&vs_base, v_scale.size() * 4 + scale_guard));
      CUDA_REQUIRE(cudaMemset(ks_base, 0xff, scale_guard));  // NaN scales
      CUDA_REQUIRE(cudaMemset(vs_base, 0xff, scale_guard));
      dks = reinterpret_cast<float*>(static_cast<uint8_t*>(ks_base) + scale_guard);
      dvs = reinterpret_cast<float*>(static_cast<uint8_t*>(vs_base) + scale_guard);
    }
    CUDA_REQUIRE(cudaMemcpy(dks, k_scale.data(), k_scale.size() * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemcpy(dvs, v_scale.data(), v_scale.size() * 4, cudaMemcpyHostToDevice));
  }

  if (!sinks.empty()) {
    if (g != nullptr) {
      REQUIRE(g->dsinks != nullptr);
      dsinks = g->dsinks;
    } else {
      CUDA_REQUIRE(cudaMalloc(&dsinks, sinks.size() * 4));
    }
    CUDA_REQUIRE(cudaMemcpy(dsinks, sinks.data(), sinks.size() * 4, cudaMemcpyHostToDevice));
  }
  INFO(freed << " blocks freed");

  C8Shape shape{hq, hkv, D, bs, c.cache, c.scale};
  C8Attention own_attn(shape);
  C8Attention& attn = g ? *g->attn : own_attn;
  if (c.prefill_fmha) REQUIRE(attn.SetPrefillFmha(true).ok());
  C8PlanConfig pc = attn.plan_config();
  if (c.stages > 0) {  // a forced ring depth
    pc.decode_stages = c.stages;
    pc.ctas_per_sm = std::max(1, attn.decode_ctas_per_sm(c.stages));
  }
  pc.force_split = c.force_split;
  pc.min_chunk_tokens = 64;
  if (g) {
    pc.max_decode_items = attn.GraphItemCapacity(GraphShape{g->bucket, g->q});
    pc.decode_query_len = g->q;  // every row on decode tiles, as the backend's PlanGraph
  }
  const C8Plan plan = BuildC8Plan(shape, run_b, pc);
  if (c.force_split) CHECK(plan.num_partials > 0);
  if (g) {
    CHECK(static_cast<int>(plan.decode_items.size()) <= pc.max_decode_items);
    CHECK(plan.prefill_items.empty());
    const Status up = attn.UploadGraph(run_b, plan, GraphShape{g->bucket, g->q}, g->stream);
    INFO(up.ToString());
    REQUIRE(up.ok());
  } else {
    REQUIRE(attn.Upload(run_b, plan, nullptr).ok());
  }
  if (c.prefill_fmha) {
    // Prefill sequences (more query tokens than a decode tile) own one contiguous run of rows.
    int runs = 0;
    bool prev = false;
    for (int s = 0; s < b.num_seqs; ++s) {
      const int q_len = b.q_indptr[s + 1] - b.q_indptr[s];
      const bool pre = q_len > plan.decode_tile_tokens;
      runs += pre && !prev;
      if (q_len > 0) prev = pre;
    }
    CHECK(attn.step_uses_fmha() == (runs == 1));
  }
  C8Attention::LayerArgs la;
  la.q = dq;
  la.k_new = dk;
  la.v_new = dv;
  la.out = dout;
  la.k_cache = dkc;
  la.v_cache = dvc;
  la.k_scale = dks;
  la.v_scale = dvs;
  la.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
  la.window_left = c.window_left;
  la.sink_logits = dsinks;
  if (g == nullptr) {
    const Status st = attn.Run(la, nullptr);
    INFO(st.ToString());
    REQUIRE(st.ok());
  } else {
    CUDA_REQUIRE(cudaDeviceSynchronize());  // the legacy-stream copies above, before g->stream
    if (g->exec == nullptr) {  // first step of the bucket: capture (records, does not run)
      CUDA_REQUIRE(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
      const Status st = attn.Run(la, g->stream);
      cudaGraph_t graph = nullptr;
      CUDA_REQUIRE(cudaStreamEndCapture(g->stream, &graph));
      REQUIRE(st.ok());
      CUDA_REQUIRE(cudaGraphInstantiate(&g->exec, graph, 0));
      cudaGraphDestroy(graph);
    }
    CUDA_REQUIRE(cudaGraphLaunch(g->exec, g->stream));
    ++g->replays;
  }
  CUDA_REQUIRE(cudaDeviceSynchronize());

  // 1. Append: the new tokens' bytes (and dynamic scales) equal the host quantization.
  std::vector<uint8_t> kc_gpu(kc.size()), vc_gpu(vc.size());
  CUDA_REQUIRE(cudaMemcpy(kc_gpu.data(), dkc, kc.size(), cudaMemcpyDeviceToHost));
  CUDA_REQUIRE(cudaMemcpy(vc_gpu.data(), dvc, vc.size(), cudaMemcpyDeviceToHost));
  if (c.scale == ScaleMode::kPerToken) {
    std::vector<float> ks_gpu(k_scale.size()), vs_gpu(v_scale.size());
    CUDA_REQUIRE(cudaMemcpy(ks_gpu.data(), dks, ks_gpu.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_REQUIRE(cudaMemcpy(vs_gpu.data(), dvs, vs_gpu.size() * 4, cudaMemcpyDeviceToHost));
    k_scale = ks_gpu;  // checked below through the re-quantized bytes
    v_scale = vs_gpu;
  }
  std::vector<uint8_t> kc_expect = kc, vc_expect = vc;
  std::vector<float> ks_expect = k_scale, vs_expect = v_scale;
  for (int t = 0; t < T; ++t) {
    const int slot = b.slot_mapping[t], block = slot / bs, off = slot % bs;
    for (int h = 0; h < hkv; ++h) {
      for (int d = 0; d < D; ++d)
        row[d] = Bf16ToF32(k16[(static_cast<size_t>(t) * hkv + h) * D + d]);
      write_elem(kc_expect, ks_expect, block, h, off, row.data());
      for (int d = 0; d < D; ++d)
        row[d] = Bf16ToF32(v16[(static_cast<size_t>(t) * hkv + h) * D + d]);
      write_elem(vc_expect, vs_expect, block, h, off, row.data());
    }
  }
  CHECK(kc_gpu == kc_expect);
  CHECK(vc_gpu == vc_expect);
  if (c.scale == ScaleMode::kPerToken) {
    CHECK(ks_expect == k_scale);
    CHECK(vs_expect == v_scale);
  }

  // 2. Attention against the fp32 reference over the dequantized cache.
  std::vector<float> kf(cache_elems), vf(cache_elems);
  for (int block = 0; block < num_blocks; ++block) {
    for (int h = 0; h < hkv; ++h) {
      for (int off = 0; off < bs; ++off) {
        const size_t base = ((static_cast<size_t>(block) * hkv + h) * bs + off) * D;
        for (int d = 0; d < D; ++d) {
          if (eight) {
            kf[base + d] =
                Dequant(c.cache, kc_expect[base + d], scale_of(ks_expect, block, h, off, d));
            vf[base + d] =
                Dequant(c.cache, vc_expect[base + d], scale_of(vs_expect, block, h, off, d));
          } else {
            uint16_t kb, vb;
            std::memcpy(&kb, &kc_expect[(base + d) * 2], 2);
            std::memcpy(&vb, &vc_expect[(base + d) * 2], 2);
            kf[base + d] = Bf16ToF32(kb);
            vf[base + d] = Bf16ToF32(vb);
          }
        }
      }
    }
  }
  std::vector<float> qf(q16.size()), ref(q16.size());
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = Bf16ToF32(q16[i]);
  CpuPagedAttention({hq, hkv, D, bs}, b, qf.data(), kf.data(), vf.data(), la.softmax_scale,
                    ref.data(), c.window_left, 0.0f, sinks.empty() ? nullptr : sinks.data());
  std::vector<uint16_t> out16(q16.size());
  CUDA_REQUIRE(cudaMemcpy(out16.data(), dout, out16.size() * 2, cudaMemcpyDeviceToHost));
  double err2 = 0, ref2 = 0, max_err = 0;
  int non_finite = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float g = Bf16ToF32(out16[i]);
    if (!std::isfinite(g)) ++non_finite;
    const double e = static_cast<double>(g) - ref[i];
    err2 += e * e;
    ref2 += static_cast<double>(ref[i]) * ref[i];
    max_err = std::max(max_err, std::fabs(e));
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  INFO("relative L2 error " << rel << ", max abs error " << max_err);
  CHECK(non_finite == 0);  // every output element written (poison was NaN)
  // bf16 inputs, bf16 probabilities and a bf16 output: ~1e-3..5e-3 relative.
  CHECK(rel < 1e-2);
  CHECK(max_err < 5e-2);

  // 3. The same attention written as o_proj's e4m3 input (LayerArgs::out_fp8): every element is
  // the fp32 output times the inverse scale, rounded once to e4m3 and saturated, so it sits within
  // half an e4m3 step (2^-4 relative, or 2^-10 x scale below the normal range) of the bf16 output
  // (itself within 2^-9). The scale is what a model with a static cache uses (qmax x max V
  // scale) where there is one, else 1.5 x the largest output: either way some rows sit far below
  // it. Attend only: the cache already holds the new tokens.
  if (g == nullptr) {
    float bound = 0.f;
    if (c.scale == ScaleMode::kPerHead || c.scale == ScaleMode::kPerChannel) {
      bound = qmax * *std::max_element(v_scale.begin(), v_scale.end());
    } else {
      for (float x : ref) bound = std::max(bound, 1.5f * std::fabs(x));
    }
    const float scale = bound / kFp8E4M3Max;
    void* dout8;
    CUDA_REQUIRE(cudaMalloc(&dout8, ref.size()));
    CUDA_REQUIRE(cudaMemset(dout8, 0x7f, ref.size()));  // poison: e4m3 NaN
    C8Attention::LayerArgs la8 = la;
    la8.out = nullptr;
    la8.out_fp8 = dout8;
    la8.out_fp8_inv_scale = kFp8E4M3Max / bound;
    const Status st8 = attn.Attend(la8, nullptr);
    INFO(st8.ToString());
    REQUIRE(st8.ok());
    std::vector<uint8_t> out8(ref.size());
    CUDA_REQUIRE(cudaMemcpy(out8.data(), dout8, out8.size(), cudaMemcpyDeviceToHost));
    cudaFree(dout8);
    int bad = 0, nan8 = 0;
    double err8 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float got = DequantizeFp8(out8[i], scale);
      const float want = Bf16ToF32(out16[i]);
      if (!std::isfinite(got)) ++nan8;
      const double e = std::fabs(static_cast<double>(got) - want);
      err8 += (static_cast<double>(got) - ref[i]) * (got - ref[i]);
      const double tol = 0.066 * std::fabs(want) + std::ldexp(scale, -10) + 1e-6;
      if (e > tol && bad++ < 3)
        UNSCOPED_INFO("element " << i << ": fp8 " << got << " bf16 " << want);
    }
    INFO("fp8 output: relative L2 error " << std::sqrt(err8 / std::max(ref2, 1e-30)));
    CHECK(nan8 == 0);  // every element written
    CHECK(bad == 0);
    CHECK(std::sqrt(err8 / std::max(ref2, 1e-30)) < 0.05);  // e4m3: ~2% rms per element
  }

  if (g != nullptr) return;
  if (dsinks) cudaFree(dsinks);
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  cudaFree(static_cast<uint8_t*>(dkc) - guard);
  cudaFree(static_cast<uint8_t*>(dvc) - guard);
  if (dks) cudaFree(reinterpret_cast<uint8_t*>(dks) - scale_guard);
  if (dvs) cudaFree(reinterpret_cast<uint8_t*>(dvs) - scale_guard);
}

std::vector<std::pair<int, int>> MixedBatch(std::mt19937& rng) {
  // Decodes with 1..4 query tokens, a prefill chunk appended to a cached prefix, a fresh prompt.
  std::uniform_int_distribution<int> kv(1, 700);
  std::vector<std::pair<int, int>> seqs;
  for (int i = 0; i < 5; ++i) {
    const int q = 1 + i % 4;
    seqs.push_back({q, std::max(q, kv(rng))});
  }
  seqs.push_back({77, 77 + 131});  // append: chunk after a cached prefix
  seqs.push_back({150, 150});      // fresh prefill
  seqs.push_back({1, 1});          // first decode token of a one-token prompt
  std::shuffle(seqs.begin(), seqs.end(), rng);
  return seqs;
}

TEST_CASE("C8 attention matches the CPU reference", "[gpu][c8]") {
  GPU_TEST_RNG(rng);
  const std::pair<int, int> heads[] = {{8, 8}, {16, 4}, {32, 4}};  // GQA ratios 1, 4, 8
  const std::pair<CacheType, ScaleMode> modes[] = {
      {CacheType::kBf16, ScaleMode::kNone},          {CacheType::kInt8, ScaleMode::kPerHead},
      {CacheType::kInt8, ScaleMode::kPerChannel},    {CacheType::kFp8E4M3, ScaleMode::kPerHead},
      {CacheType::kFp8E4M3, ScaleMode::kPerChannel}, {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  for (auto [cache, scale] : modes) {
    for (auto [hq, hkv] : heads) {
      for (int d : {64, 128}) {
        for (int bs : {16, 64}) {
          for (bool split : {false, true}) {
            RunCase({hq, hkv, d, bs, cache, scale, split, MixedBatch(rng)}, rng);
          }
        }
      }
    }
  }
}

// MixedBatch with the prefill sequences (more than 16 / group query tokens: C8Plan's prefill
// tiles) moved behind the decodes, the scheduler's order (running sequences first, new prompts
// after).
std::vector<std::pair<int, int>> FmhaPrefillBatch(std::mt19937& rng, int group) {
  std::vector<std::pair<int, int>> seqs = MixedBatch(rng);
  std::stable_partition(seqs.begin(), seqs.end(),
                        [group](auto s) { return s.first * group <= 16; });
  return seqs;
}

TEST_CASE("C8 attention: prefill through the wgmma FMHA kernel matches the CPU reference",
          "[gpu][c8]") {
  if (!FmhaWgmmaAvailable()) {
    SUCCEED("no compute capability 9.0 device or no sm_90a in this build: nothing to run");
    return;
  }
  GPU_TEST_RNG(rng);
  // A 16-bit cache has no copy to make: the switch refuses it.
  C8Attention bf16({32, 8, 128, 64, CacheType::kBf16, ScaleMode::kNone});
  CHECK(bf16.SetPrefillFmha(true).code() == StatusCode::kInvalidArgument);
  const std::pair<int, int> heads[] = {{8, 8}, {16, 4}, {32, 4}, {28, 4}};  // GQA 1, 4, 8, 7
  const std::pair<CacheType, ScaleMode> modes[] = {
      {CacheType::kInt8, ScaleMode::kPerHead},       {CacheType::kInt8, ScaleMode::kPerChannel},
      {CacheType::kInt8, ScaleMode::kPerToken},      {CacheType::kFp8E4M3, ScaleMode::kPerHead},
      {CacheType::kFp8E4M3, ScaleMode::kPerChannel}, {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  for (auto [cache, scale] : modes) {
    for (auto [hq, hkv] : heads) {
      for (int d : {64, 128}) {
        for (int bs : {16, 64}) {
          Case c{hq, hkv, d, bs, cache, scale, false, FmhaPrefillBatch(rng, hq / hkv)};
          c.prefill_fmha = true;
          RunCase(c, rng);
        }
      }
    }
    // Long prompts (several FMHA row tiles and KV tiles), a lone long prefix (the launch splits
    // KV), and a shuffled batch (falls back to the tiles unless its prefills happen to be
    // adjacent).
    for (auto seqs : std::vector<std::vector<std::pair<int, int>>>{
             {{1, 900}, {3, 40}, {600, 600}, {311, 311}, {257, 900}},
             {{2, 2}, {40, 5000}},
             MixedBatch(rng)}) {
      Case c{32, 8, 128, 64, cache, scale, false, seqs};
      c.prefill_fmha = true;
      RunCase(c, rng);
    }
  }
}

TEST_CASE("C8 attention: every decode ring depth matches the CPU reference", "[gpu][c8]") {
  GPU_TEST_RNG(rng);
  const std::pair<CacheType, ScaleMode> modes[] = {{CacheType::kBf16, ScaleMode::kNone},
                                                   {CacheType::kInt8, ScaleMode::kPerChannel},
                                                   {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  for (auto [cache, scale] : modes) {
    for (int stages = 2; stages <= kC8MaxDecodeStages; ++stages) {
      for (int d : {64, 128}) {
        for (bool split : {false, true}) {
          RunCase({32, 8, d, 16, cache, scale, split, MixedBatch(rng), stages}, rng);
        }
      }
      // Long chunks: every stage of the ring wraps many times.
      RunCase({32, 8, 128, 64, cache, scale, false, {{1, 3001}, {2, 1999}}, stages}, rng);
    }
  }
}

TEST_CASE("C8 attention: long single-sequence decode splits KV and merges", "[gpu][c8]") {
  GPU_TEST_RNG(rng);
  for (auto cache : {CacheType::kBf16, CacheType::kInt8}) {
    const ScaleMode scale = cache == CacheType::kBf16 ? ScaleMode::kNone : ScaleMode::kPerHead;
    RunCase({32, 8, 128, 64, cache, scale, false, {{1, 4099}}}, rng);
    RunCase({32, 8, 128, 64, cache, scale, false, {{4, 3001}, {2, 17}}}, rng);
  }
}

TEST_CASE("C8 attention in CUDA graphs: one capture per bucket replays different decode steps",
          "[gpu][c8]") {
  GPU_TEST_RNG(rng);
  const std::pair<CacheType, ScaleMode> modes[] = {{CacheType::kBf16, ScaleMode::kNone},
                                                   {CacheType::kInt8, ScaleMode::kPerHead},
                                                   {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  constexpr int kMaxSeqs = 16, kMaxKv = 3000, kBs = 16;
  for (auto [cache, scale] : modes) {
    C8Attention attn({32, 8, 128, kBs, cache, scale});
    REQUIRE(attn.ReserveGraph(kMaxSeqs, kMaxSeqs * (kMaxKv / kBs + 1)).ok());
    GraphCtx g;
    g.attn = &attn;
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    // Enough for the largest step: the cache of kMaxSeqs x kMaxKv tokens plus slack, in bytes.
    g.cap = static_cast<size_t>(kMaxSeqs * (kMaxKv / kBs + 1) + 8) * 8 * kBs * 128 * 2;
    for (void** p : {&g.dq, &g.dk, &g.dv, &g.dout, &g.dkc, &g.dvc}) {
      CUDA_REQUIRE(cudaMalloc(p, g.cap));
    }
    CUDA_REQUIRE(cudaMalloc(&g.dks, g.cap));
    CUDA_REQUIRE(cudaMalloc(&g.dvs, g.cap));
    std::uniform_int_distribution<int> kv(1, kMaxKv);
    for (int bucket : {1, 8, 16}) {
      g.bucket = bucket;
      g.exec = nullptr;
      g.replays = 0;
      // Steps of the bucket: full, then fewer sequences (padding rows), long and short contexts.
      for (int n : {bucket, std::max(1, bucket - 3), std::max(1, bucket / 2 + 1)}) {
        std::vector<std::pair<int, int>> seqs;
        for (int i = 0; i < n; ++i) seqs.push_back({1, kv(rng)});
        RunCase({32, 8, 128, kBs, cache, scale, false, seqs}, rng, &g);
      }
      CHECK(g.replays == 3);
      cudaGraphExecDestroy(g.exec);
    }
    for (void* p : {g.dq, g.dk, g.dv, g.dout, g.dkc, g.dvc}) cudaFree(p);
    cudaFree(g.dks);
    cudaFree(g.dvs);
    cudaStreamDestroy(g.stream);
  }
}

// Verify steps (issue 52): q = 2..5 query rows per sequence from one capture per (bucket, q),
// against the CPU reference. GQA 4 (32 / 8 heads) puts 4 rows of a sequence in one decode tile, so
// 5 take two; GQA 8 (16 / 2) puts 2, so 3..5 take two or three (C8PlanConfig::decode_query_len).
TEST_CASE("C8 attention in CUDA graphs: verify steps of 2 to 5 rows per sequence",
          "[gpu][c8][speculative_graph]") {
  GPU_TEST_RNG(rng);
  const std::pair<CacheType, ScaleMode> modes[] = {{CacheType::kBf16, ScaleMode::kNone},
                                                   {CacheType::kInt8, ScaleMode::kPerHead},
                                                   {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  constexpr int kMaxSeqs = 8, kMaxKv = 2000, kBs = 16, kMaxQ = 5;
  for (auto [hq, hkv] : {std::pair{32, 8}, {16, 2}}) {
    for (auto [cache, scale] : modes) {
      C8Attention attn({hq, hkv, 128, kBs, cache, scale});
      REQUIRE(attn.ReserveGraph(kMaxSeqs, kMaxSeqs * (kMaxKv / kBs + 1), kMaxQ).ok());
      GraphCtx g;
      g.attn = &attn;
      CUDA_REQUIRE(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
      g.cap = static_cast<size_t>(kMaxSeqs * (kMaxKv / kBs + 1) + 8) * 8 * kBs * 128 * 2;
      for (void** p : {&g.dq, &g.dk, &g.dv, &g.dout, &g.dkc, &g.dvc}) {
        CUDA_REQUIRE(cudaMalloc(p, g.cap));
      }
      CUDA_REQUIRE(cudaMalloc(&g.dks, g.cap));
      CUDA_REQUIRE(cudaMalloc(&g.dvs, g.cap));
      std::uniform_int_distribution<int> kv(kMaxQ, kMaxKv);
      for (int q = 2; q <= kMaxQ; ++q) {
        for (int bucket : {1, 8}) {
          g.bucket = bucket;
          g.q = q;
          g.exec = nullptr;
          g.replays = 0;
          for (int n : {bucket, std::max(1, bucket - 3)}) {
            std::vector<std::pair<int, int>> seqs;
            for (int i = 0; i < n; ++i) seqs.push_back({q, kv(rng)});
            RunCase({hq, hkv, 128, kBs, cache, scale, false, seqs}, rng, &g);
          }
          CHECK(g.replays == 2);
          cudaGraphExecDestroy(g.exec);
        }
      }
      for (void* p : {g.dq, g.dk, g.dv, g.dout, g.dkc, g.dvc}) cudaFree(p);
      cudaFree(g.dks);
      cudaFree(g.dvs);
      cudaStreamDestroy(g.stream);
    }
  }
}

// ---- Sliding windows and sink logits (gpt-oss, Mistral, Qwen2's window layers).

constexpr int kWindows[] = {0, 5, 37, 127, 300};  // the diagonal alone .. wider than most contexts

const std::pair<CacheType, ScaleMode> kWindowModes[] = {
    {CacheType::kBf16, ScaleMode::kNone},       {CacheType::kInt8, ScaleMode::kPerHead},
    {CacheType::kInt8, ScaleMode::kPerChannel}, {CacheType::kInt8, ScaleMode::kPerToken},
    {CacheType::kFp8E4M3, ScaleMode::kPerHead}, {CacheType::kFp8E4M3, ScaleMode::kPerChannel},
    {CacheType::kFp8E4M3, ScaleMode::kPerToken}};

TEST_CASE("C8 attention with sliding windows and sink logits matches the CPU reference",
          "[gpu][c8][c8_window]") {
  GPU_TEST_RNG(rng);
  const std::pair<int, int> heads[] = {{16, 4}, {64, 8}};  // GQA 4; gpt-oss-20b's 64 / 8
  int n = 0;
  for (auto [cache, scale] : kWindowModes) {
    for (auto [hq, hkv] : heads) {
      for (int d : {64, 128}) {
        for (int bs : {16, 64}) {
          for (bool split : {false, true}) {
            Case c{hq, hkv, d, bs, cache, scale, split, MixedBatch(rng)};
            // Every window with and without sinks, freed and kept blocks, across the modes.
            c.window_left = n % 6 == 5 ? -1 : kWindows[n % 5];
            c.sinks = n % 3 != 1;
            c.free_blocks = n % 4 != 3;
            ++n;
            RunCase(c, rng);
          }
        }
      }
    }
  }
}

// Long decodes: many KV tiles per CTA through every ring depth, and (split) chunks wholly left of
// the window, whose partials are empty (lse -inf) in the merge that adds the sink.
TEST_CASE("C8 attention: windows and sinks through every decode ring and long split decodes",
          "[gpu][c8][c8_window]") {
  GPU_TEST_RNG(rng);
  const std::pair<CacheType, ScaleMode> modes[] = {{CacheType::kBf16, ScaleMode::kNone},
                                                   {CacheType::kInt8, ScaleMode::kPerHead},
                                                   {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  for (auto [cache, scale] : modes) {
    for (int stages = 2; stages <= kC8MaxDecodeStages; ++stages) {
      for (bool split : {false, true}) {
        for (int window : {127, 1000}) {
          Case c{64, 8, 64, 16, cache, scale, split, {{1, 3001}, {4, 1999}, {2, 130}}, stages};
          c.window_left = window;
          c.sinks = true;
          RunCase(c, rng);
        }
      }
    }
    // The planner's own split of one long sequence (no forced chunking).
    Case c{32, 8, 128, 64, cache, scale, false, {{1, 4099}}};
    c.window_left = 127;
    c.sinks = true;
    RunCase(c, rng);
  }
}

TEST_CASE("C8 attention: prefill through the wgmma FMHA kernel honors windows and sinks",
          "[gpu][c8][c8_window]") {
  if (!FmhaWgmmaAvailable()) {
    SUCCEED("no compute capability 9.0 device or no sm_90a in this build: nothing to run");
    return;
  }
  GPU_TEST_RNG(rng);
  int n = 0;
  for (auto [cache, scale] : kWindowModes) {
    if (cache == CacheType::kBf16) continue;  // the copy is of 8-bit caches only
    for (auto [hq, hkv] : {std::pair{32, 4}, std::pair{64, 8}}) {
      for (int d : {64, 128}) {
        for (int bs : {16, 64}) {
          Case c{hq, hkv, d, bs, cache, scale, false, FmhaPrefillBatch(rng, hq / hkv)};
          c.prefill_fmha = true;
          c.window_left = kWindows[n % 5];
          c.sinks = n % 2 == 0;
          c.free_blocks = n % 3 != 2;
          ++n;
          RunCase(c, rng);
        }
      }
    }
    // The C8 prefill tiles (c8_prefill tiles) on the same batches.
    Case c{64, 8, 64, 16, cache, scale, false, FmhaPrefillBatch(rng, 8)};
    c.window_left = 127;
    c.sinks = true;
    RunCase(c, rng);
  }
}

TEST_CASE("C8 attention in CUDA graphs with windows and sinks: one capture per bucket",
          "[gpu][c8][c8_window]") {
  GPU_TEST_RNG(rng);
  const std::pair<CacheType, ScaleMode> modes[] = {{CacheType::kBf16, ScaleMode::kNone},
                                                   {CacheType::kInt8, ScaleMode::kPerChannel},
                                                   {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  constexpr int kMaxSeqs = 16, kMaxKv = 3000, kBs = 16, kHq = 64, kHkv = 8, kD = 64;
  for (auto [cache, scale] : modes) {
    C8Attention attn({kHq, kHkv, kD, kBs, cache, scale});
    REQUIRE(attn.ReserveGraph(kMaxSeqs, kMaxSeqs * (kMaxKv / kBs + 1)).ok());
    GraphCtx g;
    g.attn = &attn;
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    g.cap = static_cast<size_t>(kMaxSeqs * (kMaxKv / kBs + 1) + 8) * kHkv * kBs * kD * 2;
    for (void** p : {&g.dq, &g.dk, &g.dv, &g.dout, &g.dkc, &g.dvc}) {
      CUDA_REQUIRE(cudaMalloc(p, g.cap));
    }
    CUDA_REQUIRE(cudaMalloc(&g.dks, g.cap));
    CUDA_REQUIRE(cudaMalloc(&g.dvs, g.cap));
    CUDA_REQUIRE(cudaMalloc(&g.dsinks, kHq * sizeof(float)));
    std::uniform_int_distribution<int> kv(1, kMaxKv);
    for (int bucket : {1, 8, 16}) {
      g.bucket = bucket;
      g.exec = nullptr;
      g.replays = 0;
      for (int n : {bucket, std::max(1, bucket - 3), std::max(1, bucket / 2 + 1)}) {
        std::vector<std::pair<int, int>> seqs;
        for (int i = 0; i < n; ++i) seqs.push_back({1, kv(rng)});
        Case c{kHq, kHkv, kD, kBs, cache, scale, false, seqs};
        c.window_left = 127;  // one layer: the captured launch keeps its window
        c.sinks = true;
        RunCase(c, rng, &g);
      }
      CHECK(g.replays == 3);
      cudaGraphExecDestroy(g.exec);
    }
    for (void* p : {g.dq, g.dk, g.dv, g.dout, g.dkc, g.dvc}) cudaFree(p);
    cudaFree(g.dks);
    cudaFree(g.dvs);
    cudaFree(g.dsinks);
    cudaStreamDestroy(g.stream);
  }
}

}  // namespace
}  // namespace llm::cuda
