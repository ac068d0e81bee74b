// BackendRegistry::CreateBackends: the registry's whole choice for a model (decode backend,
// prefill family beside it, each family's own kernel options), so that no model definition
// selects or casts. Stand-in factories over the real catalog rules, as in test_kernel_selection.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend_registry.h"
#include "tests/unit/stand_in_backend.h"

namespace llm {
namespace {

// What each stand-in saw, by backend name (Configure calls, the options it got).
std::map<std::string, std::vector<AttentionOptions>>& Configured() {
  static std::map<std::string, std::vector<AttentionOptions>> seen;
  return seen;
}

class MhaStandIn final : public test::StandInBackend {
 public:
  using StandInBackend::StandInBackend;
  Status Configure(const AttentionOptions& options) override {
    Configured()[name()].push_back(options);
    return AttentionBackend::Configure(options);
  }
};

class MlaStandIn final : public MlaAttentionBackend {
 public:
  std::string name() const override { return "cuda_mla"; }
  size_t BlockBytes() const override { return 64; }
  Status Plan(const AttentionBatch&) override { return Status::Ok(); }
  Status Run(const AttentionParams&) override { return Status::Ok(); }
  Status RunMla(const MlaParams&) override { return Status::Ok(); }
};

// The catalog as a binary with every family built would see it; `bytes` gives a family's block
// size (64 when not named), to make layouts differ.
BackendRegistry Registry(const std::map<std::string, size_t>& bytes = {}) {
  std::vector<BackendInfo> catalog = KernelCatalog();
  for (BackendInfo& b : catalog) {
    if (b.device == DeviceKind::kCuda) b.archs = {"80", "90a", "120"};
    if (b.device == DeviceKind::kHip) b.archs = {"gfx90a"};
    const auto it = bytes.find(b.name);
    const size_t n = it == bytes.end() ? 64 : it->second;
    const bool mla = b.kind == AttentionKind::kMla;
    b.create = [name = b.name, n, mla](const AttentionSpec&) -> std::unique_ptr<AttentionBackend> {
      if (mla) return std::make_unique<MlaStandIn>();
      return std::make_unique<MhaStandIn>(name, n);
    };
  }
  return BackendRegistry(std::move(catalog));
}

AttentionSpec CudaMha(DType kv, KvQuant quant = KvQuant::kNone) {
  AttentionSpec s;
  s.device = DeviceKind::kCuda;
  s.device_arch = 90;
  s.kv_dtype = kv;
  s.kv_quant = quant;
  s.num_q_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  return s;
}

}  // namespace

TEST_CASE("A 16-bit cache gets the prefill family beside the decode backend", "[selection]") {
  const BackendRegistry reg = Registry();
  Configured().clear();
  std::vector<std::string> log;
  AttentionOptions o;
  auto b = reg.CreateBackends(CudaMha(DType::kBF16), o, &log);
  REQUIRE(b.ok());
  CHECK(b->decode->name() == "cuda_c8");
  REQUIRE(b->prefill != nullptr);
  CHECK(b->prefill->name() == "cuda_fmha");
  CHECK(&b->For(true) == b->prefill.get());
  CHECK(&b->For(false) == b->decode.get());
  CHECK(b->decode->mla() == nullptr);
  // Both families were configured with the options, once each.
  CHECK(Configured()["cuda_c8"].size() == 1);
  CHECK(Configured()["cuda_fmha"].size() == 1);
  REQUIRE(!log.empty());
  CHECK(log.back() ==
        "steps with a prefill chunk attend through cuda_fmha, decode steps through cuda_c8");

  o.prefill_backend = "none";
  b = reg.CreateBackends(CudaMha(DType::kBF16), o, nullptr);
  REQUIRE(b.ok());
  CHECK(b->prefill == nullptr);
  CHECK(&b->For(true) == b->decode.get());

  // A forced decode backend that is the prefill family itself: no second backend.
  o.prefill_backend = "auto";
  o.backend = "cuda_fmha";
  b = reg.CreateBackends(CudaMha(DType::kBF16), o, nullptr);
  REQUIRE(b.ok());
  CHECK(b->decode->name() == "cuda_fmha");
  CHECK(b->prefill == nullptr);
}

TEST_CASE("An 8-bit cache has no prefill family, and naming one fails with the table",
          "[selection]") {
  const BackendRegistry reg = Registry();
  AttentionOptions o;
  auto b = reg.CreateBackends(CudaMha(DType::kI8, KvQuant::kStaticPerHead), o, nullptr);
  REQUIRE(b.ok());
  CHECK(b->decode->name() == "cuda_c8");
  CHECK(b->prefill == nullptr);

  o.prefill_backend = "cuda_fmha";
  std::vector<std::string> log;
  b = reg.CreateBackends(CudaMha(DType::kI8, KvQuant::kStaticPerHead), o, &log);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("forced backend 'cuda_fmha'") != std::string::npos);
  REQUIRE(log.size() == 2);
  CHECK(log[1].rfind("prefill attention: ", 0) == 0);
}

TEST_CASE("A prefill family must share the decode backend's block layout", "[selection]") {
  const BackendRegistry reg = Registry({{"cuda_fmha", 32}});
  AttentionOptions o;
  auto b = reg.CreateBackends(CudaMha(DType::kBF16), o, nullptr);  // auto: quietly none
  REQUIRE(b.ok());
  CHECK(b->prefill == nullptr);
  o.prefill_backend = "cuda_fmha";  // named: an error naming both
  b = reg.CreateBackends(CudaMha(DType::kBF16), o, nullptr);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message() ==
        "prefill attention backend cuda_fmha lays out KV blocks differently from cuda_c8");
}

AttentionSpec CudaMla() {
  AttentionSpec mla;
  mla.device = DeviceKind::kCuda;
  mla.device_arch = 90;
  mla.kind = AttentionKind::kMla;
  mla.kv_dtype = DType::kBF16;
  mla.num_q_heads = 16;
  mla.num_kv_heads = 1;
  mla.head_dim = 576;
  mla.mla_rope_dim = 64;
  return mla;
}

TEST_CASE("c8_prefill reaches cuda_c8 only where it attends the prefill chunks", "[selection]") {
  const BackendRegistry reg = Registry();
  AttentionOptions o;
  for (const char* value : {"tiles", "fmha"}) {
    o.c8_prefill = value;
    // 16-bit cache: prefill chunks go to cuda_fmha, which has no such choice.
    auto b = reg.CreateBackends(CudaMha(DType::kBF16), o, nullptr);
    REQUIRE_FALSE(b.ok());
    CHECK(b.status().message() == std::string("c8_prefill ") + value +
                                      ": steps with a prefill chunk attend through cuda_fmha, "
                                      "which has no c8_prefill choice (it steers cuda_c8)");
    // 8-bit cache: cuda_c8 attends every step and gets the option.
    Configured().clear();
    b = reg.CreateBackends(CudaMha(DType::kI8, KvQuant::kStaticPerHead), o, nullptr);
    REQUIRE(b.ok());
    REQUIRE(Configured()["cuda_c8"].size() == 1);
    CHECK(Configured()["cuda_c8"][0].c8_prefill == value);
  }
  // With prefill_attention_backend none cuda_c8 attends the prefill chunks of a 16-bit cache too
  // (whether it can apply the value is its Configure's call).
  o.c8_prefill = "tiles";
  o.prefill_backend = "none";
  CHECK(reg.CreateBackends(CudaMha(DType::kBF16), o, nullptr).ok());
  // A forced cuda_fmha attends everything: the option has nowhere to go.
  o.backend = "cuda_fmha";
  auto b = reg.CreateBackends(CudaMha(DType::kBF16), o, nullptr);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("c8_prefill tiles: steps with a prefill chunk attend through "
                                  "cuda_fmha") == 0);
  // The MLA family has no c8_prefill either.
  AttentionOptions m;
  m.c8_prefill = "fmha";
  b = reg.CreateBackends(CudaMla(), m, nullptr);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message() ==
        "c8_prefill fmha: steps with a prefill chunk attend through cuda_mla, which has no "
        "c8_prefill choice (it steers cuda_c8)");
}

TEST_CASE("mla_kernel is refused by the dense families, applied by cuda_mla", "[selection]") {
  const BackendRegistry reg = Registry();
  for (const char* value : {"wgmma", "portable"}) {
    AttentionOptions o;
    o.mla_kernel = value;
    for (DType kv : {DType::kBF16, DType::kI8}) {
      const KvQuant q = kv == DType::kI8 ? KvQuant::kStaticPerHead : KvQuant::kNone;
      auto b = reg.CreateBackends(CudaMha(kv, q), o, nullptr);
      REQUIRE_FALSE(b.ok());
      CHECK(b.status().message() == std::string("mla_kernel ") + value +
                                        ": steps without a prefill chunk attend through cuda_c8, "
                                        "which has no mla_kernel choice (it steers cuda_mla)");
    }
  }
  AttentionOptions m;
  auto got = reg.CreateBackends(CudaMla(), m, nullptr);
  REQUIRE(got.ok());
  REQUIRE(got->decode->mla() != nullptr);  // the MLA interface without a cast
  CHECK(got->prefill == nullptr);
  // The catalog says cuda_mla takes the option; the stand-in implements no choice, so the
  // default MlaAttentionBackend::Configure refuses it rather than ignoring it.
  m.mla_kernel = "wgmma";
  got = reg.CreateBackends(CudaMla(), m, nullptr);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().message() == "mla_kernel wgmma: backend 'cuda_mla' has no MLA kernel choice");
}

}  // namespace llm
