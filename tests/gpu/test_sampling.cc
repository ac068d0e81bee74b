// Device sampling (kernels/cuda/sampling/sampling.cu) against the CPU sampler
// (engine/sampling/sampler.h), its oracle: random logit rows of vocab 1000, 32000 and 151936
// (normal, peaked, and coarsely quantized so that exact ties are everywhere, plus ties planted at
// the top-k and top-p cuts and at the max), every combination of temperature, top-k, top-p, min-p
// and penalties, fixed draws. Checked: the penalized logits bit for bit, the token against
// SampleWithJob, every token inside the kept set K computed here from the written definition,
// greedy rows exactly, stratified draws against the kept distribution, and independence from the
// batch's other rows.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sampling/sampler.h"
#include "engine/sampling/token_mask.h"
#include "kernels/cuda/sampling/sampling.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm {
namespace {

using cuda::Upload;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

struct Row {
  std::vector<float> logits;  // [vocab], before penalties
  SamplingJob job;
  std::vector<PenaltyEntry> penalties;
};

struct GpuResult {
  std::vector<int32_t> tokens;   // [jobs]
  std::vector<float> penalized;  // [rows, vocab] after the kernel
  double ms = 0.0;               // one launch, device time
};

// Samples `rows` on the device. order[j] gives the row job j samples (default: j -> j).
// masks: rows of mask_words words (SamplingJob::mask_row).
GpuResult RunGpu(const std::vector<Row>& rows, int vocab, std::vector<int32_t> order = {},
                 const std::vector<uint32_t>& masks = {}, int mask_words = 0) {
  if (order.empty()) {
    order.resize(rows.size());
    std::iota(order.begin(), order.end(), 0);
  }
  std::vector<float> logits;
  logits.reserve(rows.size() * vocab);
  for (const Row& r : rows) logits.insert(logits.end(), r.logits.begin(), r.logits.end());
  std::vector<SamplingJob> jobs;
  std::vector<int32_t> indptr = {0};
  std::vector<PenaltyEntry> pens;
  for (int32_t r : order) {
    jobs.push_back(rows[r].job);
    pens.insert(pens.end(), rows[r].penalties.begin(), rows[r].penalties.end());
    indptr.push_back(static_cast<int32_t>(pens.size()));
  }
  float* d_logits = Upload(logits);
  int32_t* d_rows = Upload(order);
  SamplingJob* d_jobs = Upload(jobs);
  int32_t* d_indptr = Upload(indptr);
  PenaltyEntry* d_pens = Upload(pens);
  int32_t* d_tokens = Upload(std::vector<int32_t>(order.size(), -7));
  uint32_t* d_masks = masks.empty() ? nullptr : Upload(masks);
  cuda::SamplingArgs a;
  a.logits = d_logits;
  a.vocab = vocab;
  a.num_jobs = static_cast<int>(order.size());
  a.rows = d_rows;
  a.jobs = d_jobs;
  a.penalty_indptr = d_indptr;
  a.penalties = d_pens;
  a.tokens = d_tokens;
  a.masks = d_masks;
  a.mask_words = mask_words;
  cudaEvent_t e0, e1;
  CUDA_REQUIRE(cudaEventCreate(&e0));
  CUDA_REQUIRE(cudaEventCreate(&e1));
  CUDA_REQUIRE(cudaEventRecord(e0));
  cuda::LaunchSampling(a, nullptr);
  CUDA_REQUIRE(cudaEventRecord(e1));
  CUDA_REQUIRE(cudaGetLastError());
  CUDA_REQUIRE(cudaDeviceSynchronize());
  float ms = 0.0f;
  CUDA_REQUIRE(cudaEventElapsedTime(&ms, e0, e1));
  GpuResult out;
  out.ms = ms;
  out.tokens.resize(order.size());
  out.penalized.resize(logits.size());
  CUDA_REQUIRE(cudaMemcpy(out.tokens.data(), d_tokens, order.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_REQUIRE(
      cudaMemcpy(out.penalized.data(), d_logits, logits.size() * 4, cudaMemcpyDeviceToHost));
  for (void* p :
       {static_cast<void*>(d_logits), static_cast<void*>(d_rows), static_cast<void*>(d_jobs),
        static_cast<void*>(d_indptr), static_cast<void*>(d_pens), static_cast<void*>(d_tokens),
        static_cast<void*>(d_masks)}) {
    CUDA_REQUIRE(cudaFree(p));
  }
  CUDA_REQUIRE(cudaEventDestroy(e0));
  CUDA_REQUIRE(cudaEventDestroy(e1));
  return out;
}

std::vector<float> Penalized(const Row& r) {
  std::vector<float> l = r.logits;
  for (const PenaltyEntry& e : r.penalties) l[e.token] = sampling::ApplyEntry(l[e.token], e, r.job);
  return l;
}

std::vector<int32_t> SortedOrder(const std::vector<float>& l) {
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  return order;
}

// The kept set K of engine/sampling/sampler.h's definition, in the sorted order `order` of l.
std::vector<int32_t> KeptSet(const std::vector<float>& l, const std::vector<int32_t>& order,
                             const SamplingJob& job) {
  const float max = l[order[0]];
  const float inv_t = sampling::InvTemperature(job.temperature);
  auto p = [&](int32_t i) { return sampling::Prob(l[i], max, inv_t); };
  size_t keep = job.top_k > 0 ? std::min<size_t>(job.top_k, l.size()) : l.size();
  if (job.top_p < 1.0f) {
    uint64_t total = 0, cum = 0;
    for (size_t i = 0; i < keep; ++i) total += sampling::Mass(p(order[i]));
    const uint64_t target = sampling::TopPTarget(job.top_p, total);
    size_t n = 0;
    while (n < keep && cum < target) cum += sampling::Mass(p(order[n++]));
    keep = n;
  }
  std::vector<int32_t> kept;
  for (size_t i = 0; i < keep; ++i) {
    if (job.min_p <= 0.0f || p(order[i]) >= job.min_p) kept.push_back(order[i]);
  }
  return kept;
}

// Random logits of one of four shapes.
std::vector<float> RandomLogits(int vocab, int shape, std::mt19937& rng) {
  std::vector<float> l(vocab);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  switch (shape) {
    case 0:  // flat-ish
      for (float& x : l) x = nd(rng);
      break;
    case 1:  // peaked
      for (float& x : l) x = 3.0f * nd(rng);
      break;
    case 2:  // LLM-like: a wide body and a few strong candidates
      for (float& x : l) x = 2.0f * nd(rng) - 2.0f;
      for (int i = 0; i < 8; ++i) l[rng() % vocab] = 12.0f + 2.0f * nd(rng);
      break;
    default:  // coarse: exact ties everywhere
      for (float& x : l) x = std::round(4.0f * nd(rng)) / 4.0f;
      break;
  }
  return l;
}

// Sets a few ids outside the penalty list to `value` (a tie on the penalized logits).
void PlantTies(Row* r, float value, int n, std::mt19937& rng) {
  const int vocab = static_cast<int>(r->logits.size());
  for (int placed = 0, guard = 0; placed < n && guard < 1000; ++guard) {
    const int32_t id = static_cast<int32_t>(rng() % vocab);
    bool penalized = false;
    for (const PenaltyEntry& e : r->penalties) penalized |= e.token == id;
    if (penalized) continue;
    r->logits[id] = value;
    ++placed;
  }
}

std::vector<Row> MakeRows(int vocab, std::mt19937& rng) {
  std::vector<Row> rows;
  const int big_k = std::min(1000, vocab / 3);
  int n = 0;
  for (float temperature : {0.0f, 0.6f, 1.0f, 1.7f}) {
    for (int top_k : {0, 1, 20, big_k}) {
      for (float top_p : {1.0f, 0.95f, 0.6f}) {
        for (float min_p : {0.0f, 0.1f}) {
          for (bool penalties : {false, true}) {
            Row r;
            r.logits = RandomLogits(vocab, n % 4, rng);
            r.job.temperature = temperature;
            r.job.top_k = top_k;
            r.job.top_p = top_p;
            r.job.min_p = min_p;
            // Draws spread over [0, 1), with both ends.
            r.job.u = n % 50 == 7   ? 0.0
                      : n % 50 == 8 ? 1.0 - 0x1p-53
                                    : std::fmod(n * 0.6180339887, 1.0);
            if (penalties) {
              r.job.repetition_penalty = 1.3f;
              r.job.presence_penalty = 0.4f;
              r.job.frequency_penalty = 0.15f;
              // The strongest candidates and random others, each once, so that penalties
              // change the outcome.
              const std::vector<int32_t> order = SortedOrder(r.logits);
              std::vector<int32_t> ids(order.begin(), order.begin() + 5);
              while (ids.size() < 40) {
                const int32_t id = static_cast<int32_t>(rng() % vocab);
                if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
              }
              // Every third entry also carries a logit_bias; some ids only a bias (count -1).
              for (size_t i = 0; i < ids.size(); ++i) {
                const float bias =
                    i % 3 == 0 ? static_cast<float>(rng() % 41) * 0.25f - 5.0f : 0.0f;
                const int32_t count = i % 7 == 6 ? -1 : static_cast<int32_t>(rng() % 4);
                r.penalties.push_back({ids[i], count, bias});
              }
            }
            // Ties at the thresholds, measured on the penalized logits.
            const std::vector<float> pl = Penalized(r);
            const std::vector<int32_t> order = SortedOrder(pl);
            if (n % 3 == 0) PlantTies(&r, pl[order[0]], 2, rng);  // at the max
            if (top_k > 1) PlantTies(&r, pl[order[top_k - 1]], 4, rng);
            if (top_p < 1.0f && temperature > 0.0f) {
              PlantTies(&r, pl[KeptSet(pl, order, r.job).back()], 4, rng);
            }
            rows.push_back(std::move(r));
            ++n;
          }
        }
      }
    }
  }
  return rows;
}

TEST_CASE("GPU sampling matches the CPU sampler", "[gpu][sampling]") {
  std::mt19937 rng(2024);
  for (int vocab : {1000, 32000, 151936}) {
    const std::vector<Row> rows = MakeRows(vocab, rng);
    const GpuResult gpu = RunGpu(rows, vocab);
    int same = 0, greedy = 0, tie_rows = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const Row& row = rows[r];
      std::vector<float> cpu_logits = row.logits;
      const int32_t cpu = SampleWithJob(cpu_logits, row.job, row.penalties).token;
      INFO("vocab " << vocab << " row " << r << " T " << row.job.temperature << " top_k "
                    << row.job.top_k << " top_p " << row.job.top_p << " min_p " << row.job.min_p
                    << " penalties " << row.penalties.size() << " u " << row.job.u << ": cpu "
                    << cpu << " gpu " << gpu.tokens[r]);
      // The penalties, bit for bit.
      REQUIRE(std::equal(cpu_logits.begin(), cpu_logits.end(),
                         gpu.penalized.begin() + static_cast<size_t>(r) * vocab));
      REQUIRE(gpu.tokens[r] >= 0);
      REQUIRE(gpu.tokens[r] < vocab);
      if (row.job.temperature == 0.0f) {
        ++greedy;
        CHECK(gpu.tokens[r] == cpu);
        continue;
      }
      // The GPU token is in K, computed here from the definition.
      const std::vector<int32_t> order = SortedOrder(cpu_logits);
      const std::vector<int32_t> kept = KeptSet(cpu_logits, order, row.job);
      CHECK(std::find(kept.begin(), kept.end(), gpu.tokens[r]) != kept.end());
      CHECK(std::find(kept.begin(), kept.end(), cpu) != kept.end());
      // Count rows whose K ends inside a group of equal logits.
      const size_t keep = std::find(order.begin(), order.end(), kept.back()) - order.begin() + 1;
      if (keep < order.size() && cpu_logits[order[keep]] == cpu_logits[order[keep - 1]]) {
        ++tie_rows;
      }
      same += gpu.tokens[r] == cpu ? 1 : 0;
    }
    const int sampled = static_cast<int>(rows.size()) - greedy;
    std::printf(
        "vocab %d: %d/%d sampled rows identical to the CPU (%d cut inside a tie), "
        "%d greedy identical; %.3f ms for %zu rows\n",
        vocab, same, sampled, tie_rows, greedy, gpu.ms, rows.size());
    CHECK(same >= 0.995 * sampled);
    CHECK(tie_rows > 10);  // the planted ties do land on the cuts
  }
}

TEST_CASE("GPU sampling applies structured-output masks as the CPU path does", "[gpu][sampling]") {
  // Every other row gets a random mask (about a fifth of the ids allowed, the row's best one
  // often not), before its bias and penalties; the CPU masks to -inf, then samples the same job.
  std::mt19937 rng(31);
  for (int vocab : {32000, 151936}) {
    std::vector<Row> rows = MakeRows(vocab, rng);
    const int words = (vocab + 31) / 32 + 1;  // a row may be wider than the vocabulary
    std::vector<uint32_t> masks;
    for (size_t r = 0; r < rows.size(); r += 2) {
      rows[r].job.mask_row = static_cast<int32_t>(masks.size() / words);
      const size_t at = masks.size();
      masks.resize(at + words, 0u);
      for (int i = 0; i < vocab; ++i) {
        if (rng() % 5 == 0) masks[at + i / 32] |= 1u << (i % 32);
      }
    }
    const GpuResult gpu = RunGpu(rows, vocab, {}, masks, words);
    int same = 0, sampled = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const Row& row = rows[r];
      std::vector<float> cpu_logits = row.logits;
      const uint32_t* mask =
          row.job.mask_row < 0 ? nullptr : masks.data() + size_t{1} * row.job.mask_row * words;
      if (mask != nullptr) ApplyTokenMask(cpu_logits, mask, vocab);
      const int32_t cpu = SampleWithJob(cpu_logits, row.job, row.penalties).token;
      INFO("vocab " << vocab << " row " << r << " masked " << (mask != nullptr) << " cpu " << cpu
                    << " gpu " << gpu.tokens[r]);
      REQUIRE(std::equal(cpu_logits.begin(), cpu_logits.end(),
                         gpu.penalized.begin() + static_cast<size_t>(r) * vocab));
      const int32_t t = gpu.tokens[r];
      REQUIRE((t >= 0 && t < vocab));
      if (mask != nullptr) CHECK(((mask[t / 32] >> (t % 32)) & 1u) == 1u);
      if (row.job.temperature == 0.0f) {
        CHECK(t == cpu);
        continue;
      }
      ++sampled;
      same += t == cpu ? 1 : 0;
    }
    std::printf("vocab %d, masks on half the rows: %d/%d sampled rows identical to the CPU\n",
                vocab, same, sampled);
    CHECK(same >= 0.995 * sampled);
  }
}

TEST_CASE("GPU sampling does not depend on the other rows of the batch", "[gpu][sampling]") {
  std::mt19937 rng(7);
  const int vocab = 32000;
  const std::vector<Row> rows = MakeRows(vocab, rng);
  const GpuResult a = RunGpu(rows, vocab);
  const GpuResult b = RunGpu(rows, vocab);
  CHECK(a.tokens == b.tokens);
  // Reversed job order, and each row alone.
  std::vector<int32_t> rev(rows.size());
  std::iota(rev.rbegin(), rev.rend(), 0);
  const GpuResult c = RunGpu(rows, vocab, rev);
  for (size_t j = 0; j < rows.size(); ++j) CHECK(c.tokens[j] == a.tokens[rev[j]]);
  for (size_t r = 0; r < rows.size(); r += 17) {
    CHECK(RunGpu({rows[r]}, vocab).tokens[0] == a.tokens[r]);
  }
}

TEST_CASE("GPU sampling draws reproduce the kept distribution", "[gpu][sampling]") {
  // One row, many stratified draws u = (i + 0.5) / n: token i comes out n * q_i / sum q times,
  // up to one, and q_i / sum q is the normalized exp((l - max) / T) over K.
  std::mt19937 rng(99);
  struct Setting {
    int vocab, n;
    float temperature, top_p, min_p;
    int top_k;
  };
  for (const Setting& st :
       {Setting{1000, 8192, 1.0f, 1.0f, 0.0f, 0}, Setting{1000, 8192, 0.7f, 0.9f, 0.0f, 50},
        Setting{1000, 8192, 1.3f, 0.8f, 0.02f, 0}, Setting{151936, 512, 1.0f, 0.95f, 0.0f, 0}}) {
    Row base;
    base.logits = RandomLogits(st.vocab, 2, rng);
    base.job.temperature = st.temperature;
    base.job.top_k = st.top_k;
    base.job.top_p = st.top_p;
    base.job.min_p = st.min_p;
    std::vector<Row> rows(st.n, base);
    for (int i = 0; i < st.n; ++i) rows[i].job.u = (i + 0.5) / st.n;
    const GpuResult gpu = RunGpu(rows, st.vocab);
    const std::vector<int32_t> kept = KeptSet(base.logits, SortedOrder(base.logits), base.job);
    const size_t keep = kept.size();
    const float max = base.logits[kept[0]];
    const float inv_t = sampling::InvTemperature(st.temperature);
    uint64_t total = 0;
    double total_exact = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      total += sampling::Mass(sampling::Prob(base.logits[kept[i]], max, inv_t));
      total_exact += std::exp((static_cast<double>(base.logits[kept[i]]) - max) / st.temperature);
    }
    std::map<int32_t, int> seen;
    for (int32_t t : gpu.tokens) ++seen[t];
    INFO("vocab " << st.vocab << " T " << st.temperature << " top_k " << st.top_k << " top_p "
                  << st.top_p << " min_p " << st.min_p << ": " << seen.size() << " of " << keep
                  << " kept tokens drawn");
    double worst = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      const int32_t id = kept[i];
      const uint64_t q = sampling::Mass(sampling::Prob(base.logits[id], max, inv_t));
      const double want = static_cast<double>(q) / static_cast<double>(total) * st.n;
      const int got = seen.count(id) ? seen[id] : 0;
      CHECK(std::fabs(got - want) <= 1.0);
      // Against the exact softmax over K: the fixed-point masses cost nothing visible.
      const double exact =
          std::exp((static_cast<double>(base.logits[id]) - max) / st.temperature) / total_exact;
      worst = std::max(worst, std::fabs(static_cast<double>(q) / total - exact));
      seen.erase(id);
    }
    CHECK(seen.empty());  // nothing outside K
    CHECK(worst < 1e-6);
  }
}

// A quick subset for compute-sanitizer (scripts/gpu_check.sh): every path on small rows, and a
// vocab that is no multiple of 32.
TEST_CASE("GPU sampling under the sanitizer", "[sampling_sanitize]") {
  std::mt19937 rng(5);
  for (int vocab : {1000, 5003}) {
    const std::vector<Row> rows = MakeRows(vocab, rng);
    const GpuResult gpu = RunGpu(rows, vocab);
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> l = rows[r].logits;
      CHECK(gpu.tokens[r] == SampleWithJob(l, rows[r].job, rows[r].penalties).token);
    }
  }
}

// Timing at serving shape; run with: gpu_tests "[.bench]".
TEST_CASE("GPU sampling cost at 256 rows x 128k vocab", "[.bench][sampling]") {
  const int vocab = 128256, rows_n = 256;
  std::mt19937 rng(3);
  struct Setting {
    const char* name;
    float temperature, top_p, min_p;
    int top_k;
    bool penalties;
  };
  for (const Setting& st : {Setting{"greedy", 0.0f, 1.0f, 0.0f, 0, false},
                            Setting{"temperature", 0.8f, 1.0f, 0.0f, 0, false},
                            Setting{"top_k 50", 0.8f, 1.0f, 0.0f, 50, false},
                            Setting{"top_p 0.9", 0.8f, 0.9f, 0.0f, 0, false},
                            Setting{"top_k 50 top_p 0.9 min_p", 0.8f, 0.9f, 0.05f, 50, true},
                            Setting{"top_k 1000 top_p 0.95", 1.0f, 0.95f, 0.0f, 1000, false}}) {
    std::vector<Row> rows(rows_n);
    for (int r = 0; r < rows_n; ++r) {
      rows[r].logits = RandomLogits(vocab, 2, rng);
      rows[r].job = SamplingJob{st.temperature, st.top_k, st.top_p, st.min_p, (r + 0.5) / rows_n};
      if (st.penalties) {
        rows[r].job.repetition_penalty = 1.1f;
        for (int i = 0; i < 512; ++i) rows[r].penalties.push_back({i * 97 % vocab, i % 3});
      }
    }
    RunGpu(rows, vocab);  // warm-up
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) ms.push_back(RunGpu(rows, vocab).ms);
    std::sort(ms.begin(), ms.end());
    std::printf("sampling %-26s %d x %d: %.1f us (median of 5)\n", st.name, rows_n, vocab,
                ms[2] * 1000.0);
  }
}

}  // namespace
}  // namespace llm
