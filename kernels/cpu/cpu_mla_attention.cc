#include "kernels/cpu/cpu_mla_attention.h"

#include "kernels/cpu/cpu_attention_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/quant.h"
#include "kernels/backend_registry.h"

namespace llm {

std::vector<int32_t> MlaDecodeSeqs(const AttentionBatch& batch) {
  std::vector<int32_t> seqs;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q_len = batch.q_indptr[s + 1] - batch.q_indptr[s];
    if (q_len >= 1 && q_len <= kMlaMaxDecodeQueryLen) seqs.push_back(s);
  }
  return seqs;
}

void CpuMlaAppendLatent(const MlaShape& s, const AttentionBatch& batch, const float* latent_new,
                        DType cache_dtype, float cache_scale, void* cache) {
  LLM_CHECK(cache_dtype == DType::kF32 || cache_dtype == DType::kFp8E4M3)
      << "MLA cache dtype " << DTypeName(cache_dtype);
  const size_t L = s.latent_dim();
  for (int t = 0; t < batch.num_tokens; ++t) {
    if (batch.slot_mapping[t] < 0) continue;  // a row that appends nothing
    const size_t row = static_cast<size_t>(batch.slot_mapping[t]) * L;  // slot = block*bs + off
    const float* src = latent_new + static_cast<size_t>(t) * L;
    if (cache_dtype == DType::kF32) {
      std::memcpy(static_cast<float*>(cache) + row, src, L * sizeof(float));
    } else {
      uint8_t* dst = static_cast<uint8_t*>(cache) + row;
      for (size_t i = 0; i < L; ++i) dst[i] = QuantizeFp8(src[i], cache_scale);
    }
  }
}

void CpuMlaGatherLatents(const MlaShape& s, const AttentionBatch& batch, int seq, DType cache_dtype,
                         float cache_scale, const void* cache, float* out) {
  const size_t L = s.latent_dim();
  const int kv_len = batch.kv_lens[seq];
  const int32_t* pages = batch.page_indices.data() + batch.page_indptr[seq];
  for (int j = 0; j < kv_len; ++j) {
    const size_t row =
        (static_cast<size_t>(pages[j / s.block_size]) * s.block_size + j % s.block_size) * L;
    float* dst = out + static_cast<size_t>(j) * L;
    if (cache_dtype == DType::kF32) {
      std::memcpy(dst, static_cast<const float*>(cache) + row, L * sizeof(float));
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(cache) + row;
      for (size_t i = 0; i < L; ++i) dst[i] = DequantizeFp8(src[i], cache_scale);
    }
  }
}

void CpuMlaDecode(const MlaDecodeParams& p, const AttentionBatch& batch,
                  std::span<const int32_t> seqs) {
  const MlaShape& s = p.shape;
  const int H = s.num_heads, C = s.kv_lora_rank, R = s.rope_dim, L = s.latent_dim();
  std::vector<float> latents, scores, acc(C);
  for (const int32_t seq : seqs) {
    const int q_begin = batch.q_indptr[seq], q_end = batch.q_indptr[seq + 1];
    const int kv_len = batch.kv_lens[seq];
    LLM_CHECK(q_end - q_begin <= kv_len) << "more query rows than cached tokens";
    latents.resize(static_cast<size_t>(kv_len) * L);
    CpuMlaGatherLatents(s, batch, seq, p.cache_dtype, p.cache_scale, p.cache, latents.data());
    scores.resize(kv_len);
    for (int t = q_begin; t < q_end; ++t) {
      const int pos = kv_len - (q_end - t);  // causal: attend to [0, pos]
      for (int h = 0; h < H; ++h) {
        const float* ql = p.q_latent + (static_cast<size_t>(t) * H + h) * C;
        const float* qp = p.q_pe + (static_cast<size_t>(t) * H + h) * R;
        for (int j = 0; j <= pos; ++j) {
          const float* c = latents.data() + static_cast<size_t>(j) * L;
          float dot = 0.0f;
          for (int i = 0; i < C; ++i) dot += ql[i] * c[i];
          for (int i = 0; i < R; ++i) dot += qp[i] * c[C + i];
          scores[j] = dot * p.softmax_scale;
        }
        // PV reads the latent part (the first C values) of the same cached rows.
        const float lse = SoftmaxWeightedSum(
            scores.data(), pos + 1,
            [&](int j) { return latents.data() + static_cast<size_t>(j) * L; }, C, acc.data(),
            p.out_latent + (static_cast<size_t>(t) * H + h) * C);
        if (p.lse != nullptr) p.lse[static_cast<size_t>(t) * H + h] = lse;
      }
    }
  }
}

namespace {

class CpuMlaBackend final : public MlaAttentionBackend {
 public:
  explicit CpuMlaBackend(const AttentionSpec& spec)
      : shape_{spec.num_q_heads, spec.head_dim - spec.mla_rope_dim, spec.mla_rope_dim,
               spec.block_size},
        dtype_(spec.kv_dtype) {
    LLM_CHECK(spec.mla_rope_dim > 0 && spec.mla_rope_dim < spec.head_dim)
        << "MLA spec needs 0 < mla_rope_dim < head_dim";
  }

  std::string name() const override { return "cpu_mla"; }
  size_t BlockBytes() const override {
    return static_cast<size_t>(shape_.block_size) * shape_.latent_dim() * DTypeSize(dtype_);
  }
  Status Plan(const AttentionBatch& batch) override {
    batch_ = &batch;  // outlives the step
    decode_seqs_ = MlaDecodeSeqs(batch);
    return Status::Ok();
  }
  Status Run(const AttentionParams&) override {
    LLM_CHECK(false) << "cpu_mla is an MLA backend: call RunMla";
    return Status::Ok();
  }
  Status RunMla(const MlaParams& p) override {
    LLM_CHECK(batch_ != nullptr) << "RunMla before Plan";
    CpuMlaAppendLatent(shape_, *batch_, static_cast<const float*>(p.latent_new), dtype_,
                       p.cache_scale, p.cache);
    if (decode_seqs_.empty()) return Status::Ok();
    MlaDecodeParams d;
    d.shape = shape_;
    d.cache_dtype = dtype_;
    d.cache = p.cache;
    d.cache_scale = p.cache_scale;
    d.q_latent = static_cast<const float*>(p.q_latent);
    d.q_pe = static_cast<const float*>(p.q_pe);
    d.softmax_scale = p.softmax_scale;
    d.out_latent = static_cast<float*>(p.out_latent);
    CpuMlaDecode(d, *batch_, decode_seqs_);
    return Status::Ok();
  }

 private:
  MlaShape shape_;
  DType dtype_;
  const AttentionBatch* batch_ = nullptr;
  std::vector<int32_t> decode_seqs_;
};

// Capabilities (any latent width, fp32 and fp8 caches) are this family's row in KernelCatalog().
const BackendRegistrar kRegistrar("cpu_mla", BackendFactoryOf<CpuMlaBackend>());

}  // namespace
}  // namespace llm
