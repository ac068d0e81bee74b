#include "kernels/cpu/cpu_c8_attention.h"

#include "kernels/cpu/cpu_attention_math.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/quant.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_attention_backend.h"

namespace llm {

QuantKvCacheView MakeQuantKvCacheView(const AttentionSpec& spec, const KvCacheLayer& layer) {
  QuantKvCacheView v;
  v.shape = {spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.block_size};
  v.dtype = spec.kv_dtype;
  v.quant = spec.kv_quant;
  v.k = layer.k;
  v.v = layer.v;
  v.k_scale = layer.k_scale;
  v.v_scale = layer.v_scale;
  v.k_block_scales = layer.k_block_scales;
  v.v_block_scales = layer.v_block_scales;
  return v;
}

float KvQuantMax(DType dtype) {
  return dtype == DType::kI8 ? kInt8Max : kFp8E4M3Max;
}

uint8_t QuantizeKvElement(DType dtype, float x, float scale) {
  if (dtype == DType::kI8) return static_cast<uint8_t>(QuantizeInt8(x, scale));
  return QuantizeFp8(x, scale);
}

float DequantizeKvElement(DType dtype, uint8_t q, float scale) {
  if (dtype == DType::kI8) return DequantizeInt8(static_cast<int8_t>(q), scale);
  return DequantizeFp8(q, scale);
}

float KvDynamicScale(DType dtype, const float* x, int n) {
  float absmax = 0.0f;
  for (int i = 0; i < n; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
  return DynamicScale(absmax, KvQuantMax(dtype));
}

namespace {

void CheckView(const QuantKvCacheView& c) {
  LLM_CHECK(c.dtype == DType::kI8 || c.dtype == DType::kFp8E4M3)
      << "8-bit KV cache with dtype " << DTypeName(c.dtype);
  LLM_CHECK(c.k != nullptr && c.v != nullptr) << "8-bit KV cache without storage";
  if (c.quant == KvQuant::kDynamicPerToken) {
    LLM_CHECK(c.k_block_scales != nullptr && c.v_block_scales != nullptr)
        << "dynamic KV quantization needs k_block_scales and v_block_scales";
  } else {
    LLM_CHECK(c.quant == KvQuant::kStaticPerHead || c.quant == KvQuant::kStaticPerChannel)
        << "8-bit KV cache with kv_quant " << KvQuantName(c.quant);
    LLM_CHECK(c.k_scale != nullptr && c.v_scale != nullptr)
        << "static KV quantization needs k_scale and v_scale";
  }
}

// Index of slot (block, offset) of KV head h in the dynamic scale arrays.
inline size_t BlockScaleIndex(const PagedAttentionShape& s, int block, int h, int offset) {
  return (static_cast<size_t>(block) * s.num_kv_heads + h) * s.block_size + offset;
}

// Quantizes one token-head vector src[0..d) into dst with the scales of its slot; dynamic mode
// computes and stores the slot's scale first.
void QuantizeRow(const QuantKvCacheView& c, const float* static_scale, float* block_scales,
                 int block, int h, int offset, const float* src, uint8_t* dst) {
  const int d = c.shape.head_dim;
  if (c.quant == KvQuant::kDynamicPerToken) {
    const float scale = KvDynamicScale(c.dtype, src, d);
    block_scales[BlockScaleIndex(c.shape, block, h, offset)] = scale;
    for (int i = 0; i < d; ++i) dst[i] = QuantizeKvElement(c.dtype, src[i], scale);
  } else if (c.quant == KvQuant::kStaticPerHead) {
    const float scale = static_scale[h];
    for (int i = 0; i < d; ++i) dst[i] = QuantizeKvElement(c.dtype, src[i], scale);
  } else {
    const float* scale = static_scale + static_cast<size_t>(h) * d;
    for (int i = 0; i < d; ++i) dst[i] = QuantizeKvElement(c.dtype, src[i], scale[i]);
  }
}

// Dequantizes the token-head vector stored in slot (block, offset) of KV head h into dst.
void DequantizeRow(const QuantKvCacheView& c, const uint8_t* cache, const float* static_scale,
                   const float* block_scales, int block, int h, int offset, float* dst) {
  const PagedAttentionShape& s = c.shape;
  const int d = s.head_dim;
  const uint8_t* src =
      cache + ((static_cast<size_t>(block) * s.num_kv_heads + h) * s.block_size + offset) * d;
  if (c.quant == KvQuant::kStaticPerChannel) {
    const float* scale = static_scale + static_cast<size_t>(h) * d;
    for (int i = 0; i < d; ++i) dst[i] = DequantizeKvElement(c.dtype, src[i], scale[i]);
    return;
  }
  const float scale = c.quant == KvQuant::kDynamicPerToken
                          ? block_scales[BlockScaleIndex(s, block, h, offset)]
                          : static_scale[h];
  for (int i = 0; i < d; ++i) dst[i] = DequantizeKvElement(c.dtype, src[i], scale);
}

}  // namespace

void CpuAppendKvQuant(const QuantKvCacheView& c, const AttentionBatch& batch, const float* k_new,
                      const float* v_new) {
  CheckView(c);
  auto* k_cache = static_cast<uint8_t*>(c.k);
  auto* v_cache = static_cast<uint8_t*>(c.v);
  ForEachAppendedRow(c.shape, batch, [&](int block, int h, int offset, size_t src, size_t dst) {
    QuantizeRow(c, c.k_scale, c.k_block_scales, block, h, offset, k_new + src, k_cache + dst);
    QuantizeRow(c, c.v_scale, c.v_block_scales, block, h, offset, v_new + src, v_cache + dst);
  });
}

// Per output element, the same operations in the same order as CpuPagedAttention, so on
// dequantized inputs the two agree to the last bit. Each sequence's K and V rows of one KV head
// are dequantized once into scratch and shared by that head's query rows and query heads.
void CpuPagedAttentionQuant(const QuantKvCacheView& c, const AttentionBatch& batch, const float* q,
                            float softmax_scale, float* out, int window_left,
                            const float* sink_logits) {
  CheckView(c);
  const PagedAttentionShape& s = c.shape;
  const int d = s.head_dim;
  const int group = s.num_q_heads / s.num_kv_heads;
  const auto* k_cache = static_cast<const uint8_t*>(c.k);
  const auto* v_cache = static_cast<const uint8_t*>(c.v);
  std::vector<float> scores, kf, vf;
  std::vector<float> acc(d);
  const std::vector<float> zero_row(d, 0.0f);  // the sink column's value vector
  const int sink_cols = sink_logits != nullptr ? 1 : 0;
  for (int seq = 0; seq < batch.num_seqs; ++seq) {
    const int q_begin = batch.q_indptr[seq], q_end = batch.q_indptr[seq + 1];
    const int kv_len = batch.kv_lens[seq];
    const int32_t* pages = batch.page_indices.data() + batch.page_indptr[seq];
    scores.resize(static_cast<size_t>(kv_len) + 1);  // + the sink column
    kf.resize(static_cast<size_t>(kv_len) * d);
    vf.resize(static_cast<size_t>(kv_len) * d);
    // The first row's window starts leftmost; nothing before it is read.
    const int lo = WindowStart(kv_len - (q_end - q_begin), window_left);
    for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      for (int j = lo; j < kv_len; ++j) {
        const int block = pages[j / s.block_size], offset = j % s.block_size;
        DequantizeRow(c, k_cache, c.k_scale, c.k_block_scales, block, kvh, offset,
                      kf.data() + static_cast<size_t>(j) * d);
        DequantizeRow(c, v_cache, c.v_scale, c.v_block_scales, block, kvh, offset,
                      vf.data() + static_cast<size_t>(j) * d);
      }
      for (int t = q_begin; t < q_end; ++t) {
        const int pos = kv_len - (q_end - t);  // causal: attend to [first, pos]
        const int first = WindowStart(pos, window_left);
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const float* qv = q + (static_cast<size_t>(t) * s.num_q_heads + h) * d;
          for (int j = first; j <= pos; ++j) {
            const float* kr = kf.data() + static_cast<size_t>(j) * d;
            float dot = 0.0f;
            for (int i = 0; i < d; ++i) dot += qv[i] * kr[i];
            scores[j - first] = dot * softmax_scale;
          }
          const int n = pos + 1 - first;
          if (sink_logits != nullptr) scores[n] = sink_logits[h];
          SoftmaxWeightedSum(
              scores.data(), n + sink_cols,
              [&](int j) {
                return j < n ? vf.data() + static_cast<size_t>(first + j) * d : zero_row.data();
              },
              d, acc.data(), out + (static_cast<size_t>(t) * s.num_q_heads + h) * d);
        }
      }
    }
  }
}

void CpuDequantizeKvCache(const QuantKvCacheView& c, int num_blocks, float* k_out, float* v_out) {
  CheckView(c);
  const PagedAttentionShape& s = c.shape;
  const size_t d = s.head_dim;
  for (int b = 0; b < num_blocks; ++b) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      for (int o = 0; o < s.block_size; ++o) {
        const size_t at = ((static_cast<size_t>(b) * s.num_kv_heads + h) * s.block_size + o) * d;
        DequantizeRow(c, static_cast<const uint8_t*>(c.k), c.k_scale, c.k_block_scales, b, h, o,
                      k_out + at);
        DequantizeRow(c, static_cast<const uint8_t*>(c.v), c.v_scale, c.v_block_scales, b, h, o,
                      v_out + at);
      }
    }
  }
}

namespace {

class CpuC8Backend final : public CpuAttentionBackend {
 public:
  explicit CpuC8Backend(const AttentionSpec& spec) : spec_(spec) {}

  std::string name() const override { return "cpu_c8"; }
  size_t BlockBytes() const override {
    const size_t slots = static_cast<size_t>(spec_.num_kv_heads) * spec_.block_size;
    size_t bytes = 2 * slots * spec_.head_dim * DTypeSize(spec_.kv_dtype);
    if (spec_.kv_quant == KvQuant::kDynamicPerToken) bytes += 2 * slots * sizeof(float);
    return bytes;
  }
  Status Run(const AttentionParams& p) override {
    const AttentionBatch& batch = this->batch();
    // Not in this family's catalog row, so selection never gives them to it.
    LLM_CHECK(p.logit_softcap == 0.0f && p.alibi_slopes == nullptr)
        << "cpu_c8 implements neither the logit soft-cap nor ALiBi";
    const QuantKvCacheView view = MakeQuantKvCacheView(spec_, p.cache);
    CpuAppendKvQuant(view, batch, static_cast<const float*>(p.k_new),
                     static_cast<const float*>(p.v_new));
    CpuPagedAttentionQuant(view, batch, static_cast<const float*>(p.q), p.softmax_scale,
                           static_cast<float*>(p.out), p.window_left, p.sink_logits);
    return Status::Ok();
  }

 private:
  AttentionSpec spec_;
};

// Capabilities (including kFeatureSlidingWindow and kFeatureSinks) are this family's row in
// KernelCatalog().
const BackendRegistrar kRegistrar("cpu_c8", BackendFactoryOf<CpuC8Backend>());

}  // namespace
}  // namespace llm
