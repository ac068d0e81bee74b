// The selection rules: what every attention kernel family supports and which one is preferred
// where several fit. This table is the single source of truth; implementations only attach their
// factories (BackendRegistrar in their own files), and docs/KERNEL_SELECTION.md explains it.
// Tested row by row in tests/unit/test_kernel_selection.cc.
#include "kernels/backend_registry.h"

// The CUDA / HIP code objects this binary carries (set by kernels/CMakeLists.txt).
#ifndef LLM_CUDA_ARCHS
#define LLM_CUDA_ARCHS ""
#endif
#ifndef LLM_HIP_ARCHS
#define LLM_HIP_ARCHS ""
#endif

namespace llm {

std::vector<BackendInfo> KernelCatalog() {
  const std::vector<KvQuant> kAllQuants = {KvQuant::kNone, KvQuant::kStaticPerHead,
                                           KvQuant::kStaticPerChannel, KvQuant::kDynamicPerToken};
  const std::vector<KvQuant> k8BitQuants = {KvQuant::kStaticPerHead, KvQuant::kStaticPerChannel,
                                            KvQuant::kDynamicPerToken};
  // Everything the FMHA family implements beyond plain causal attention.
  const uint32_t kFmhaFeatures =
      kFeatureCausal | kFeatureSlidingWindow | kFeatureAlibi | kFeatureSoftCap | kFeatureSinks;
  const std::vector<std::string> cuda_archs = SplitArchList(LLM_CUDA_ARCHS);
  const std::vector<std::string> hip_archs = SplitArchList(LLM_HIP_ARCHS);
  const std::string kCudaHint = "configure with -DLLM_ENABLE_CUDA=ON";
  const std::string kHipHint = "configure with -DLLM_ENABLE_HIP=ON";
  std::vector<BackendInfo> c;

  // ---- CPU: the numerical oracles, and the embedded default.
  c.push_back(BackendInfo{.name = "cpu_reference",
                          .device = DeviceKind::kCpu,
                          .kind = AttentionKind::kMha,
                          .kv_dtypes = {DType::kF32},
                          .features = kFeatureCausal | kFeatureSlidingWindow | kFeatureAlibi |
                                      kFeatureSoftCap | kFeatureSinks,
                          .priority = 0});
  c.push_back(BackendInfo{.name = "cpu_c8",
                          .device = DeviceKind::kCpu,
                          .kind = AttentionKind::kMha,
                          .kv_dtypes = {DType::kI8, DType::kFp8E4M3},
                          .kv_quants = k8BitQuants,
                          .features = kFeatureCausal | kFeatureSlidingWindow | kFeatureSinks,
                          .priority = 0});
  c.push_back(BackendInfo{.name = "cpu_mla",
                          .device = DeviceKind::kCpu,
                          .kind = AttentionKind::kMla,
                          .kv_dtypes = {DType::kF32, DType::kFp8E4M3},
                          .features = kFeatureCausal,
                          .priority = 0});

  // ---- CUDA. C8 is the fastest for what it covers (causal GQA with sliding windows and sink
  // logits, 16- and 8-bit caches), so it outranks FMHA, which serves the masks and score
  // modifiers C8 lacks (ALiBi, soft-capping, head_dim 256).
  c.push_back(BackendInfo{.name = "cuda_c8",
                          .device = DeviceKind::kCuda,
                          .min_arch = 80,
                          .kind = AttentionKind::kMha,
                          .kv_dtypes = {DType::kBF16, DType::kI8, DType::kFp8E4M3},
                          .kv_quants = kAllQuants,
                          .head_dims = {64, 128},
                          .min_block_size = 16,
                          .features = kFeatureCausal | kFeatureSlidingWindow | kFeatureSinks,
                          .priority = 10,
                          .kernel_options = {"c8_prefill"},
                          .archs = cuda_archs,
                          .build_hint = kCudaHint});
  c.push_back(BackendInfo{.name = "cuda_fmha",
                          .device = DeviceKind::kCuda,
                          .min_arch = 80,
                          .kind = AttentionKind::kMha,
                          .kv_dtypes = {DType::kBF16, DType::kF16},
                          .head_dims = {64, 128, 256},
                          .min_block_size = 16,
                          .features = kFmhaFeatures,
                          .priority = 5,
                          .prefill_priority = 1,
                          .archs = cuda_archs,
                          .build_hint = kCudaHint});
  // The SM120 design (mma.sync, <= 99 KB shared memory) also runs on Hopper; fp8 MMA needs sm_89+
  // and it is tested on sm_90 and newer only.
  c.push_back(BackendInfo{.name = "cuda_mla",
                          .device = DeviceKind::kCuda,
                          .min_arch = 90,
                          .kind = AttentionKind::kMla,
                          .kv_dtypes = {DType::kBF16, DType::kFp8E4M3},
                          .head_dims = {576},
                          .min_block_size = 64,
                          .features = kFeatureCausal,
                          .priority = 10,
                          .mla_rope_dim = 64,
                          .kernel_options = {"mla_kernel"},
                          .archs = cuda_archs,
                          .build_hint = kCudaHint});

  // ---- HIP (AMD): the FMHA family from the same source as cuda_fmha.
  c.push_back(BackendInfo{.name = "hip_fmha",
                          .device = DeviceKind::kHip,
                          .kind = AttentionKind::kMha,
                          .kv_dtypes = {DType::kBF16, DType::kF16},
                          .head_dims = {64, 128, 256},
                          .min_block_size = 16,
                          .features = kFmhaFeatures,
                          .priority = 5,
                          .prefill_priority = 1,
                          .archs = hip_archs,
                          .build_hint = kHipHint});
  return c;
}

}  // namespace llm
