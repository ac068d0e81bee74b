// The benchmark of the fp8 expert GEMMs at DeepSeek-V3's shapes (hidden 7168, expert
// intermediate 2048, 256 experts top-8, one shared expert; 128x128 block scales): W8A8 (the e4m3
// tensor cores, with the activation quantization kernels it needs: x per token and 128-wide
// group before gate_up, the routed and shared activations before down) against W8A16
// (LaunchMoeGemm: each weight widened to bf16) at batch 1, 16, 64, 128 and 256, each GEMM beside
// its floor: the weight bytes (and block scales) of the experts the batch touches, plus the
// shared expert's, over the copy rate measured in the same run. Each stage is a CUDA graph
// replayed ten times between two events, best of five; one layer's experts (11.3 GB) never fit
// the L2.
//
//   build/cuda/tests/gpu_tests "[.bench][moe_fp8]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "engine/layers/cuda/cuda_weights.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/ops/fp8_quant.h"
#include "tests/gpu/copy_rate.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

// Fills `bytes` of device memory with random e4m3 codes of N(0, 64) values (no NaN code).
void FillFp8(void* dst, size_t bytes, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> chunk(64u << 20);
  for (uint8_t& v : chunk) v = FloatToFp8E4M3(64.f * nd(rng));
  for (size_t off = 0; off < bytes; off += chunk.size()) {
    const size_t n = std::min(chunk.size(), bytes - off);
    CUDA_REQUIRE(
        cudaMemcpy(static_cast<uint8_t*>(dst) + off, chunk.data(), n, cudaMemcpyHostToDevice));
  }
}

template <typename T>
void UploadTo(DeviceBuffer* b, const std::vector<T>& h) {
  REQUIRE(b->Alloc(std::max<size_t>(h.size() * sizeof(T), 16)).ok());
  CUDA_REQUIRE(cudaMemcpy(b->ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// Microseconds per run of `stage` captured in a graph: ten replays between two events, best of
// five.
double TimeStage(cudaStream_t stream, const std::function<void()>& stage) {
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  stage();
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CUDA_REQUIRE(cudaEventCreate(&e0));
  CUDA_REQUIRE(cudaEventCreate(&e1));
  CUDA_REQUIRE(cudaGraphLaunch(exec, stream));  // warm-up
  float best = 1e30f;
  for (int round = 0; round < 5; ++round) {
    CUDA_REQUIRE(cudaEventRecord(e0, stream));
    for (int i = 0; i < 10; ++i) CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    CUDA_REQUIRE(cudaEventRecord(e1, stream));
    CUDA_REQUIRE(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms / 10);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return best * 1e3;
}

TEST_CASE("MoE fp8 expert GEMMs benchmark: DeepSeek-V3 shapes, W8A8 against W8A16",
          "[.bench][moe_fp8]") {
  REQUIRE(cuda::MoeW8a8Available());
  constexpr int E = 256, K = 8, H = 7168, I = 2048, SI = 2048;
  std::mt19937 rng(7);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  const int bl_h = H / 128, bl_i = I / 128;
  DeviceBuffer gu, dn, sgu, sdn, gu_s, dn_s, sgu_s, sdn_s;
  REQUIRE(gu.Alloc(size_t{E} * 2 * I * H).ok());
  REQUIRE(dn.Alloc(size_t{E} * H * I).ok());
  REQUIRE(sgu.Alloc(size_t{2} * SI * H).ok());
  REQUIRE(sdn.Alloc(size_t{H} * SI).ok());
  FillFp8(gu.ptr, gu.bytes, rng);
  FillFp8(dn.ptr, dn.bytes, rng);
  FillFp8(sgu.ptr, sgu.bytes, rng);
  FillFp8(sdn.ptr, sdn.bytes, rng);
  // weight_scale_inv-like block scales around 1 / (64 sqrt(k)).
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  auto scales = [&](size_t n, int k) {
    std::vector<float> v(n);
    for (float& x : v) x = ud(rng) / (64.f * std::sqrt(static_cast<float>(k)));
    return v;
  };
  UploadTo(&gu_s, scales(size_t{E} * (2 * I / 128) * bl_h, H));
  UploadTo(&dn_s, scales(size_t{E} * (H / 128) * bl_i, I));
  UploadTo(&sgu_s, scales(size_t{2 * SI / 128} * bl_h, H));
  UploadTo(&sdn_s, scales(size_t{H / 128} * bl_i, SI));
  cuda::MoeGemmScales gu_v{gu_s.as<float>(), (2 * I / 128) * bl_h, 0, bl_h};
  cuda::MoeGemmScales dn_v{dn_s.as<float>(), (H / 128) * bl_i, 0, bl_i};
  cuda::MoeGemmScales sgu_v{sgu_s.as<float>(), 0, 0, bl_h};
  cuda::MoeGemmScales sdn_v{sdn_s.as<float>(), 0, 0, bl_i};

  const double copy_rate = gpu_test::MeasureCopyRate(stream);
  std::printf("copy rate %.2f TB/s (read + write); %% = floor / time\n", copy_rate / 1e12);
  // tile: the W8A8 GEMMs' tile rows (W8A16's are 16); experts: those the batch touches.
  std::printf("%-5s %-7s %4s %7s %9s %9s %6s %9s %6s %7s\n", "batch", "gemm", "tile", "experts",
              "floor us", "W8A16 us", "%", "W8A8 us", "%", "speedup");
  const int max_T = 256, max_S = max_T * K;
  DeviceBuffer x, xq, xs, act, actq, as, sact, sactq, sas, y, sy, ids, sorted, slot_of, tiles,
      num_tiles;
  REQUIRE(x.Alloc(size_t{max_T} * H * 2).ok());
  REQUIRE(xq.Alloc(size_t{max_T} * H).ok());
  REQUIRE(xs.Alloc(size_t{max_T} * bl_h * 4).ok());
  REQUIRE(act.Alloc(size_t{max_S} * I * 2).ok());
  REQUIRE(actq.Alloc(size_t{max_S} * I).ok());
  REQUIRE(as.Alloc(size_t{max_S} * bl_i * 4).ok());
  REQUIRE(sact.Alloc(size_t{max_T} * SI * 2).ok());
  REQUIRE(sactq.Alloc(size_t{max_T} * SI).ok());
  REQUIRE(sas.Alloc(size_t{max_T} * bl_i * 4).ok());
  REQUIRE(y.Alloc(size_t{max_S} * H * 2).ok());
  REQUIRE(sy.Alloc(size_t{max_T} * H * 2).ok());
  REQUIRE(ids.Alloc(size_t{max_S} * 4).ok());
  REQUIRE(sorted.Alloc(size_t{max_S} * 4).ok());
  REQUIRE(slot_of.Alloc(size_t{max_S} * 4).ok());
  REQUIRE(tiles.Alloc(static_cast<size_t>(cuda::MoeMaxTiles(max_S, E, max_T)) * 3 * 4 + 16).ok());
  REQUIRE(num_tiles.Alloc(16).ok());
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const int T : {1, 16, 64, 128, 256}) {
    const int S = T * K;
    std::vector<uint16_t> hx(static_cast<size_t>(T) * H);
    for (auto& v : hx) v = F32ToBf16(nd(rng));
    CUDA_REQUIRE(cudaMemcpy(x.ptr, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    std::vector<int32_t> hid(S);
    std::set<int> touched;
    std::uniform_int_distribution<int> pick(0, E - 1);
    for (int t = 0; t < T; ++t) {
      std::set<int> mine;
      while (static_cast<int>(mine.size()) < K) mine.insert(pick(rng));
      int k = 0;
      for (const int e : mine) hid[static_cast<size_t>(t) * K + k++] = e, touched.insert(e);
    }
    CUDA_REQUIRE(cudaMemcpy(ids.ptr, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));
    const double n_exp = static_cast<double>(touched.size());
    const double gu_bytes = n_exp * (2.0 * I * H + (2.0 * I / 128) * bl_h * 4) + 2.0 * SI * H;
    const double dn_bytes = n_exp * (1.0 * H * I + (1.0 * H / 128) * bl_i * 4) + 1.0 * H * SI;
    auto permute = [&](int tile_rows) {
      cuda::MoePermuteArgs pa;
      pa.topk_ids = ids.as<int32_t>();
      pa.num_slots = S;
      pa.num_experts = E;
      pa.top_k = K;
      pa.dense_rows = T;
      pa.tile_rows = tile_rows;
      pa.sorted_token = sorted.as<int32_t>();
      pa.slot_of = slot_of.as<int32_t>();
      pa.tiles = tiles.as<int32_t>();
      pa.num_tiles = num_tiles.as<int32_t>();
      cuda::LaunchMoePermute(pa, stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
    };
    auto args = [&](int tile_rows) {
      cuda::MoeGemmArgs g;
      g.sorted_token = sorted.as<int32_t>();
      g.w = gu.ptr;
      g.w_scale = gu_v;
      g.fp8 = true;
      g.silu_mul = true;
      g.n_out = I;
      g.k = H;
      g.tile_rows = tile_rows;
      g.tiles = tiles.as<int32_t>();
      g.num_tiles = num_tiles.as<int32_t>();
      g.max_tiles = cuda::MoeMaxTiles(S, E, T, tile_rows);
      g.out = act.ptr;
      g.dense_w = sgu.ptr;
      g.dense_w_scale = sgu_v;
      g.dense_n_out = SI;
      g.dense_k = H;
      g.dense_out = sact.ptr;
      return g;
    };
    auto to_down = [&](cuda::MoeGemmArgs g) {
      g.sorted_token = nullptr;
      g.w = dn.ptr;
      g.w_scale = dn_v;
      g.silu_mul = false;
      g.n_out = H;
      g.k = I;
      g.out = y.ptr;
      g.dense_w = sdn.ptr;
      g.dense_w_scale = sdn_v;
      g.dense_n_out = H;
      g.dense_k = SI;
      g.dense_out = sy.ptr;
      return g;
    };
    // W8A16: bf16 activations, 16-row tiles.
    permute(cuda::kMoeTileRows);
    cuda::MoeGemmArgs a16 = args(cuda::kMoeTileRows);
    a16.x = x.ptr;
    a16.dense_x = x.ptr;
    cuda::MoeGemmArgs d16 = to_down(a16);
    d16.x = act.ptr;
    d16.dense_x = sact.ptr;
    const double gu16 = TimeStage(stream, [&] { cuda::LaunchMoeGemm(a16, stream); });
    const double dn16 = TimeStage(stream, [&] { cuda::LaunchMoeGemm(d16, stream); });
    // W8A8: e4m3 activations per token and 128-wide group, tiles of MoeMxfp4TileRows rows.
    const int tile = cuda::MoeMxfp4TileRows(T, K, E);
    permute(tile);
    cuda::MoeGemmArgs a8 = args(tile);
    a8.x = xq.ptr;
    a8.x_scale = xs.as<float>();
    a8.x_scale_ld = T;
    a8.dense_x = xq.ptr;
    a8.dense_x_scale = xs.as<float>();
    a8.dense_x_scale_ld = T;
    cuda::MoeGemmArgs d8 = to_down(a8);
    d8.x = actq.ptr;
    d8.x_scale = as.as<float>();
    d8.x_scale_ld = S;
    d8.dense_x = sactq.ptr;
    d8.dense_x_scale = sas.as<float>();
    d8.dense_x_scale_ld = T;
    bool launched = true;
    const double gu8 = TimeStage(stream, [&] {
      cuda::LaunchQuantizeBlocks128Fp8(x.ptr, T, H, xq.ptr, xs.as<float>(), T, stream);
      launched = cuda::LaunchMoeGemmW8a8(a8, stream) && launched;
    });
    const double dn8 = TimeStage(stream, [&] {
      cuda::LaunchQuantizeBlocks128Fp8(act.ptr, S, I, actq.ptr, as.as<float>(), S, stream);
      cuda::LaunchQuantizeBlocks128Fp8(sact.ptr, T, SI, sactq.ptr, sas.as<float>(), T, stream);
      launched = cuda::LaunchMoeGemmW8a8(d8, stream) && launched;
    });
    REQUIRE(launched);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CUDA_REQUIRE(cudaGetLastError());
    auto row = [&](const char* name, double bytes, double t16, double t8) {
      const double floor_us = bytes / copy_rate * 1e6;
      std::printf("%-5d %-7s %4d %7d %9.1f %9.1f %5.0f%% %9.1f %5.0f%% %6.2fx\n", T, name, tile,
                  static_cast<int>(n_exp), floor_us, t16, 100 * floor_us / t16, t8,
                  100 * floor_us / t8, t16 / t8);
    };
    row("gate_up", gu_bytes, gu16, gu8);
    row("down", dn_bytes, dn16, dn8);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace llm
