// Device sampling, one CTA of 1024 threads per logit row. Nothing is sorted: top-k and top-p are
// thresholds found by radix selection over the order-preserving integer keys of the logits (three
// digits of 11, 11 and 10 bits), top-k by element counts and top-p by fixed-point masses, each
// digit one pass over the row with a shared-memory histogram. Ties at a threshold are kept in
// ascending id order up to the exact count, as the sorted definition does. The draw is a
// block-wide prefix over ids in order. Every sum is an integer, so atomics and reduction order
// cannot change a result.
//
// Passes over a row of V logits (4 bytes each, from L2/HBM); the time grows with the passes
// (tests/gpu/test_sampling.cc "[.bench]" times them at serving shape):
//   greedy: 1 (argmax)
//   temperature: 2 (max; kept mass per warp chunk) + 1/32 (the crossing chunk)
//   top-k: + up to 2 (digits 2 and 3; digit 1 rides with the max)
//   top-p: + 1 (mass above e^-1 .. e^-16; only over > 4096 candidates)
//          + up to 3 digits (early out when the cut bin holds one candidate)
// One CTA per row: a row streams through one SM, latency-bound, and a large batch needs more
// than one wave. Splitting rows over several CTAs is the next step if this matters.
#include <cuda_runtime.h>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/sampling/sampling.h"

namespace llm::cuda {
namespace {

using sampling::Key;
using sampling::KeyValue;
using sampling::Mass;
using sampling::Prob;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2 * kThreads;  // 11-bit digits; SelectFromTop gives each thread two bins
constexpr unsigned kFull = 0xffffffffu;
constexpr unsigned kAll = 0xffffffffu;  // Cut::count: no limit on ties
constexpr int kUnroll = 8;              // loads in flight per thread
// top-p over more candidates than this first bounds the cut from below (see the top-p step).
constexpr int kPrefilterMin = 4096;
constexpr int kLevels = 5;
__constant__ float kLevelProb[kLevels] = {0.3678794f, 0.1353353f, 0.0183156f, 3.354626e-4f,
                                          1.125352e-7f};  // e^-1, e^-2, e^-4, e^-8, e^-16

// The kept set so far: key > key, or key == key and the element is among the first `count` such
// ids (tie rank in ascending id order).
struct Cut {
  unsigned key;
  unsigned count;
};

// The intersection of two cuts is the one with the larger key (the smaller count on equal keys).
__device__ __forceinline__ Cut Tighter(Cut a, Cut b) {
  if (a.key != b.key) return a.key > b.key ? a : b;
  return {a.key, min(a.count, b.count)};
}

struct Digit {
  int shift;
  unsigned width_mask;
  unsigned high_mask;  // key bits above this digit, fixed by earlier digits
};

__device__ __forceinline__ Digit DigitOf(int d) {
  if (d == 0) return {21, 0x7ffu, 0u};
  if (d == 1) return {10, 0x7ffu, 0xffe00000u};
  return {0, 0x3ffu, 0xfffffc00u};
}

struct Shared {
  unsigned count[kBins];
  unsigned long long mass[kBins];
  unsigned long long scan[kWarps + 1];
  float best_v[kWarps];
  int best_i[kWarps];
  unsigned long long chunk_mass[kWarps];
  unsigned chunk_ties[kWarps];
  unsigned level_key[kLevels];
  int argmax;
  int sel_bin;
  unsigned long long sel_above;
  int chunk;
  unsigned long long chunk_rem;
  unsigned chunk_ties_before;
  int token;
};

__device__ __forceinline__ unsigned long long WarpInclusiveScan(unsigned long long v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// Exclusive prefix of v over the threads in order; *total gets the sum. Every thread must call.
__device__ unsigned long long BlockExclusiveScan(unsigned long long v, Shared& s,
                                                 unsigned long long* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned long long inc = WarpInclusiveScan(v);
  if (lane == 31) s.scan[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const unsigned long long w = s.scan[lane];
    const unsigned long long wi = WarpInclusiveScan(w);
    s.scan[lane] = wi - w;
    if (lane == 31) s.scan[kWarps] = wi;
  }
  __syncthreads();
  const unsigned long long out = s.scan[warp] + inc - v;
  if (total) *total = s.scan[kWarps];
  __syncthreads();  // s.scan is reused by the next call
  return out;
}

// Calls f(i, logit, valid) for every id, each thread visiting its ids in ascending order. Every
// thread of the block runs the same number of calls, so f may use warp-wide intrinsics. Rows of a
// vocab divisible by 4 are read as float4 (four times the bytes in flight per load).
template <typename F>
__device__ __forceinline__ void ForEachElement(const float* row, int vocab, F&& f) {
  if (vocab % 4 == 0) {
    constexpr int kVecUnroll = kUnroll / 2;
    for (int base = 0; base < vocab; base += kThreads * 4 * kVecUnroll) {
      float4 v[kVecUnroll];
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u) {
        const int i = base + (u * kThreads + static_cast<int>(threadIdx.x)) * 4;
        v[u] = i < vocab ? *reinterpret_cast<const float4*>(row + i) : float4{};
      }
#pragma unroll
      for (int u = 0; u < kVecUnroll; ++u) {
        const int i = base + (u * kThreads + static_cast<int>(threadIdx.x)) * 4;
        f(i, v[u].x, i < vocab);
        f(i + 1, v[u].y, i < vocab);
        f(i + 2, v[u].z, i < vocab);
        f(i + 3, v[u].w, i < vocab);
      }
    }
    return;
  }
  for (int base = 0; base < vocab; base += kThreads * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
      v[u] = i < vocab ? row[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
      f(i, v[u], i < vocab);
    }
  }
}

// Adds one element per lane (bin < 0: none) to the histogram. Lanes with the same bin are
// combined first (__match_any_sync), so a crowded bin costs one shared atomic per warp, not 32.
// q < 2^35 is summed in two 17/18-bit halves because the warp reduction is 32-bit.
__device__ __forceinline__ void HistAdd(Shared& s, int bin, unsigned long long q, bool with_mass) {
  if (!__any_sync(kFull, bin >= 0)) return;  // later digits: most warps hold no candidate
  const unsigned peers = __match_any_sync(kFull, bin);
  if (bin < 0) return;
  const bool leader = static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1;
  if (with_mass) {
    const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(q >> 17));
    const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(q & 0x1ffffu));
    if (leader) atomicAdd(&s.mass[bin], (static_cast<unsigned long long>(hi) << 17) + lo);
  }
  if (leader) atomicAdd(&s.count[bin], static_cast<unsigned>(__popc(peers)));
}

// Scanning bins from the top, finds bin b with above(b) < need <= above(b) + hist[b], where
// above(b) sums the bins over b. Needs 0 < need <= sum. Writes s.sel_bin and s.sel_above.
template <typename T>
__device__ void SelectFromTop(const T* hist, unsigned long long need, Shared& s) {
  const int b0 = kBins - 1 - 2 * static_cast<int>(threadIdx.x), b1 = b0 - 1;
  const unsigned long long v0 = hist[b0], v1 = hist[b1];
  const unsigned long long above = BlockExclusiveScan(v0 + v1, s, nullptr);
  if (above < need && need <= above + v0) {
    s.sel_bin = b0;
    s.sel_above = above;
  } else if (above + v0 < need && need <= above + v0 + v1) {
    s.sel_bin = b1;
    s.sel_above = above + v0;
  }
  __syncthreads();
}

// The lowest key whose logit has Prob >= p (binary search; Prob rises with the key up to rounding,
// and any key is a valid bound, so rounding only loosens it). max's key always qualifies.
__device__ unsigned LowestKeyWithProb(float p, float top, float inv_t) {
  unsigned lo = 0, hi = Key(top);
  while (lo < hi) {
    const unsigned mid = lo + (hi - lo) / 2;
    if (Prob(KeyValue(mid), top, inv_t) >= p) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

__device__ void ClearHistogram(Shared& s) {
  __syncthreads();  // earlier readers of the histogram are done
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s.count[b] = 0;
    s.mass[b] = 0;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) SamplingKernel(const SamplingArgs a) {
  ptx::GridDependencySync();  // launched with LaunchPdl
  __shared__ Shared s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int V = a.vocab;
  const int j = blockIdx.x;
  float* row = a.logits + static_cast<size_t>(a.rows ? a.rows[j] : j) * V;  // [vocab]
  const SamplingJob job = a.jobs[j];
  const bool greedy = job.temperature == 0.0f;
  const bool use_top_k = !greedy && job.top_k > 0 && job.top_k < V;
  const bool use_top_p = !greedy && job.top_p < 1.0f;
  const bool use_min_p = !greedy && job.min_p > 0.0f;

  // A structured-output mask first, then logit bias and penalties, in place.
  if (job.mask_row >= 0) {
    const uint32_t* mask = a.masks + static_cast<size_t>(job.mask_row) * a.mask_words;
    for (int i = tid; i < V; i += kThreads) {
      if (!((mask[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
    }
    __syncthreads();  // an entry's token may be one another thread masked
  }
  // Each entry names a distinct token.
  for (int e = a.penalty_indptr[j] + tid; e < a.penalty_indptr[j + 1]; e += kThreads) {
    const PenaltyEntry pe = a.penalties[e];
    if (pe.token >= 0 && pe.token < V) row[pe.token] = sampling::ApplyEntry(row[pe.token], pe, job);
  }
  for (int b = tid; b < kBins; b += kThreads) s.count[b] = 0;
  if (tid == 0) s.token = -1;
  __syncthreads();

  // Pass 1: the max (lowest id among equals, as std::max_element) and top-k's first digit.
  float best = -INFINITY;
  int best_i = V;
  ForEachElement(row, V, [&](int i, float l, bool valid) {
    if (valid && (l > best || (l == best && i < best_i))) {
      best = l;
      best_i = i;
    }
    if (use_top_k) {
      HistAdd(s, valid ? static_cast<int>(Key(l) >> 21) : -1, 0, false);
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, best, o);
    const int oi = __shfl_xor_sync(kFull, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  if (lane == 0) {
    s.best_v[warp] = best;
    s.best_i[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    best = s.best_v[lane];
    best_i = s.best_i[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, best, o);
      const int oi = __shfl_xor_sync(kFull, best_i, o);
      if (ov > best || (ov == best && oi < best_i)) {
        best = ov;
        best_i = oi;
      }
    }
    if (lane == 0) s.argmax = best_i < V ? best_i : 0;
  }
  __syncthreads();
  const int argmax = s.argmax;
  if (greedy) {
    if (tid == 0) a.tokens[j] = argmax;
    return;
  }
  const float top = row[argmax];  // the max logit
  const float inv_t = sampling::InvTemperature(job.temperature);

  Cut cut{0u, kAll};  // everything
  if (use_top_k) {
    // Radix select of the k-th largest key by counts.
    unsigned long long need = static_cast<unsigned>(job.top_k);
    unsigned prefix = 0;
    for (int d = 0; d < 3; ++d) {
      const Digit dg = DigitOf(d);
      if (d > 0) {
        ClearHistogram(s);
        ForEachElement(row, V, [&](int, float l, bool valid) {
          const unsigned key = Key(l);
          const bool in = valid && (key & dg.high_mask) == prefix;
          HistAdd(s, in ? static_cast<int>((key >> dg.shift) & dg.width_mask) : -1, 0, false);
        });
        __syncthreads();
      }
      SelectFromTop(s.count, need, s);
      const int bin = s.sel_bin;
      need -= s.sel_above;
      prefix |= static_cast<unsigned>(bin) << dg.shift;
      if (s.count[bin] == need) {  // the whole bin is kept: no tie to cut
        cut = {prefix, kAll};
        break;
      }
      if (d == 2) cut = {prefix, static_cast<unsigned>(need)};
    }
  }

  if (use_top_p) {
    // Radix select of the top-p cut by mass, over the top-k set. The first `count` ties at a
    // limited top-k cut all have one mass; they enter the histogram as one addition.
    const Cut kcut = cut;
    const bool limited = kcut.count != kAll;
    const unsigned long long q_kcut = limited ? Mass(Prob(KeyValue(kcut.key), top, inv_t)) : 0;
    auto candidate = [&](unsigned key) { return key > kcut.key || (key == kcut.key && !limited); };
    unsigned long long need = 0;
    // Candidates have keys >= floor_key. With many candidates, one pass first sums the mass above
    // a few probability levels; the highest level already holding the target mass bounds the cut
    // from below, and the histogram passes skip everything under it (in a peaked row, almost all).
    unsigned floor_key = 0;
    const bool prefilter = (use_top_k ? job.top_k : V) > kPrefilterMin;
    if (prefilter) {
      if (tid < kLevels) s.level_key[tid] = LowestKeyWithProb(kLevelProb[tid], top, inv_t);
      __syncthreads();
      unsigned level_key[kLevels];
#pragma unroll
      for (int k = 0; k < kLevels; ++k) level_key[k] = s.level_key[k];
      unsigned long long total = 0, above[kLevels] = {};
      auto add = [&](unsigned key, unsigned long long q) {
        total += q;
#pragma unroll
        for (int k = 0; k < kLevels; ++k) above[k] += key >= level_key[k] ? q : 0;
      };
      ForEachElement(row, V, [&](int, float l, bool valid) {
        const unsigned key = Key(l);
        if (valid && candidate(key)) add(key, Mass(Prob(l, top, inv_t)));
      });
      if (tid == 0 && limited) add(kcut.key, kcut.count * q_kcut);
      BlockExclusiveScan(total, s, &total);
      need = sampling::TopPTarget(job.top_p, total);
#pragma unroll
      for (int k = 0; k < kLevels; ++k) {
        BlockExclusiveScan(above[k], s, &above[k]);
        if (floor_key == 0 && above[k] >= need) floor_key = level_key[k];
      }
    }
    unsigned prefix = 0;
    for (int d = 0; d < 3; ++d) {
      const Digit dg = DigitOf(d);
      ClearHistogram(s);
      if (tid == 0 && limited && kcut.key >= floor_key && (kcut.key & dg.high_mask) == prefix) {
        const int b = static_cast<int>((kcut.key >> dg.shift) & dg.width_mask);
        atomicAdd(&s.count[b], kcut.count);
        atomicAdd(&s.mass[b], kcut.count * q_kcut);
      }
      ForEachElement(row, V, [&](int, float l, bool valid) {
        const unsigned key = Key(l);
        const bool in =
            valid && candidate(key) && key >= floor_key && (key & dg.high_mask) == prefix;
        const unsigned long long q = in ? Mass(Prob(l, top, inv_t)) : 0;
        HistAdd(s, in ? static_cast<int>((key >> dg.shift) & dg.width_mask) : -1, q, true);
      });
      __syncthreads();
      if (d == 0 && !prefilter) {
        unsigned long long total = 0;
        BlockExclusiveScan(s.mass[2 * tid] + s.mass[2 * tid + 1], s, &total);
        need = sampling::TopPTarget(job.top_p, total);
      }
      SelectFromTop(s.mass, need, s);
      const int bin = s.sel_bin;
      need -= s.sel_above;
      prefix |= static_cast<unsigned>(bin) << dg.shift;
      if (s.count[bin] == 1) {  // one candidate in the cut bin: it ends the prefix
        cut = Tighter(kcut, {max(prefix, floor_key), kAll});
        break;
      }
      if (d == 2) {
        // All of the bin's tokens share key `prefix`; the prefix takes as many as reach `need`.
        const unsigned long long q = Mass(Prob(KeyValue(prefix), top, inv_t));
        cut = Tighter(kcut, {prefix, static_cast<unsigned>((need + q - 1) / q)});
      }
    }
  }

  // The draw. Phase 1: each warp sums the kept mass of its contiguous chunk of ids (ties at a
  // limited cut are counted, their mass added once their ranks are known).
  const bool limited = cut.count != kAll;
  const float min_p = job.min_p;
  // Chunks of a multiple of 4 ids keep float4 loads aligned.
  const int chunk = ((V + kWarps - 1) / kWarps + 3) / 4 * 4;
  {
    const int c0 = warp * chunk, c1 = min(V, c0 + chunk);
    unsigned long long mass = 0;
    unsigned ties = 0;
    auto add = [&](float l) {
      const unsigned key = Key(l);
      if (key > cut.key || (key == cut.key && !limited)) {
        const float p = Prob(l, top, inv_t);
        if (!use_min_p || p >= min_p) mass += Mass(p);
      } else if (key == cut.key) {
        ++ties;
      }
    };
    if (V % 4 == 0) {
      for (int base = c0; base < c1; base += 32 * 4 * kUnroll) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = base + (u * 32 + lane) * 4;
          v[u] = i < c1 ? *reinterpret_cast<const float4*>(row + i) : float4{};
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (base + (u * 32 + lane) * 4 >= c1) continue;
          add(v[u].x);
          add(v[u].y);
          add(v[u].z);
          add(v[u].w);
        }
      }
    } else {
      for (int base = c0; base < c1; base += 32 * kUnroll) {
        float v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = base + u * 32 + lane;
          v[u] = i < c1 ? row[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (base + u * 32 + lane < c1) add(v[u]);
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mass += __shfl_xor_sync(kFull, mass, o);
      ties += __shfl_xor_sync(kFull, ties, o);
    }
    if (lane == 0) {
      s.chunk_mass[warp] = mass;
      s.chunk_ties[warp] = ties;
    }
  }
  __syncthreads();
  if (warp == 0) {
    unsigned long long q_cut = 0;
    if (limited) {
      const float p = Prob(KeyValue(cut.key), top, inv_t);
      if (!use_min_p || p >= min_p) q_cut = Mass(p);
    }
    const unsigned ties = s.chunk_ties[lane];
    const unsigned before = static_cast<unsigned>(WarpInclusiveScan(ties) - ties);
    const unsigned kept = !limited || before >= cut.count ? 0u : min(ties, cut.count - before);
    const unsigned long long w = s.chunk_mass[lane] + kept * q_cut;
    const unsigned long long incl = WarpInclusiveScan(w);
    const unsigned long long total = __shfl_sync(kFull, incl, 31);
    const unsigned long long threshold = sampling::DrawThreshold(job.u, total);
    const unsigned hit = __ballot_sync(kFull, incl > threshold);
    const int c = hit ? __ffs(hit) - 1 : kWarps - 1;
    if (lane == c) {
      s.chunk = c;
      s.chunk_rem = threshold - (incl - w);
      s.chunk_ties_before = before;
    }
  }
  __syncthreads();

  // Phase 2: the block walks the crossing chunk, each thread a contiguous run of ids.
  const int c0 = s.chunk * chunk, c1 = min(V, c0 + chunk);
  const int per = (chunk + kThreads - 1) / kThreads;
  const int t0 = min(c1, c0 + tid * per), t1 = min(c1, t0 + per);
  unsigned my_ties = 0;
  if (limited) {
    for (int i = t0; i < t1; ++i) my_ties += Key(row[i]) == cut.key ? 1u : 0u;
  }
  const unsigned rank0 =
      s.chunk_ties_before + static_cast<unsigned>(BlockExclusiveScan(my_ties, s, nullptr));
  // Mass of id i if kept (0 if not); `rank` counts the ties at a limited cut seen so far.
  auto kept_mass = [&](float l, unsigned& rank) -> unsigned long long {
    const unsigned key = Key(l);
    if (key < cut.key) return 0;
    if (key == cut.key && limited && rank++ >= cut.count) return 0;
    const float p = Prob(l, top, inv_t);
    return !use_min_p || p >= min_p ? Mass(p) : 0;
  };
  unsigned long long my_mass = 0;
  unsigned rank = rank0;
  for (int i = t0; i < t1; ++i) my_mass += kept_mass(row[i], rank);
  const unsigned long long before = BlockExclusiveScan(my_mass, s, nullptr);
  const unsigned long long rem = s.chunk_rem;
  if (before <= rem && rem < before + my_mass) {
    unsigned long long cum = before;
    rank = rank0;
    for (int i = t0; i < t1; ++i) {
      cum += kept_mass(row[i], rank);
      if (cum > rem) {
        s.token = i;
        break;
      }
    }
  }
  __syncthreads();
  if (tid == 0) a.tokens[j] = s.token >= 0 ? s.token : argmax;  // the argmax is always kept
}

}  // namespace

void LaunchSampling(const SamplingArgs& args, void* stream) {
  if (args.num_jobs == 0) return;
  (void)LaunchPdl(SamplingKernel, dim3(args.num_jobs), dim3(kThreads), 0,
                  static_cast<cudaStream_t>(stream), args);
}

}  // namespace llm::cuda
