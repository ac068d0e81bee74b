// The routing rule of one token on one warp (LaunchMoeRoute, kernels/cuda/moe/moe_ops.h), shared
// by the routing kernel (moe_route.cu) and the fused small-batch routing (moe_route_fused.cu)
// (internal; CUDA translation units).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda::moe_route {

constexpr int kPerLane = kMoeRouteMaxExperts / 32;

// (value, index) pairs ordered as MoeRouter's partial_sort: larger value first, ties to the lower
// index; index < 0 marks "none" and loses to everything.
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void WarpBest(float* v, int* i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, *i, o);
    if (Better(ov, oi, *v, *i)) *v = ov, *i = oi;
  }
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Routes token t (< a.num_tokens) with the whole warp (every lane calls it): reads a.logits row t,
// writes a.topk_ids / a.topk_w row t. score and choice: this warp's shared memory
// [kMoeRouteMaxExperts] each; a warp may route several tokens in turn through the same arrays.
__device__ __forceinline__ void RouteToken(const MoeRouteArgs& a, int t, int lane, float* score,
                                           float* choice) {
  __syncwarp();  // the warp's previous token has finished reading score / choice
  const int E = a.num_experts, K = a.top_k;
  const float* l = a.logits + static_cast<size_t>(t) * E;
  // The router's own bias is part of the logits (whatever the scoring).
  auto logit = [&](int e) { return l[e] + (a.logit_bias ? a.logit_bias[e] : 0.0f); };
  if (a.softmax_of_topk) {
    for (int e = lane; e < E; e += 32) score[e] = logit(e);
  } else if (!a.sigmoid) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, logit(e));
    mx = WarpMax(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += (score[e] = expf(logit(e) - mx));
    sum = WarpSum(sum);
    for (int e = lane; e < E; e += 32) score[e] /= sum;
  } else {
    for (int e = lane; e < E; e += 32) score[e] = 1.0f / (1.0f + expf(-logit(e)));
  }
  for (int e = lane; e < E; e += 32) choice[e] = score[e] + (a.bias ? a.bias[e] : 0.0f);
  __syncwarp();
  if (a.groups != 0) {
    const int G = a.n_group, per = E / G;
    float gs = 0.f;
    if (lane < G) {  // lane g scores group g
      const float* s = choice + lane * per;
      if (a.groups == 1) {
        gs = s[0];
        for (int i = 1; i < per; ++i) gs = fmaxf(gs, s[i]);
      } else {
        float x = -INFINITY, y = -INFINITY;
        for (int i = 0; i < per; ++i) {
          if (s[i] > x) {
            y = x;
            x = s[i];
          } else if (s[i] > y) {
            y = s[i];
          }
        }
        gs = x + y;
      }
    }
    uint32_t keep = 0;
    for (int k = 0; k < a.topk_group; ++k) {
      float v = gs;
      int i = lane < G && !((keep >> lane) & 1) ? lane : -1;
      WarpBest(&v, &i);
      keep |= 1u << i;
    }
    __syncwarp();
    for (int e = lane; e < E; e += 32) {
      if (!((keep >> (e / per)) & 1)) choice[e] = -INFINITY;
    }
    __syncwarp();
  }
  float mine[kPerLane];  // this lane's experts lane + 32 j
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    mine[j] = e < E ? choice[e] : 0.f;
  }
  uint32_t taken = 0;
  int32_t* ids = a.topk_ids + static_cast<size_t>(t) * K;
  float* w = a.topk_w + static_cast<size_t>(t) * K;
  float wk[kMoeRouteMaxTopK];
  float sum = 0.f;
  for (int k = 0; k < K; ++k) {
    float v = 0.f;
    int best = -1;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < E && !((taken >> j) & 1) && Better(mine[j], e, v, best)) v = mine[j], best = e;
    }
    WarpBest(&v, &best);
    if (best % 32 == lane) taken |= 1u << (best / 32);
    // noaux_tc weighs with the unbiased scores; the others with the (masked) choices.
    wk[k] = a.weigh_unbiased ? score[best] : choice[best];
    sum += wk[k];  // in k order, as the CPU
    if (lane == 0) ids[k] = best;
  }
  if (a.softmax_of_topk) {  // MoeRouter's order: max, exp in k order, then divide
    float mx = wk[0];
    for (int k = 1; k < K; ++k) mx = fmaxf(mx, wk[k]);
    sum = 0.f;
    for (int k = 0; k < K; ++k) sum += (wk[k] = expf(wk[k] - mx));
    for (int k = 0; k < K; ++k) wk[k] /= sum;
  }
  if (lane == 0) {
    for (int k = 0; k < K; ++k) {
      float x = wk[k];
      if (a.normalize) x /= sum + a.norm_eps;
      w[k] = x * a.scaling;
    }
  }
}

}  // namespace llm::cuda::moe_route
