// Model-step benchmark on the GPU: one decode step of B sequences at context L through the whole
// model (dummy weights from a real config), with the layers launched eagerly and replayed from a
// CUDA graph, and one prefill chunk. The host side is the real model runner (plan, upload, layers,
// LM head, greedy device sampling, sync); the scheduler is not involved.
//
//   build/cuda/bench/model_step_bench --model configs/models/llama3-8b [--kv int8]
//       [--batches 1,64,256] [--ctx 1500] [--steps 30] [--prefill 8192] [--profile B]
//       [--backend cuda_fmha] [--prefill-backend auto|none|NAME] [--weights bf16|fp8]
//       [--moe-weights auto|bf16|mxfp4] (the server's moe_weight_dtype)
//       [--moe-activations bf16|fp8|auto] (the server's moe_activation_dtype)
//       [--prefill-seqs S] [--prefill-decode N] [--prefill-steps K] [--profile-prefill 1]
//       [--fp8-fast-accum 0|1]   (default 1, the server's default)
//       [--dense-gemv-max-rows N]   (default 4; 0: cuBLAS for every projection)
//       [--fp8-static-attn-out 0|1]   (default 1, the server's fp8_static_attention_output)
//       [--c8-prefill auto|tiles|fmha] (the server's c8_prefill)
//       [--query-tokens 1,2,3,4,5]
//       [--kernel-timeline B] [--timeline-positions N]   (where built with CUPTI)
// --query-tokens Q,...: also time steps in which every sequence brings Q tokens (the last
//   sampled one and Q - 1 speculative drafts) with a logit row at each, a verify step of
//   speculative decoding, beside the one-token step, eagerly and replayed from the graphs of Q
//   rows per sequence (ModelLoadOptions::cuda_graph_max_query_rows = the largest Q; stderr says
//   how many timed steps replayed a graph); rows "verify q=Q" (tok/s counts B x Q).
// --prefill-seqs S: the prefill chunk is S fresh sequences of prefill / S tokens each (the
//   serving workload's chunks: 8 x 1024 is what 8,192-token steps of 1,000-token prompts hold).
// --prefill-decode N: N decode rows at context --ctx join the prefill chunk, which keeps the same
//   token count (P - N prompt tokens): the mixed steps of a serving run, whose 8,192-token budget
//   holds the running sequences' decode rows and the rest of the prompts.
// --prefill-steps K: timed runs of the prefill chunk after one warm-up (default 5); each run's
//   time goes to stderr.
// --profile-prefill 1: one more prefill chunk between cudaProfilerStart/Stop.
// --profile B: one more eager step of batch B between cudaProfilerStart/Stop, for
//   ncu --profile-from-start off --metrics gpu__time_duration.sum (per-kernel time of a step).
// --kernel-timeline B: after batch B's graph rows, --steps more graph steps traced by CUPTI
//   (bench/kernel_timeline.h): per kernel its launches a step, its own time and its end
//   increments (what the step waits for under PDL), then the first N kernels of a step in order
//   (--timeline-positions, default 40). Tracing is on for the whole run, so every row of that
//   run is timed under it.
//
// Prints one table row per (batch, mode): mean and p50 milliseconds per step, the step's bytes
// (weights + KV read; the routed MoE layers of ModelConfig::moe count the experts the batch's
// tokens chose in one traced step, printed to stderr; DeepSeek's layers count as a dense Llama
// MLP) over its time, and where NVML can say (bench/gpu_energy.h), the joules
// per step and the mean power over the timed steps (on a power-capped board energy per step sets
// speed under sustained load: time those rows over a second or more).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>

#include "bench/gpu_energy.h"
#include "bench/int_list.h"
#if defined(LLM_HAVE_CUPTI)
#include "bench/kernel_timeline.h"
#endif
#include "engine/runtime/model.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "configs/models/llama3-8b";
  std::string kv = "int8";
  std::vector<int> batches = {1, 64, 256};
  int ctx = 1500;
  int steps = 30;
  int prefill = 8192;
  int block_size = 64;
  int profile = 0;
  int prefill_seqs = 1;
  int prefill_decode = 0;
  int prefill_steps = 5;
  bool profile_prefill = false;
  std::string backend;  // forced attention backend (e.g. cuda_fmha); empty: the selection's
  std::string prefill_backend = "auto";  // ModelLoadOptions::prefill_attention_backend
  std::string weights = "auto";          // ModelLoadOptions::weight_dtype (bf16 | fp8)
  std::string moe_weights = "auto";      // ModelLoadOptions::moe_weight_dtype (bf16 | mxfp4)
  std::string moe_activations = "bf16";  // ModelLoadOptions::moe_activation_dtype (fp8 | auto)
  bool fast_accum = true;                // ModelLoadOptions::fp8_fast_accumulation
  int dense_gemv_max_rows = 4;           // ModelLoadOptions::dense_gemv_max_rows
  bool static_attn_out = true;           // ModelLoadOptions::fp8_static_attention_output
  std::string c8_prefill = "auto";       // ModelLoadOptions::c8_prefill
  std::vector<int> query_tokens;         // verify steps of Q tokens per sequence
  int kernel_timeline = 0;               // the batch whose graph steps CUPTI traces (0: none)
  int timeline_positions = -1;           // -1: unset (40 with a timeline)
};

// B sequences of ctx cached tokens each, decoding one token at position ctx + step; block tables
// drawn from a shuffled pool.
struct DecodeState {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int> lens;
};

// B sequences of ctx tokens, each with pages_per_seq blocks drawn from a shuffled pool of the
// first pool_pages blocks.
DecodeState ShuffledDecodeState(int B, int pool_pages, int pages_per_seq, int ctx,
                                std::mt19937& rng) {
  DecodeState st;
  std::vector<int32_t> pool_ids(pool_pages);
  std::iota(pool_ids.begin(), pool_ids.end(), 0);
  std::shuffle(pool_ids.begin(), pool_ids.end(), rng);
  for (int s = 0; s < B; ++s) {
    st.tables.emplace_back(pool_ids.begin() + s * pages_per_seq,
                           pool_ids.begin() + (s + 1) * pages_per_seq);
    st.lens.push_back(ctx);  // cache contents are whatever the pool holds
  }
  return st;
}

// One step of q tokens per sequence (q = 1: a decode step; q > 1: a speculative verify step,
// sampled at every position). Each sequence advances by one token, as when one draft is accepted
// in two, so a run's contexts stay comparable across q.
llm::ForwardBatch DecodeBatch(DecodeState& st, int vocab, int bs, std::mt19937& rng, int q = 1) {
  llm::ForwardBatch fb;
  llm::AttentionBatch& a = fb.attn;
  const int B = static_cast<int>(st.lens.size());
  a.num_seqs = B;
  a.num_tokens = B * q;
  a.q_indptr.push_back(0);
  a.page_indptr.push_back(0);
  for (int s = 0; s < B; ++s) {
    const int pos = st.lens[s]++;  // the first new token's position
    const auto& t = st.tables[s];
    for (int i = 0; i < q; ++i) {
      fb.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
      fb.positions.push_back(pos + i);
      fb.logit_rows.push_back(s * q + i);
      a.slot_mapping.push_back(t[(pos + i) / bs] * bs + (pos + i) % bs);
    }
    a.q_indptr.push_back((s + 1) * q);
    a.kv_lens.push_back(pos + q);
    const int pages = (pos + q + bs - 1) / bs;
    a.page_indices.insert(a.page_indices.end(), t.begin(), t.begin() + pages);
    a.page_indptr.push_back(static_cast<int32_t>(a.page_indices.size()));
  }
  fb.device_sampled.assign(B * q, 1);
  fb.sampling_jobs.assign(B * q, llm::SamplingJob{});  // greedy
  fb.penalty_indptr.assign(B * q + 1, 0);
  return fb;
}

// Energy and wall time between Start() and Stop(), as table cells: joules per step and mean watts
// ("-" without NVML, or for spans too short for NVML's counter).
class EnergySpan {
 public:
  explicit EnergySpan(const bench::GpuEnergy& e) : energy_(e) {}
  void Start() {
    mj_ = energy_.millijoules();
    t_ = Clock::now();
  }
  std::string Stop(int steps) const {
    const long long mj = energy_.millijoules();
    const double s = std::chrono::duration<double>(Clock::now() - t_).count();
    if (mj < 0 || mj_ < 0 || steps < 1 || s < bench::GpuEnergy::kMinSpanSeconds) return "- | -";
    const double j = static_cast<double>(mj - mj_) / 1e3;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.3f | %.0f", j / steps, j / s);
    return buf;
  }

 private:
  const bench::GpuEnergy& energy_;
  long long mj_ = -1;
  Clock::time_point t_;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") {
      args.model = v;
    } else if (k == "--kv") {
      args.kv = v;
    } else if (k == "--batches") {
      args.batches = bench::ParseIntList(v);
    } else if (k == "--ctx") {
      args.ctx = std::stoi(v);
    } else if (k == "--steps") {
      args.steps = std::stoi(v);
    } else if (k == "--prefill") {
      args.prefill = std::stoi(v);
    } else if (k == "--backend") {
      args.backend = v;
    } else if (k == "--dense-gemv-max-rows") {
      args.dense_gemv_max_rows = std::stoi(v);
    } else if (k == "--fp8-fast-accum") {
      args.fast_accum = std::stoi(v) != 0;
    } else if (k == "--c8-prefill") {
      args.c8_prefill = v;
    } else if (k == "--fp8-static-attn-out") {
      args.static_attn_out = std::stoi(v) != 0;
    } else if (k == "--weights") {
      args.weights = v;
    } else if (k == "--moe-weights") {
      args.moe_weights = v;
    } else if (k == "--moe-activations") {
      args.moe_activations = v;
    } else if (k == "--prefill-backend") {
      args.prefill_backend = v;
    } else if (k == "--profile") {
      args.profile = std::stoi(v);
    } else if (k == "--prefill-seqs") {
      args.prefill_seqs = std::max(1, std::stoi(v));
    } else if (k == "--prefill-steps") {
      args.prefill_steps = std::max(1, std::stoi(v));
    } else if (k == "--prefill-decode") {
      args.prefill_decode = std::max(0, std::stoi(v));
    } else if (k == "--query-tokens") {
      args.query_tokens = bench::ParseIntList(v);
    } else if (k == "--kernel-timeline") {
      args.kernel_timeline = std::stoi(v);
    } else if (k == "--timeline-positions") {
      args.timeline_positions = std::stoi(v);
    } else if (k == "--profile-prefill") {
      args.profile_prefill = std::stoi(v) != 0;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (args.timeline_positions >= 0 && args.kernel_timeline <= 0) {
    std::fprintf(stderr, "--timeline-positions: only with --kernel-timeline\n");
    return 2;
  }
  if (args.timeline_positions < 0) args.timeline_positions = 40;
  if (args.kernel_timeline > 0) {
    if (std::find(args.batches.begin(), args.batches.end(), args.kernel_timeline) ==
        args.batches.end()) {
      std::fprintf(stderr, "--kernel-timeline %d: not one of --batches\n", args.kernel_timeline);
      return 2;
    }
#if defined(LLM_HAVE_CUPTI)
    std::string error;
    if (!bench::KernelTimeline::Start(&error)) {
      std::fprintf(stderr, "--kernel-timeline: %s\n", error.c_str());
      return 1;
    }
#else
    std::fprintf(stderr, "--kernel-timeline: this build has no CUPTI (CUDA::cupti not found)\n");
    return 2;
#endif
  }
  spdlog::set_level(spdlog::level::warn);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug: e.g. each fp8 GEMM's tuned choice
  const int max_b = *std::max_element(args.batches.begin(), args.batches.end());
  const int bs = args.block_size;
  int max_q = 1;
  for (int q : args.query_tokens) max_q = std::max(max_q, q);
  // Room for the one-token steps and every verify run (each advances a sequence by one token).
  const int pages_per_seq =
      (args.ctx + (args.steps + 3) * (1 + static_cast<int>(args.query_tokens.size())) + max_q + 8 +
       bs - 1) /
      bs;
  const int prefill_pages = (args.prefill + bs - 1) / bs;
  // Decode tables come from the first decode_pages pages; a prefill chunk's pages follow them.
  const int decode_pages = std::max(max_b, args.prefill_decode) * pages_per_seq;
  const int pool = decode_pages + prefill_pages + args.prefill_seqs + 16;

  int device = 0;
  cudaGetDevice(&device);
  const bench::GpuEnergy energy(device);
  EnergySpan span(energy);
  std::printf(
      "| batch x ctx | mode | mean ms/step | p50 ms | tok/s | GB/step | TB/s | J/step | W |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int graphs : {0, 1}) {
    llm::ModelLoadOptions o;
    o.model_dir = args.model;
    o.device = "cuda";
    o.dummy_weights = true;
    o.kv_cache_dtype = args.kv;
    o.block_size = bs;
    o.num_kv_blocks = pool;
    o.cuda_graph_max_batch = graphs ? 256 : 0;
    o.cuda_graph_max_query_rows = max_q;
    o.attention_backend = args.backend;
    o.prefill_attention_backend = args.prefill_backend;
    o.weight_dtype = args.weights;
    o.moe_weight_dtype = args.moe_weights;
    o.moe_activation_dtype = args.moe_activations;
    o.fp8_fast_accumulation = args.fast_accum;
    o.dense_gemv_max_rows = args.dense_gemv_max_rows;
    o.fp8_static_attention_output = args.static_attn_out;
    o.c8_prefill = args.c8_prefill;
    auto m = llm::LoadModel(o);
    if (!m.ok()) {
      std::fprintf(stderr, "load: %s\n", m.status().ToString().c_str());
      return 1;
    }
    llm::Model& model = **m;
    const llm::ModelConfig& c = model.config();
    std::mt19937 rng(1);
    std::vector<float> logits;
    std::vector<int32_t> tokens;
    // Bytes a decode step must read: every weight once plus each sequence's KV (bf16 weights;
    // fp8 halves the projections but not the embedding / LM head).
    const double weight_bytes =
        2.0 * (static_cast<double>(c.vocab_size) * c.hidden_size * (c.tie_word_embeddings ? 1 : 2) +
               static_cast<double>(c.num_layers) *
                   (static_cast<double>(c.hidden_size) * (c.q_size() + 2 * c.kv_size()) +
                    static_cast<double>(c.q_size()) * c.hidden_size +
                    3.0 * c.hidden_size * c.intermediate_size));
    const double kv_bytes_per_token = static_cast<double>(model.kv_bytes_per_block()) / bs;
    // Routed MoE layers (ModelConfig::moe) read the experts the step's tokens chose, not a dense
    // MLP: counted from one eager step's routing trace at each batch (the dummy router spreads
    // them as a real one does, or not: the count says which).
    const llm::MoeSettings& moe = c.moe;
    const double dense_mlp = 2.0 * 3.0 * c.hidden_size * c.intermediate_size;
    // MXFP4 experts as stored: 4-bit values and one e8m0 scale per 32 (4.25 bits a weight).
    const double expert_bytes =
        (args.moe_weights == "mxfp4" ? 4.25 / 8.0 : 2.0) * 3.0 * c.hidden_size * moe.intermediate;
    auto step_weight_bytes = [&](DecodeState& st, double* touched_per_layer) {
      *touched_per_layer = 0;
      if (moe.num_experts == 0) return weight_bytes;
      std::vector<llm::MoeRoutingDecision> trace;
      if (!model.set_routing_trace(&trace)) return weight_bytes;
      const llm::ForwardBatch fb = DecodeBatch(st, c.vocab_size, bs, rng);
      const llm::Status s = model.ForwardSampled(fb, &logits, &tokens);
      model.set_routing_trace(nullptr);
      if (!s.ok()) return weight_bytes;
      std::vector<std::vector<char>> used(c.num_layers, std::vector<char>(moe.num_experts, 0));
      for (const auto& d : trace) {
        for (int32_t e : d.experts) used[d.layer][e] = 1;
      }
      double bytes = weight_bytes;
      int moe_layers = 0;
      for (int l = 0; l < c.num_layers; ++l) {
        if (!moe.Layer(l)) continue;
        const double n = std::count(used[l].begin(), used[l].end(), 1);
        bytes += n * expert_bytes + 4.0 * moe.num_experts * c.hidden_size - dense_mlp;
        *touched_per_layer += n;
        ++moe_layers;
      }
      if (moe_layers > 0) *touched_per_layer /= moe_layers;
      return bytes;
    };
    for (int B : args.batches) {
      DecodeState st = ShuffledDecodeState(B, decode_pages, pages_per_seq, args.ctx, rng);
      double touched = 0;
      const double step_weights = step_weight_bytes(st, &touched);
      if (touched > 0 && !graphs) {
        std::fprintf(stderr, "batch %d: %.1f of %d experts per MoE layer touched\n", B, touched,
                     moe.num_experts);
      }
      std::vector<double> ms;
      for (int step = 0; step < args.steps + 3; ++step) {
        if (step == 3) span.Start();
        const llm::ForwardBatch fb = DecodeBatch(st, c.vocab_size, bs, rng);
        const auto t0 = Clock::now();
        const llm::Status s = model.ForwardSampled(fb, &logits, &tokens);
        const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (!s.ok()) {
          std::fprintf(stderr, "forward: %s\n", s.ToString().c_str());
          return 1;
        }
        if (step >= 3) ms.push_back(dt);  // warm-up (and the graph capture) excluded
      }
      const std::string joules = span.Stop(args.steps);
      if (!graphs && B == args.profile) {
        const llm::ForwardBatch fb = DecodeBatch(st, c.vocab_size, bs, rng);
        cudaProfilerStart();
        const llm::Status s = model.ForwardSampled(fb, &logits, &tokens);
        cudaProfilerStop();
        if (!s.ok()) return 1;
      }
      const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
      const double gb = (step_weights + kv_bytes_per_token * B * (args.ctx + args.steps / 2)) / 1e9;
      std::printf("| %d x %d | %s | %.3f | %.3f | %.0f | %.2f | %.2f | %s |\n", B, args.ctx,
                  graphs ? "graph" : "eager", mean, Percentile(ms, 0.5), B * 1000.0 / mean, gb,
                  gb / mean, joules.c_str());
#if defined(LLM_HAVE_CUPTI)
      if (graphs && B == args.kernel_timeline) {
        bench::KernelTimeline::BeginWindow();
        for (int step = 0; step < args.steps; ++step) {
          const llm::ForwardBatch fb = DecodeBatch(st, c.vocab_size, bs, rng);
          if (!model.ForwardSampled(fb, &logits, &tokens).ok()) return 1;
        }
        bench::KernelTimeline::EndWindow();
        std::printf("%s",
                    bench::KernelTimeline::Report(args.steps, args.timeline_positions).c_str());
      }
#endif
      for (int q : args.query_tokens) {
        std::vector<double> vms;
        int64_t graph_steps0 = 0;
        for (int step = 0; step < args.steps + 3; ++step) {
          if (step == 3) graph_steps0 = model.graph_steps();
          const llm::ForwardBatch fb = DecodeBatch(st, c.vocab_size, bs, rng, q);
          const auto t0 = Clock::now();
          const llm::Status s = model.ForwardSampled(fb, &logits, &tokens);
          if (!s.ok()) {
            std::fprintf(stderr, "verify forward (q=%d): %s\n", q, s.ToString().c_str());
            return 1;
          }
          const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (step >= 3) vms.push_back(dt);
        }
        if (graphs) {
          std::fprintf(stderr, "batch %d, verify q=%d: %lld of %d timed steps from graphs\n", B, q,
                       static_cast<long long>(model.graph_steps() - graph_steps0), args.steps);
        }
        const double vmean = std::accumulate(vms.begin(), vms.end(), 0.0) / vms.size();
        std::printf("| %d x %d | verify q=%d %s | %.3f | %.3f | %.0f | %.2f | %.2f | - | - |\n", B,
                    args.ctx, q, graphs ? "graph" : "eager", vmean, Percentile(vms, 0.5),
                    B * q * 1000.0 / vmean, gb, gb / vmean);
      }
    }
    if (!graphs && args.prefill > 0) {
      // One prefill chunk: S fresh sequences of (P - N) / S tokens and N decode rows (eager in
      // both modes).
      const int N = std::min(args.prefill_decode, args.prefill - args.prefill_seqs);
      llm::ForwardBatch fb;
      if (N > 0) {
        DecodeState st = ShuffledDecodeState(N, decode_pages, pages_per_seq, args.ctx, rng);
        fb = DecodeBatch(st, c.vocab_size, bs, rng);
      } else {
        fb.attn.q_indptr = {0};
        fb.attn.page_indptr = {0};
      }
      llm::AttentionBatch& a = fb.attn;
      const int P = args.prefill - N, S = args.prefill_seqs;
      a.num_seqs = N + S;
      a.num_tokens = N + P;
      int page = decode_pages;
      for (int q = 0; q < S; ++q) {
        const int len = P / S + (q < P % S ? 1 : 0);
        const int first_page = page;
        for (int i = 0; i < len; ++i) {
          fb.token_ids.push_back(static_cast<int32_t>(rng() % c.vocab_size));
          fb.positions.push_back(i);
          a.slot_mapping.push_back(first_page * bs + i);
        }
        for (int i = 0; i < (len + bs - 1) / bs; ++i) a.page_indices.push_back(page++);
        a.q_indptr.push_back(a.q_indptr.back() + len);
        a.kv_lens.push_back(len);
        a.page_indptr.push_back(static_cast<int32_t>(a.page_indices.size()));
        fb.logit_rows.push_back(a.q_indptr.back() - 1);
      }
      fb.device_sampled.assign(N + S, 1);
      fb.sampling_jobs.assign(N + S, llm::SamplingJob{});
      fb.penalty_indptr.assign(N + S + 1, 0);
      std::vector<double> ms;
      for (int i = 0; i <= args.prefill_steps; ++i) {
        if (i == 1) span.Start();
        const auto t0 = Clock::now();
        const llm::Status st = model.ForwardSampled(fb, &logits, &tokens);
        if (!st.ok()) {
          std::fprintf(stderr, "prefill forward: %s\n", st.ToString().c_str());
          return 1;
        }
        if (i >= 1) {
          ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        }
      }
      const std::string joules = span.Stop(args.prefill_steps);
      if (args.profile_prefill) {
        cudaProfilerStart();
        const llm::Status s = model.ForwardSampled(fb, &logits, &tokens);
        cudaProfilerStop();
        if (!s.ok()) return 1;
      }
      std::fprintf(stderr, "prefill steps, ms:");
      for (double t : ms) std::fprintf(stderr, " %.1f", t);
      std::fprintf(stderr, "\n");
      const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
      // 2 x params x tokens (no attention)
      const double flops = 2.0 * weight_bytes / 2.0 * (P + N);
      std::printf(
          "| prefill %d x %d + %d decode | eager | %.3f | %.3f | %.0f | GEMM TFLOP/s %.1f | | %s "
          "|\n",
          S, P / S, N, mean, Percentile(ms, 0.5), (P + N) * 1000.0 / mean, flops / mean / 1e9,
          joules.c_str());
    }
  }
  return 0;
}
