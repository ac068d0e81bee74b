// fp8 (e4m3) projection weights on the GPU: the per-tensor (weights) and per-row (activations)
// quantization kernels bit for bit against base/quant.h, the cuBLASLt fp8 GEMM against a
// host product of the same quantized operands, and a whole Llama with fp8 weights against the same
// model with bf16 weights.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/quant.h"
#include "engine/layers/cuda/cuda_fp8_gemm.h"
#include "kernels/cuda/ops/fp8_quant.h"
#include "tests/gpu/engine_generate.h"
#include "tests/gpu/fp8_gemm_check.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/random_llama.h"

namespace llm {
namespace {

using gpu_test::GemmDims;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

// Host model of the device quantization: scale from the tensor's absmax, bytes per element.
float HostQuantize(const std::vector<uint16_t>& x, std::vector<uint8_t>* q) {
  float amax = 0.f;
  for (uint16_t b : x) amax = std::max(amax, std::fabs(Bf16ToF32(b)));
  const float scale = DynamicScale(amax, kFp8E4M3Max);
  q->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) (*q)[i] = QuantizeFp8(Bf16ToF32(x[i]), scale);
  return scale;
}

TEST_CASE("fp8 weights: quantization and the cuBLASLt GEMM match the host definition",
          "[gpu][fp8]") {
  GPU_TEST_RNG(rng);
  gpu_test::Fp8GemmPair gemms;
  for (const GemmDims d : {GemmDims{1, 64, 256}, GemmDims{13, 512, 4096}, GemmDims{16, 1024, 14336},
                           GemmDims{37, 6144, 4096}, GemmDims{256, 256, 512}}) {
    INFO("m " << d.m << " n " << d.n << " k " << d.k);
    const int rows = (d.m + 15) / 16 * 16;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> x(static_cast<size_t>(d.m) * d.k), w(static_cast<size_t>(d.n) * d.k);
    for (auto& v : x) v = F32ToBf16(nd(rng) * 3.f);
    for (auto& v : w) v = F32ToBf16(nd(rng) * 0.02f);
    std::vector<uint8_t> qx, qw;
    const float sx = HostQuantize(x, &qx), sw = HostQuantize(w, &qw);

    void *dx, *dw, *dqx, *dqw, *dy;
    float* dsc;  // 16-byte slots: [amax x, amax w, scale x, scale w]
    CUDA_REQUIRE(cudaMalloc(&dx, x.size() * 2));
    CUDA_REQUIRE(cudaMalloc(&dw, w.size() * 2));
    CUDA_REQUIRE(cudaMalloc(&dqx, static_cast<size_t>(rows) * d.k));
    CUDA_REQUIRE(cudaMalloc(&dqw, w.size()));
    CUDA_REQUIRE(cudaMalloc(&dy, static_cast<size_t>(rows) * d.n * 2));
    CUDA_REQUIRE(cudaMalloc(&dsc, 16 * sizeof(float)));
    CUDA_REQUIRE(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemset(dqx, 0, static_cast<size_t>(rows) * d.k));  // padding rows: zeros
    CUDA_REQUIRE(cudaMemset(dsc, 0, 16 * sizeof(float)));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    cuda::LaunchAbsMaxBf16(dx, static_cast<int64_t>(x.size()), dsc + 0, gemms.stream);
    cuda::LaunchQuantizeFp8(dx, static_cast<int64_t>(x.size()), dsc + 0, dsc + 8, dqx,
                            gemms.stream);
    cuda::LaunchAbsMaxBf16(dw, static_cast<int64_t>(w.size()), dsc + 4, gemms.stream);
    cuda::LaunchQuantizeFp8(dw, static_cast<int64_t>(w.size()), dsc + 4, dsc + 12, dqw,
                            gemms.stream);
    const Status st = gemms.gemm.Run(dqx, dsc + 8, dqw, dsc + 12, rows, d.n, d.k, dy);
    INFO(st.ToString());
    REQUIRE(st.ok());
    CUDA_REQUIRE(cudaStreamSynchronize(gemms.stream));

    // 1. Quantization: scales and bytes exactly as the host definition.
    float sc[16];
    CUDA_REQUIRE(cudaMemcpy(sc, dsc, sizeof(sc), cudaMemcpyDeviceToHost));
    CHECK(sc[8] == sx);
    CHECK(sc[12] == sw);
    std::vector<uint8_t> gqx(qx.size()), gqw(qw.size());
    CUDA_REQUIRE(cudaMemcpy(gqx.data(), dqx, gqx.size(), cudaMemcpyDeviceToHost));
    CUDA_REQUIRE(cudaMemcpy(gqw.data(), dqw, gqw.size(), cudaMemcpyDeviceToHost));
    CHECK(gqx == qx);
    CHECK(gqw == qw);

    // 2. GEMM: y = sx * sw * (qx . qw^T) in fp32, rounded to bf16.
    std::vector<float> fx(qx.size()), fw(qw.size());
    for (size_t i = 0; i < qx.size(); ++i) fx[i] = Fp8E4M3ToFloat(qx[i]);
    for (size_t i = 0; i < qw.size(); ++i) fw[i] = Fp8E4M3ToFloat(qw[i]);
    std::vector<double> want(static_cast<size_t>(d.m) * d.n);
    for (int i = 0; i < d.m; ++i) {
      for (int j = 0; j < d.n; ++j) {
        double acc = 0;
        for (int t = 0; t < d.k; ++t) {
          acc += static_cast<double>(fx[static_cast<size_t>(i) * d.k + t]) *
                 fw[static_cast<size_t>(j) * d.k + t];
        }
        want[static_cast<size_t>(i) * d.n + j] = acc * sx * sw;
      }
    }
    // fp32 accumulation: the bound is the bf16 output rounding (~2e-3) over exact products.
    gpu_test::CheckBf16Rows("fp32 accumulation", dy, want, d.m, d.n, 5e-3, 2e-2);
    // Fast accumulation keeps partial sums in the tensor cores' narrower accumulator: DeepSeek-V3's
    // report gives Hopper's ~14 significant bits and up to ~2% relative error at k = 4096. The
    // bound is that figure; a wrong scale or layout is off by O(1).
    const Status fast_st = gemms.fast_gemm.Run(dqx, dsc + 8, dqw, dsc + 12, rows, d.n, d.k, dy);
    INFO(fast_st.ToString());
    REQUIRE(fast_st.ok());
    CUDA_REQUIRE(cudaStreamSynchronize(gemms.stream));
    gpu_test::CheckBf16Rows("fast accumulation", dy, want, d.m, d.n, 2.5e-2, 8e-2);
    for (void* p : {dx, dw, dqx, dqw, dy, static_cast<void*>(dsc)}) cudaFree(p);
  }
}

// Per-row activation quantization (the attention output before o_proj): every row's scale and
// bytes exactly as quant.h defines them for that row alone, on the 16-byte path and the scalar one;
// then the row scales applied back to the rows (LaunchScaleRowsBf16, an fp8 GEMM's output): every
// value bf16(x * scale), on both paths too.
TEST_CASE("fp8 weights: per-row activation quantization matches the host definition",
          "[gpu][fp8]") {
  GPU_TEST_RNG(rng);
  for (int cols : {4096, 4100, 24}) {
    for (int rows : {1, 7, 300}) {
      INFO("rows " << rows << " cols " << cols);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<uint16_t> x(static_cast<size_t>(rows) * cols);
      for (size_t i = 0; i < x.size(); ++i) {
        // Rows of very different magnitudes, and one all-zero row (scale 1).
        const int r = static_cast<int>(i / cols);
        x[i] = F32ToBf16(r == 1 ? 0.f : nd(rng) * std::ldexp(1.f, r % 9 - 4));
      }
      void* dx;
      void* dq;
      float* ds;
      CUDA_REQUIRE(cudaMalloc(&dx, x.size() * 2));
      CUDA_REQUIRE(cudaMalloc(&dq, x.size()));
      CUDA_REQUIRE(cudaMalloc(&ds, rows * sizeof(float)));
      CUDA_REQUIRE(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
      cuda::LaunchQuantizeRowsFp8(dx, rows, cols, {dq, ds}, nullptr);
      std::vector<uint8_t> q(x.size());
      std::vector<float> scales(rows);
      CUDA_REQUIRE(cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost));
      CUDA_REQUIRE(cudaMemcpy(scales.data(), ds, rows * sizeof(float), cudaMemcpyDeviceToHost));
      int bad_scales = 0, bad_bytes = 0;
      for (int r = 0; r < rows; ++r) {
        const std::vector<uint16_t> row(x.begin() + static_cast<size_t>(r) * cols,
                                        x.begin() + static_cast<size_t>(r + 1) * cols);
        std::vector<uint8_t> want;
        bad_scales += HostQuantize(row, &want) != scales[r];
        for (int i = 0; i < cols; ++i) bad_bytes += want[i] != q[static_cast<size_t>(r) * cols + i];
      }
      CHECK(bad_scales == 0);
      CHECK(bad_bytes == 0);
      CHECK(scales[std::min(1, rows - 1)] == (rows > 1 ? 1.f : scales[0]));
      cuda::LaunchScaleRowsBf16(dx, ds, rows, cols, nullptr);
      std::vector<uint16_t> y(x.size());
      CUDA_REQUIRE(cudaMemcpy(y.data(), dx, y.size() * 2, cudaMemcpyDeviceToHost));
      int bad_scaled = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        bad_scaled += y[i] != F32ToBf16(Bf16ToF32(x[i]) * scales[i / cols]);
      }
      CHECK(bad_scaled == 0);
      for (void* p : {dx, dq, static_cast<void*>(ds)}) cudaFree(p);
    }
  }
}

std::vector<std::vector<int32_t>> RandomPrompts(std::mt19937& rng) {
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {3, 29, 64, 1, 17}) {
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 600);
    prompts.push_back(p);
  }
  return prompts;
}

TEST_CASE("fp8 weights: a whole Llama tracks the bf16-weight model", "[gpu][fp8]") {
  const std::string dir = gpu_test::WriteRandomLlama("llama_fp8w");
  std::mt19937 rng(9);
  const auto prompts = RandomPrompts(rng);
  gpu_test::Logits bf16_logits, fp8_logits;
  const auto bf16 = gpu_test::Generate(dir, prompts, {.steps = 8, .logits = &bf16_logits});
  gpu_test::GenerateOptions o{.steps = 8, .logits = &fp8_logits};
  o.weight_dtype = "fp8";
  o.fp8_fast_accumulation = false;  // fp32 promotion; the default (fast) follows below
  const auto fp8 = gpu_test::Generate(dir, prompts, o);
  // The first step's logits (the prompt's last row) of every request. e4m3 keeps 3 mantissa bits
  // (~2-4% rms rounding per element); 3 layers x 4 projections, each quantizing weights and
  // activations, compound to ~10%, so 0.2 leaves room. A wrong scale or layout is off by O(1).
  auto distance = [&](const gpu_test::Logits& logits, size_t i) {
    return gpu_test::FirstStepDistance(bf16_logits, logits, i);
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double rel = distance(fp8_logits, i);
    INFO("prompt " << i << ": fp8 vs bf16 weights, relative L2 error of the logits " << rel);
    CHECK(rel < 0.2);
    CHECK(fp8.tokens[i].size() == 8);
  }
  CHECK(fp8.graph_steps > 0);  // fp8 GEMMs and activation quantization inside decode graphs

  // The same with the projections' fast accumulation (ModelLoadOptions::fp8_fast_accumulation,
  // the default): within the same bound of the bf16-weight model.
  gpu_test::Logits fast_logits;
  gpu_test::GenerateOptions f{.steps = 8, .logits = &fast_logits};
  f.weight_dtype = "fp8";
  f.fp8_fast_accumulation = true;
  const auto fast = gpu_test::Generate(dir, prompts, f);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double rel = distance(fast_logits, i);
    INFO("prompt " << i << ": fp8 (fast accumulation) vs bf16 weights, relative L2 error " << rel);
    CHECK(rel < 0.2);
    CHECK(fast.tokens[i].size() == 8);
  }
  std::filesystem::remove_all(dir);
}

// With a static int8 cache the attention writes o_proj's e4m3 input itself, scaled by the V bound
// of the layer (ModelLoadOptions::fp8_static_attention_output, the default), in prefill chunks,
// eager decodes and graph replays alike. It must track the bf16-weight model as closely as the
// per-row quantization pass does, and stay near that pass: both round the same outputs to e4m3,
// on different grids (~3% rms per element); a wrong scale or layout is off by O(1).
TEST_CASE("fp8 weights over a static int8 cache: the attention's fp8 output", "[gpu][fp8]") {
  const std::string dir = gpu_test::WriteRandomLlama("llama_fp8_static_out");
  // Calibration (kv_cache_quant.h format): absmax 6 for every head (V rows have std ~1.3).
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < 3; ++l) {
    layers.push_back({{"k_absmax", {6.0, 6.0}}, {"v_absmax", {6.0, 5.0}}});
  }
  const std::string scales = dir + "/kv_scales.json";
  std::ofstream(scales) << nlohmann::json{
      {"format", "llm-kv-scales-v1"},
      {"granularity", "per_head"},
      {"layers", layers}}.dump();
  std::mt19937 rng(21);
  const auto prompts = RandomPrompts(rng);
  auto run = [&](const char* weights, bool static_out, gpu_test::Logits* logits) {
    gpu_test::GenerateOptions o{.kv_dtype = "int8", .steps = 8, .logits = logits};
    o.weight_dtype = weights;
    o.fp8_static_attention_output = static_out;
    o.kv_scales_file = scales;
    return gpu_test::Generate(dir, prompts, o);
  };
  gpu_test::Logits bf16_logits, rows_logits, static_logits;
  run("auto", true, &bf16_logits);  // the option is ignored without fp8 weights
  run("fp8", false, &rows_logits);
  const auto st = run("fp8", true, &static_logits);
  CHECK(st.graph_steps > 0);
  double between_max = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double rows = gpu_test::FirstStepDistance(bf16_logits, rows_logits, i);
    const double stat = gpu_test::FirstStepDistance(bf16_logits, static_logits, i);
    const double between = gpu_test::FirstStepDistance(rows_logits, static_logits, i);
    INFO("prompt " << i << ": relative L2 error of the logits against bf16 weights: per-row pass "
                   << rows << ", static scale " << stat << "; between the two " << between);
    CHECK(rows < 0.2);
    CHECK(stat < 0.2);
    CHECK(between < 0.12);
    between_max = std::max(between_max, between);
    CHECK(st.tokens[i].size() == 8);
  }
  CHECK(between_max > 0.0);  // the option changed the path
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llm
