// Token sampling on the device: penalties, temperature, top-k, top-p, min-p and the seeded draw,
// one CTA per logit row. Plain C++ header (no CUDA types; `stream` is a cudaStream_t).
//
// The arithmetic of the sampling definition (engine/sampling/sampler.h) lives here as inline
// functions that compile for the host and the device alike, so the CPU sampler and the kernel
// compute the same floats and the same integers: every operation is one IEEE-rounded step (no fused
// multiply-add, no library exp), and every mass is a fixed-point integer, so sums do not depend
// on the order of addition. Given the same logits and draw, both sides choose the same token.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LLM_SAMPLING_HD __host__ __device__ __forceinline__
#else
#define LLM_SAMPLING_HD inline
#endif

namespace llm {

// One row's sampling job: the request's parameters and its single draw for this token.
struct SamplingJob {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties); nothing is drawn
  int32_t top_k = 0;         // 0 (or >= vocab): off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  double u = 0.0;            // the uniform draw in [0, 1) from the request's own stream
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // A structured-output mask: row mask_row of SamplingArgs::masks (bit id & 31 of word id >> 5
  // set when token id is allowed); disallowed logits become -inf before anything else. -1: none.
  int32_t mask_row = -1;
};

// One token whose logit a row changes before sampling (each token at most once per row): a token
// the request has seen (prompt or generated), with the number of times it was generated, or -1 for
// a token it has not seen; and the request's logit_bias for it (0: none). The bias is added first
// (OpenAI's logit_bias, as the CPU sampler adds it), then the repetition penalty applies to every
// seen token, presence and frequency penalties to those with generated_count > 0.
struct PenaltyEntry {
  int32_t token = 0;
  int32_t generated_count = 0;
  float bias = 0.0f;
};

namespace sampling {

// Masses are p * 2^34 truncated to an integer: p <= 1 (the top token has p = 1 exactly), so a row
// of up to 2^19 tokens sums below 2^53, exactly representable as a double.
constexpr float kMassScale = 17179869184.0f;  // 2^34
// exp(x) below e^-80 is taken as 0 (it is far below kMassScale's resolution, and stays clear of
// denormals, which a device may flush).
constexpr float kExpFloor = -80.0f;

// Single IEEE-rounded operations. nvcc contracts a * b + c into an fma by default, which rounds
// once instead of twice; the intrinsics forbid that so the device matches the host bit for bit.
LLM_SAMPLING_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LLM_SAMPLING_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LLM_SAMPLING_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LLM_SAMPLING_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LLM_SAMPLING_HD double DMul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

LLM_SAMPLING_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
LLM_SAMPLING_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// Order-preserving integer key of a logit: a > b as floats <=> Key(a) > Key(b), and -0 == +0.
LLM_SAMPLING_HD uint32_t Key(float x) {
  const uint32_t u = FloatBits(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
LLM_SAMPLING_HD float KeyValue(uint32_t k) {
  return BitsFloat((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// exp(x) for x <= 0 (Cody-Waite reduction and the Cephes expf polynomial, ~1 ulp), written out so
// that host and device round identically.
LLM_SAMPLING_HD float Exp(float x) {
  if (!(x > kExpFloor)) return 0.0f;  // also NaN
  const float kMagic = 12582912.0f;   // 1.5 * 2^23: adding it rounds to an integer
  const float kf = Sub(Add(Mul(x, 1.44269504088896341f), kMagic), kMagic);
  const float r = Sub(Sub(x, Mul(kf, 0.693359375f)), Mul(kf, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = Add(Mul(p, r), 1.3981999507e-3f);
  p = Add(Mul(p, r), 8.3334519073e-3f);
  p = Add(Mul(p, r), 4.1665795894e-2f);
  p = Add(Mul(p, r), 1.6666665459e-1f);
  p = Add(Mul(p, r), 5.0000001201e-1f);
  const float y = Add(Add(Mul(Mul(p, r), r), r), 1.0f);
  // kf is in [-116, 0], so 2^kf is a normal float.
  return Mul(y, BitsFloat(static_cast<uint32_t>(static_cast<int>(kf) + 127) << 23));
}

LLM_SAMPLING_HD float InvTemperature(float temperature) {
  return Div(1.0f, temperature);
}

// Unnormalized probability of a logit: exp((l - max) * (1 / T)); 1 for the top token.
LLM_SAMPLING_HD float Prob(float logit, float max, float inv_t) {
  return Exp(Mul(Sub(logit, max), inv_t));
}

LLM_SAMPLING_HD uint64_t Mass(float p) {
  return static_cast<uint64_t>(Mul(p, kMassScale));  // exact scaling, then truncation
}

// top-p keeps the shortest prefix of the sorted order whose mass reaches ceil(top_p * total).
LLM_SAMPLING_HD uint64_t TopPTarget(float top_p, uint64_t total) {
  const double t = DMul(static_cast<double>(top_p), static_cast<double>(total));
  const uint64_t f = static_cast<uint64_t>(t);
  return f + (static_cast<double>(f) < t ? 1 : 0);
}

// The draw picks the first kept id whose cumulative mass exceeds floor(u * total) (< total).
LLM_SAMPLING_HD uint64_t DrawThreshold(double u, uint64_t total) {
  const uint64_t t = static_cast<uint64_t>(DMul(u, static_cast<double>(total)));
  return t < total ? t : total - 1;
}

// A logit after the penalties of its entry, exactly as the CPU sampler applies them.
LLM_SAMPLING_HD float Penalize(float logit, int32_t generated_count, const SamplingJob& job) {
  if (job.repetition_penalty != 1.0f) {
    logit = logit > 0.0f ? Div(logit, job.repetition_penalty) : Mul(logit, job.repetition_penalty);
  }
  if (generated_count > 0 && (job.presence_penalty != 0.0f || job.frequency_penalty != 0.0f)) {
    logit = Sub(logit, Add(job.presence_penalty,
                           Mul(job.frequency_penalty, static_cast<float>(generated_count))));
  }
  return logit;
}

// A logit after its entry: the bias, then the penalties of a seen token.
LLM_SAMPLING_HD float ApplyEntry(float logit, const PenaltyEntry& e, const SamplingJob& job) {
  if (e.bias != 0.0f) logit = Add(logit, e.bias);
  return e.generated_count < 0 ? logit : Penalize(logit, e.generated_count, job);
}

}  // namespace sampling

namespace cuda {

struct SamplingArgs {
  float* logits = nullptr;            // fp32 [num_logit_rows, vocab]; penalized in place
  int vocab = 0;                      // <= 2^19
  int num_jobs = 0;                   // one CTA each
  const int32_t* rows = nullptr;      // [num_jobs] logit row of each job; null: job j -> row j
  const SamplingJob* jobs = nullptr;  // [num_jobs]
  const int32_t* penalty_indptr = nullptr;  // [num_jobs + 1] CSR into penalties
  const PenaltyEntry* penalties = nullptr;  // [penalty_indptr[num_jobs]]
  const uint32_t* masks = nullptr;          // [rows of masks, mask_words] (SamplingJob::mask_row)
  int mask_words = 0;                       // >= ceil(vocab / 32)
  int32_t* tokens = nullptr;                // [num_jobs] out
};

// tokens[j] = the token of row rows[j] under jobs[j] and the sampling definition of
// engine/sampler.h. Deterministic: a job's token depends only on its row and job.
void LaunchSampling(const SamplingArgs& args, void* stream);

}  // namespace cuda
}  // namespace llm
