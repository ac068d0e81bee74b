#include "kernels/cpu/cpu_fmha.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "base/dtype.h"
#include "kernels/cpu/cpu_attention_math.h"

namespace llm {
namespace {

// The key that query row i sits on (see fmha_params.h): top-left masks align row i with key i;
// every other mask type (and ALiBi under them) is bottom-right aligned.
int DiagonalKey(const FmhaMask& m, int i, int seqlen_q, int seqlen_k) {
  return m.type == FmhaMaskType::kCausalTopLeft ? i : i + seqlen_k - seqlen_q;
}

float Widen(FmhaDType t, uint16_t bits) {
  return t == FmhaDType::kBf16 ? Bf16ToF32(bits) : F16ToF32(bits);
}

void WidenRow(FmhaDType t, const uint16_t* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = Widen(t, src[i]);
}

// Element offset of key j's head_dim row for KV head kvh of sequence b, in either KV layout.
size_t KeyOffset(const FmhaParams& p, int b, int j, int kvh) {
  const size_t d = p.head_dim;
  if (p.block_size > 0) {
    const int block =
        p.block_table[static_cast<size_t>(b) * p.max_blocks_per_seq + j / p.block_size];
    return ((static_cast<size_t>(block) * p.num_kv_heads + kvh) * p.block_size + j % p.block_size) *
           d;
  }
  if (p.seqstart_k != nullptr) {
    return ((static_cast<size_t>(p.seqstart_k[b]) + j) * p.num_kv_heads + kvh) * d;
  }
  const int row = p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b;
  return ((static_cast<size_t>(row) * p.cache_seqlen + j) * p.num_kv_heads + kvh) * d;
}

void CheckParams(const FmhaParams& p) {
  LLM_CHECK(p.dtype == FmhaDType::kBf16 || p.dtype == FmhaDType::kFp16) << "fmha: bad dtype";
  LLM_CHECK(p.batch >= 0 && p.head_dim > 0)
      << "fmha: batch " << p.batch << " head_dim " << p.head_dim;
  LLM_CHECK(p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0)
      << "fmha: num_q_heads " << p.num_q_heads << " is not a multiple of num_kv_heads "
      << p.num_kv_heads;
  LLM_CHECK(p.batch == 0 || p.seqlen_k != nullptr) << "fmha: seqlen_k is required";
  LLM_CHECK(p.q != nullptr && p.k != nullptr && p.v != nullptr) << "fmha: null q/k/v";
  if (p.block_size > 0) {
    LLM_CHECK(p.block_table != nullptr) << "fmha: paged KV without a block table";
  } else {
    LLM_CHECK(p.block_size == 0) << "fmha: negative block_size";
  }
  LLM_CHECK(p.seqstart_k == nullptr || (p.block_size == 0 && p.cache_batch_idx == nullptr))
      << "fmha: packed KV (seqstart_k) is contiguous and takes no cache_batch_idx";
  for (int b = 0; b < p.batch; ++b) {
    const int capacity = p.block_size > 0 ? p.max_blocks_per_seq * p.block_size
                         : p.seqstart_k   ? p.seqstart_k[b + 1] - p.seqstart_k[b]
                                          : p.cache_seqlen;
    LLM_CHECK(p.seqlen_k[b] >= 0 && p.seqlen_k[b] <= capacity)
        << "fmha: sequence " << b << " has " << p.seqlen_k[b] << " keys; its cache holds "
        << capacity;
  }
}

}  // namespace

bool FmhaKeyVisible(const FmhaMask& m, int i, int j, int seqlen_q, int seqlen_k) {
  if (j < 0 || j >= seqlen_k) return false;
  const int p = DiagonalKey(m, i, seqlen_q, seqlen_k);
  switch (m.type) {
    case FmhaMaskType::kNone:
      return true;
    case FmhaMaskType::kCausalTopLeft:
    case FmhaMaskType::kCausalBottomRight:
      return j <= p;  // sink tokens add nothing: causality bounds them too
    case FmhaMaskType::kWindow: {
      const bool right_ok = m.window_right < 0 || j <= p + m.window_right;
      if (!right_ok) return false;
      const bool left_ok = m.window_left < 0 || j >= p - m.window_left;
      return left_ok || j < m.sink_tokens;
    }
  }
  return false;
}

void CpuFmhaForward(const FmhaParams& p, float* out_f32) {
  CheckParams(p);
  const int d = p.head_dim;
  const int group = p.num_q_heads / p.num_kv_heads;
  const auto* q_bits = static_cast<const uint16_t*>(p.q);
  const auto* k_bits = static_cast<const uint16_t*>(p.k);
  const auto* v_bits = static_cast<const uint16_t*>(p.v);

  std::vector<float> kf, vf, qf(d), acc(d), scores;
  std::vector<int> keys;                       // visible keys of one row; -1 = the sink logit
  const std::vector<float> zero_row(d, 0.0f);  // the sink's value vector
  std::vector<char> needed;
  for (int b = 0; b < p.batch; ++b) {
    const int q_begin = p.seqstart_q ? p.seqstart_q[b] : b * p.seqlen_q;
    const int sq = p.seqstart_q ? p.seqstart_q[b + 1] - q_begin : p.seqlen_q;
    const int sk = p.seqlen_k[b];
    // Widen only keys some row can see: the rest (outside every window) is never touched.
    needed.assign(sk, 0);
    for (int i = 0; i < sq; ++i) {
      for (int j = 0; j < sk; ++j) needed[j] |= FmhaKeyVisible(p.mask, i, j, sq, sk);
    }
    kf.resize(static_cast<size_t>(sk) * d);
    vf.resize(static_cast<size_t>(sk) * d);
    scores.resize(static_cast<size_t>(sk) + 1);
    keys.resize(static_cast<size_t>(sk) + 1);
    for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
      for (int j = 0; j < sk; ++j) {
        if (!needed[j]) continue;
        const size_t at = KeyOffset(p, b, j, kvh);
        WidenRow(p.dtype, k_bits + at, d, kf.data() + static_cast<size_t>(j) * d);
        WidenRow(p.dtype, v_bits + at, d, vf.data() + static_cast<size_t>(j) * d);
      }
      for (int i = 0; i < sq; ++i) {
        const size_t t = static_cast<size_t>(q_begin) + i;
        const int diag = DiagonalKey(p.mask, i, sq, sk);
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          WidenRow(p.dtype, q_bits + (t * p.num_q_heads + h) * d, d, qf.data());
          int n = 0;
          for (int j = 0; j < sk; ++j) {
            if (!FmhaKeyVisible(p.mask, i, j, sq, sk)) continue;
            const float* kr = kf.data() + static_cast<size_t>(j) * d;
            float s = 0.0f;
            for (int x = 0; x < d; ++x) s += qf[x] * kr[x];
            s *= p.softmax_scale;
            if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
            if (p.alibi_slopes) s += p.alibi_slopes[h] * static_cast<float>(j - diag);
            scores[n] = s;
            keys[n++] = j;
          }
          // A learned sink is one more softmax column whose value vector is zero.
          if (p.sink_logits) {
            scores[n] = p.sink_logits[h];
            keys[n++] = -1;
          }
          float* o = out_f32 + (t * p.num_q_heads + h) * d;
          float lse = -INFINITY;
          if (n == 0) {
            std::fill(o, o + d, 0.0f);
          } else {
            lse = SoftmaxWeightedSum(
                scores.data(), n,
                [&](int c) {
                  return keys[c] < 0 ? zero_row.data()
                                     : vf.data() + static_cast<size_t>(keys[c]) * d;
                },
                d, acc.data(), o);
          }
          if (p.lse) p.lse[t * p.num_q_heads + h] = lse;
        }
      }
    }
  }
}

}  // namespace llm
