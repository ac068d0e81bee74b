// The attention-kernel selection rules (kernels/kernel_catalog.cc), tested as a table: device x
// attention kind x KV dtype x features -> kernel, or the reason nothing fits. Every family is
// given a stand-in factory and fixed code-object archs, so the rules are checked the same way in
// CPU-only, CUDA and HIP builds. docs/KERNEL_SELECTION.md is the prose version of this table.
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "kernels/backend_registry.h"
#include "tests/unit/stand_in_backend.h"

namespace llm {
namespace {

// The catalog as a binary built for sm_80, sm_90a and sm_120 plus gfx90a would see it.
BackendRegistry AllBuiltRegistry() {
  std::vector<BackendInfo> catalog = KernelCatalog();
  for (BackendInfo& b : catalog) {
    if (b.device == DeviceKind::kCuda) b.archs = {"80", "90a", "120"};
    if (b.device == DeviceKind::kHip) b.archs = {"gfx90a"};
    b.create = [name = b.name](const AttentionSpec&) -> std::unique_ptr<AttentionBackend> {
      return std::make_unique<test::StandInBackend>(name);
    };
  }
  return BackendRegistry(std::move(catalog));
}

struct Row {
  DeviceKind device;
  int arch;
  AttentionKind kind;
  DType kv;
  KvQuant quant;
  uint32_t features;
  int head_dim;
  const char* expect;  // backend name, or "" when nothing may fit
  const char* why;     // with "": a substring every candidate's reason must explain
};

AttentionSpec SpecOf(const Row& r) {
  AttentionSpec s;
  s.device = r.device;
  s.device_arch = r.arch;
  s.kind = r.kind;
  s.kv_dtype = r.kv;
  s.kv_quant = r.quant;
  s.features = r.features;
  s.head_dim = r.head_dim;
  s.block_size = 64;
  if (r.kind == AttentionKind::kMla) {
    s.num_q_heads = 16;
    s.num_kv_heads = 1;
    s.mla_rope_dim = 64;
  } else {
    s.num_q_heads = 32;
    s.num_kv_heads = 8;
  }
  return s;
}

constexpr DeviceKind kCpu = DeviceKind::kCpu, kCuda = DeviceKind::kCuda, kHip = DeviceKind::kHip;
constexpr AttentionKind kMha = AttentionKind::kMha, kMla = AttentionKind::kMla;
constexpr KvQuant kNoQ = KvQuant::kNone, kHead = KvQuant::kStaticPerHead,
                  kChan = KvQuant::kStaticPerChannel, kTok = KvQuant::kDynamicPerToken;
constexpr uint32_t kCausal = kFeatureCausal, kWin = kFeatureCausal | kFeatureSlidingWindow;

const Row kTable[] = {
    // CPU: fp32 oracle, 8-bit C8 reference, MLA reference.
    {kCpu, 0, kMha, DType::kF32, kNoQ, kCausal, 128, "cpu_reference", ""},
    {kCpu, 0, kMha, DType::kF32, kNoQ, kWin, 64, "cpu_reference", ""},
    {kCpu, 0, kMha, DType::kF32, kNoQ, kWin | kFeatureSoftCap, 256, "cpu_reference", ""},
    {kCpu, 0, kMha, DType::kF32, kNoQ, kWin | kFeatureSinks, 64, "cpu_reference", ""},
    {kCpu, 0, kMha, DType::kI8, kHead, kCausal, 128, "cpu_c8", ""},
    {kCpu, 0, kMha, DType::kI8, kHead, kWin | kFeatureSinks, 64, "cpu_c8", ""},
    {kCpu, 0, kMha, DType::kFp8E4M3, kTok, kCausal | kFeatureSinks, 64, "cpu_c8", ""},
    {kCpu, 0, kMha, DType::kI8, kHead, kWin | kFeatureSoftCap, 256, "", "softcap"},
    {kCpu, 0, kMha, DType::kFp8E4M3, kTok, kWin, 128, "cpu_c8", ""},
    {kCpu, 0, kMla, DType::kF32, kNoQ, kCausal, 576, "cpu_mla", ""},
    {kCpu, 0, kMla, DType::kFp8E4M3, kNoQ, kCausal, 576, "cpu_mla", ""},
    {kCpu, 0, kMha, DType::kBF16, kNoQ, kCausal, 128, "", "bfloat16"},
    {kCpu, 0, kMha, DType::kF32, kNoQ, kCausal | kFeatureAlibi, 128, "cpu_reference", ""},
    {kCpu, 0, kMha, DType::kI8, kHead, kCausal | kFeatureAlibi, 128, "", "alibi"},
    // CUDA: C8 wins causal attention with windows and sinks; FMHA serves what C8 lacks.
    {kCuda, 90, kMha, DType::kBF16, kNoQ, kCausal, 128, "cuda_c8", ""},
    {kCuda, 80, kMha, DType::kBF16, kNoQ, kCausal, 64, "cuda_c8", ""},
    {kCuda, 120, kMha, DType::kI8, kChan, kCausal, 128, "cuda_c8", ""},
    {kCuda, 90, kMha, DType::kFp8E4M3, kTok, kCausal, 128, "cuda_c8", ""},
    {kCuda, 90, kMha, DType::kBF16, kNoQ, kWin, 128, "cuda_c8", ""},
    {kCuda, 90, kMha, DType::kF16, kNoQ, kCausal, 128, "cuda_fmha", ""},
    {kCuda, 90, kMha, DType::kBF16, kNoQ, kCausal | kFeatureSoftCap, 128, "cuda_fmha", ""},
    {kCuda, 90, kMha, DType::kBF16, kNoQ, kCausal | kFeatureAlibi, 64, "cuda_fmha", ""},
    {kCuda, 90, kMha, DType::kBF16, kNoQ, kWin | kFeatureSinks, 64, "cuda_c8", ""},
    {kCuda, 90, kMha, DType::kI8, kHead, kWin, 128, "cuda_c8", ""},
    {kCuda, 80, kMha, DType::kFp8E4M3, kHead, kCausal | kFeatureSinks, 128, "cuda_c8", ""},
    {kCuda, 90, kMha, DType::kF16, kNoQ, kWin | kFeatureSinks, 64, "cuda_fmha", ""},
    {kCuda, 90, kMha, DType::kI8, kHead, kWin | kFeatureSoftCap, 128, "", "softcap"},
    // Head dim 256 (Gemma): C8 has none, FMHA serves it; 8-bit caches there have no kernel.
    {kCuda, 90, kMha, DType::kBF16, kNoQ, kCausal, 256, "cuda_fmha", ""},
    {kCuda, 90, kMha, DType::kBF16, kNoQ, kWin | kFeatureSoftCap, 256, "cuda_fmha", ""},
    {kCuda, 90, kMha, DType::kI8, kHead, kCausal, 256, "", "head_dim 256"},
    {kCuda, 75, kMha, DType::kBF16, kNoQ, kCausal, 128, "", "sm_75"},
    // sm_100 has no sm_100 code object, but the plain "80" / "120" ones carry PTX for it.
    {kCuda, 100, kMha, DType::kBF16, kNoQ, kCausal, 128, "cuda_c8", ""},
    {kCuda, 90, kMla, DType::kBF16, kNoQ, kCausal, 576, "cuda_mla", ""},
    {kCuda, 120, kMla, DType::kFp8E4M3, kNoQ, kCausal, 576, "cuda_mla", ""},
    {kCuda, 80, kMla, DType::kBF16, kNoQ, kCausal, 576, "", "sm_80"},
    {kCuda, 90, kMla, DType::kF32, kNoQ, kCausal, 576, "", "float32"},
    // HIP: the FMHA family, for gfx90a code objects only.
    {kHip, 0x90a, kMha, DType::kBF16, kNoQ, kCausal, 128, "hip_fmha", ""},
    {kHip, 0x90a, kMha, DType::kF16, kNoQ, kWin | kFeatureAlibi, 64, "hip_fmha", ""},
    {kHip, 0x90a, kMha, DType::kBF16, kNoQ, kWin | kFeatureSoftCap, 256, "hip_fmha", ""},
    {kHip, 0x942, kMha, DType::kBF16, kNoQ, kCausal, 128, "", "gfx942"},
    {kHip, 0x90a, kMla, DType::kBF16, kNoQ, kCausal, 576, "", "kind"},
    {kHip, 0x90a, kMha, DType::kI8, kHead, kCausal, 128, "", "int8"},
};

// The first CUDA row (bf16 causal, sm_90: cuda_c8 and cuda_fmha both fit).
size_t FirstCudaRow() {
  size_t i = 0;
  while (kTable[i].device != kCuda) ++i;
  return i;
}

TEST_CASE("Kernel selection follows the catalog's rules, row by row", "[selection]") {
  const BackendRegistry reg = AllBuiltRegistry();
  for (const Row& r : kTable) {
    const AttentionSpec spec = SpecOf(r);
    const Selection sel = reg.Select(spec);
    INFO(sel.Table(spec));
    if (*r.expect) {
      REQUIRE(sel.info != nullptr);
      CHECK(sel.info->name == r.expect);
    } else {
      CHECK(sel.info == nullptr);
      bool explained = false;
      for (const SelectionRow& row : sel.rows) {
        explained |= row.reason.find(r.why) != std::string::npos;
      }
      CHECK(explained);
    }
  }
}

TEST_CASE("Selection table says what was chosen and why", "[selection]") {
  const BackendRegistry reg = AllBuiltRegistry();
  const AttentionSpec spec =
      SpecOf(kTable[FirstCudaRow()]);  // CUDA bf16 causal: c8 and fmha both fit
  const Selection sel = reg.Select(spec);
  const std::string table = sel.Table(spec);
  CHECK(table.find("sm_90") != std::string::npos);
  CHECK(table.find("SELECTED (highest priority of 2 that fit)") != std::string::npos);
  CHECK(table.find("fits, lower priority") != std::string::npos);
  CHECK(table.find("device is cpu") != std::string::npos);
}

TEST_CASE("Head dim 256 selects cuda_fmha and cuda_c8 refuses it by name", "[selection]") {
  const BackendRegistry reg = AllBuiltRegistry();
  AttentionSpec spec = SpecOf(kTable[FirstCudaRow()]);
  spec.head_dim = 256;
  const Selection sel = reg.Select(spec);
  const std::string table = sel.Table(spec);
  INFO(table);
  REQUIRE(sel.info != nullptr);
  CHECK(sel.info->name == "cuda_fmha");
  bool c8_refused = false;
  for (const SelectionRow& row : sel.rows) {
    if (row.name == "cuda_c8") c8_refused = !row.fits && row.reason == "no head_dim 256";
  }
  CHECK(c8_refused);
  CHECK(table.find("SELECTED (the only one that fits)") != std::string::npos);
}

TEST_CASE("The attention_backend override picks a lower-priority kernel or fails", "[selection]") {
  const BackendRegistry reg = AllBuiltRegistry();
  const AttentionSpec spec = SpecOf(kTable[FirstCudaRow()]);
  const Selection forced = reg.Select(spec, "cuda_fmha");
  REQUIRE(forced.info != nullptr);
  CHECK(forced.info->name == "cuda_fmha");
  std::string table;
  auto wrong = reg.Create(spec, "cpu_reference", &table);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().message().find("device is cpu") != std::string::npos);
  CHECK(wrong.status().message().find("forced backend 'cpu_reference'") != std::string::npos);
}

TEST_CASE("A family described but not compiled in is named as such", "[selection]") {
  std::vector<BackendInfo> catalog = KernelCatalog();
  for (BackendInfo& b : catalog) b.archs.clear();  // any arch; factories stay unset
  const BackendRegistry reg(std::move(catalog));
  AttentionSpec spec = SpecOf(kTable[FirstCudaRow()]);  // CUDA bf16 + sliding window
  spec.features = kWin;
  auto created = reg.Create(spec, "", nullptr);
  REQUIRE_FALSE(created.ok());
  CHECK(created.status().message().find("cuda_fmha: not built into this binary "
                                        "(configure with -DLLM_ENABLE_CUDA=ON)") !=
        std::string::npos);
}

TEST_CASE("Code-object archs: exact for 'a' targets and gfx, forward (PTX) otherwise",
          "[selection]") {
  CHECK(ArchRuns(kCuda, "90a", 90));
  CHECK_FALSE(ArchRuns(kCuda, "90a", 100));
  CHECK(ArchRuns(kCuda, "80", 90));
  CHECK_FALSE(ArchRuns(kCuda, "80", 75));
  CHECK(ArchRuns(kCuda, "120", 121));
  CHECK(ArchRuns(kHip, "gfx90a", 0x90a));
  CHECK_FALSE(ArchRuns(kHip, "gfx90a", 0x942));
  CHECK(SplitArchList("80;90a-real;120") == std::vector<std::string>{"80", "90a", "120"});
  CHECK(ArchName(kHip, 0x90a) == "gfx90a");
  CHECK(ArchName(kCuda, 120) == "sm_120");
}

TEST_CASE("Every catalog family this binary compiled has attached its factory", "[selection]") {
  // The CPU families are always built; GPU families when their toolchain was on. Each attaches
  // its factory from its own file, so a family missing from the link shows up here.
  bool cuda = false, hip = false;
#ifdef LLM_HAVE_CUDA
  cuda = true;
#endif
#ifdef LLM_HAVE_HIP
  hip = true;
#endif
  for (const BackendInfo& b : BackendRegistry::Global().backends()) {
    INFO(b.name);
    const bool built = b.device == DeviceKind::kCpu || (b.device == DeviceKind::kCuda && cuda) ||
                       (b.device == DeviceKind::kHip && hip);
    CHECK((b.create != nullptr) == built);
  }
}

}  // namespace
}  // namespace llm
