// The host-side sizes of the MoE layer's small-batch kernels (kernels/cuda/moe/moe_ops.h), on the
// CPU: the fused routing's column slices cover every router column once and its partial sums fit
// the buffer CudaMoeLayer reserves; the batches and shapes it refuses; the down GEMMs' column
// blocks each have a combine ticket; the batches and shapes the GEMVs serve. The kernels
// themselves: gpu_tests "[moe]".
#include <catch2/catch.hpp>

#include "kernels/cuda/moe/moe_ops.h"

namespace llm::cuda {
namespace {

TEST_CASE("Fused MoE routing: column slices cover the router, partial sums fit", "[moe]") {
  for (const int hidden : {4, 252, 256, 260, 1000, 2048, 2880, 7168}) {
    INFO("hidden " << hidden);
    const int splits = MoeRouteFusedSplits(hidden);
    CHECK(splits * kMoeRouteFusedCols >= hidden);       // every column in some slice
    CHECK((splits - 1) * kMoeRouteFusedCols < hidden);  // no slice without columns
    for (const int experts : {1, 8, 32, 128, 512}) {
      for (int tokens = 1; tokens <= kMoeRouteFusedMaxTokens; ++tokens) {
        CHECK(MoeRouteFusedPartials(tokens, experts, hidden) == int64_t{splits} * tokens * experts);
        // What the layer reserves for a larger cap holds a smaller batch's partials.
        CHECK(MoeRouteFusedPartials(tokens, experts, hidden) <=
              MoeRouteFusedPartials(kMoeRouteFusedMaxTokens, experts, hidden));
      }
    }
  }
  CHECK(MoeRouteFusedOk(1, 2048));
  CHECK(MoeRouteFusedOk(kMoeRouteFusedMaxTokens, 2880));
  CHECK(!MoeRouteFusedOk(0, 2048));
  CHECK(!MoeRouteFusedOk(kMoeRouteFusedMaxTokens + 1, 2048));
  CHECK(!MoeRouteFusedOk(1, 2046));  // rows read as float4
  CHECK(!MoeRouteFusedOk(1, 0));
}

TEST_CASE("MoE down GEMM combine: a ticket for every column block", "[moe]") {
  // LaunchMoeGemm's blocks are kMoeGemmN columns; the MXFP4 GEMMs' at least 32 (whole 64-row
  // weight groups); the last block may be partial.
  for (const int n_out : {64, 128, 2048, 2880, 7168}) {
    INFO("n_out " << n_out);
    CHECK(MoeCombineTickets(n_out) >= (n_out + kMoeGemmN - 1) / kMoeGemmN);
    CHECK(MoeCombineTickets(n_out) >= (n_out + 31) / 32);
    // The GEMVs' blocks: kMoeGemvColumnBlock columns, n_out a multiple of it (MoeGemvShapeOk).
    if (MoeGemvShapeOk(MoeGemvWeights::kBf16, n_out, 64)) {
      CHECK(MoeCombineTickets(n_out) >= n_out / kMoeGemvColumnBlock);
    }
  }
}

// Issue 51's decode shapes take the GEMVs: Qwen3-30B-A3B (128 experts top-8, hidden 2048, expert
// intermediate 768), DeepSeek-V2-Lite (64 top-6, 1408, shared 2 x 1408) and gpt-oss-20b (32
// top-4, 2880 both, MXFP4) at batches 1..16 where their slots average at most
// kMoeGemvMaxRowsPerExpert per expert; never past kMoeGemvMaxTokens, never an unaligned row.
TEST_CASE("MoE GEMV: the batches and shapes it serves", "[moe]") {
  struct Model {
    int E, K, H, I, SI;
    bool mx;
  };
  for (const Model m : {Model{128, 8, 2048, 768, 0, false}, Model{64, 6, 2048, 1408, 2816, false},
                        Model{32, 4, 2880, 2880, 0, true}}) {
    INFO("experts " << m.E << " top-" << m.K);
    CHECK(MoeGemvShapeOk(m.mx ? MoeGemvWeights::kMxfp4 : MoeGemvWeights::kBf16, m.I,
                         m.H));  // gate_up
    CHECK(MoeGemvShapeOk(m.mx ? MoeGemvWeights::kMxfp4 : MoeGemvWeights::kBf16, m.H, m.I));  // down
    if (m.SI > 0) {
      CHECK(MoeGemvShapeOk(MoeGemvWeights::kBf16, m.SI, m.H));
      CHECK(MoeGemvShapeOk(MoeGemvWeights::kBf16, m.H, m.SI));
    }
    for (int t = 1; t <= kMoeGemvMaxTokens; ++t) {
      CHECK(MoeGemvBatchOk(t, m.K, m.E) == (t * m.K <= kMoeGemvMaxRowsPerExpert * m.E));
    }
    CHECK(MoeGemvBatchOk(1, m.K, m.E));
    CHECK(MoeGemvBatchOk(8, m.K, m.E));
    CHECK(!MoeGemvBatchOk(kMoeGemvMaxTokens + 1, m.K, m.E));
  }
  CHECK(!MoeGemvBatchOk(0, 8, 128));
  CHECK(!MoeGemvBatchOk(1, 8, 0));
  // No expert of a GEMV batch holds more rows than one permutation tile.
  CHECK(kMoeGemvMaxTokens <= kMoeTileRows);
  CHECK(!MoeGemvShapeOk(MoeGemvWeights::kBf16, 2048, 2044));        // bf16 rows of 16-byte loads
  CHECK(!MoeGemvShapeOk(MoeGemvWeights::kMxfp4, 2048, 2880 + 16));  // MXFP4: whole scale groups
  CHECK(!MoeGemvShapeOk(MoeGemvWeights::kBf16, 2048 + 16, 2048));   // combine column blocks
  CHECK(!MoeGemvShapeOk(MoeGemvWeights::kBf16, 0, 2048));
  CHECK(MoeGemvShapeOk(MoeGemvWeights::kBf16, 96, 8));
  CHECK(!MoeGemvShapeOk(MoeGemvWeights::kFp8, 96, 8));  // e4m3: 16 values per load
  CHECK(MoeGemvShapeOk(MoeGemvWeights::kFp8, 96, 16));
  CHECK(MoeGemvShapeOk(MoeGemvWeights::kFp8, 7168, 2048));  // DeepSeek-V3's experts
  CHECK(MoeGemvShapeOk(MoeGemvWeights::kFp8, 2048, 7168));
}

}  // namespace
}  // namespace llm::cuda
