#include "kernels/cpu/cpu_paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_attention_backend.h"
#include "kernels/cpu/cpu_attention_math.h"

namespace llm {

void CpuAppendKv(const PagedAttentionShape& s, const AttentionBatch& batch, const float* k_new,
                 const float* v_new, float* k_cache, float* v_cache) {
  const size_t bytes = s.head_dim * sizeof(float);
  ForEachAppendedRow(s, batch, [&](int, int, int, size_t src, size_t dst) {
    std::memcpy(k_cache + dst, k_new + src, bytes);
    std::memcpy(v_cache + dst, v_new + src, bytes);
  });
}

void CpuPagedAttention(const PagedAttentionShape& s, const AttentionBatch& batch, const float* q,
                       const float* k_cache, const float* v_cache, float softmax_scale, float* out,
                       int window_left, float logit_softcap, const float* sink_logits,
                       const float* alibi_slopes) {
  const int d = s.head_dim;
  const int group = s.num_q_heads / s.num_kv_heads;
  std::vector<float> scores;
  std::vector<float> acc(d);
  const std::vector<float> zero_row(d, 0.0f);  // the sink column's value vector
  for (int seq = 0; seq < batch.num_seqs; ++seq) {
    const int q_begin = batch.q_indptr[seq], q_end = batch.q_indptr[seq + 1];
    const int kv_len = batch.kv_lens[seq];
    const int32_t* pages = batch.page_indices.data() + batch.page_indptr[seq];
    scores.resize(static_cast<size_t>(kv_len) + 1);  // + the sink column
    for (int t = q_begin; t < q_end; ++t) {
      const int pos = kv_len - (q_end - t);  // causal: attend to [first, pos]
      const int first = WindowStart(pos, window_left);
      for (int h = 0; h < s.num_q_heads; ++h) {
        const int kvh = h / group;
        const float* qv = q + (static_cast<size_t>(t) * s.num_q_heads + h) * d;
        auto row = [&](int j) {
          return ((static_cast<size_t>(pages[j / s.block_size]) * s.num_kv_heads + kvh) *
                      s.block_size +
                  j % s.block_size) *
                 d;
        };
        for (int j = first; j <= pos; ++j) {
          const float* kr = k_cache + row(j);
          float dot = 0.0f;
          for (int i = 0; i < d; ++i) dot += qv[i] * kr[i];
          float score = dot * softmax_scale;
          if (logit_softcap > 0.0f) score = logit_softcap * std::tanh(score / logit_softcap);
          if (alibi_slopes != nullptr) score += alibi_slopes[h] * static_cast<float>(j - pos);
          scores[j - first] = score;
        }
        const int n = pos + 1 - first;
        if (sink_logits != nullptr) scores[n] = sink_logits[h];
        SoftmaxWeightedSum(
            scores.data(), n + (sink_logits != nullptr ? 1 : 0),
            [&](int j) { return j < n ? v_cache + row(first + j) : zero_row.data(); }, d,
            acc.data(), out + (static_cast<size_t>(t) * s.num_q_heads + h) * d);
      }
    }
  }
}

namespace {

class CpuReferenceBackend final : public CpuAttentionBackend {
 public:
  explicit CpuReferenceBackend(const AttentionSpec& spec)
      : shape_{spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.block_size} {}

  std::string name() const override { return "cpu_reference"; }
  size_t BlockBytes() const override {
    return 2ull * shape_.num_kv_heads * shape_.block_size * shape_.head_dim * sizeof(float);
  }
  Status Run(const AttentionParams& p) override {
    const AttentionBatch& batch = this->batch();
    auto* k_cache = static_cast<float*>(p.cache.k);
    auto* v_cache = static_cast<float*>(p.cache.v);
    CpuAppendKv(shape_, batch, static_cast<const float*>(p.k_new),
                static_cast<const float*>(p.v_new), k_cache, v_cache);
    CpuPagedAttention(shape_, batch, static_cast<const float*>(p.q), k_cache, v_cache,
                      p.softmax_scale, static_cast<float*>(p.out), p.window_left, p.logit_softcap,
                      p.sink_logits, p.alibi_slopes);
    return Status::Ok();
  }

 private:
  PagedAttentionShape shape_;
};

// Capabilities (sliding window, soft-cap, sinks, ALiBi) are this family's row in KernelCatalog().
const BackendRegistrar kRegistrar("cpu_reference", BackendFactoryOf<CpuReferenceBackend>());

}  // namespace
}  // namespace llm
