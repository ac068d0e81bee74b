// The host-side sizes of the MoE layer's small-batch kernels (kernels/cuda/moe/moe_ops.h), on the
// CPU: the fused routing's column slices cover every router column once and its partial sums fit
// the buffer CudaMoeLayer reserves; the batches and shapes it refuses; the down GEMMs' column
// blocks each have a combine ticket. The kernels themselves: gpu_tests "[moe]".
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
  }
}

}  // namespace
}  // namespace llm::cuda
