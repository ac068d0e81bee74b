// The NCCL communicator (engine/runtime/cuda/nccl_communicator.h) over every visible GPU (1, 2,
// 4 or 8 ranks: the largest of those the machine has), one thread per GPU as the GPU path will
// drive them: all-reduce sums of fp32 and bf16 and an all-gather against the host, exactly (the
// values are small integers, whose sums are exact in any order), the same bits on every rank for
// values whose sum depends on the order, and an all-reduce captured in a CUDA graph and replayed.
#include <catch2/catch.hpp>

#ifdef LLM_HAVE_NCCL

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "engine/runtime/cuda/nccl_communicator.h"

namespace llm {
namespace {

int RankCount() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) return 0;
  int n = 1;
  while (n * 2 <= devices && n * 2 <= 8) n *= 2;
  return n;
}

// Runs body(rank, comm) in one thread per rank with the rank's device current; the statuses.
std::vector<Status> OnEveryRank(NcclCommunicatorGroup& group,
                                const std::function<Status(int, Communicator*)>& body) {
  std::vector<Status> status(group.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      if (cudaSetDevice(r) != cudaSuccess) {
        status[r] = Internal("cudaSetDevice");
        return;
      }
      status[r] = body(r, group.rank(r));
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

Status Cuda(cudaError_t e, const char* what) {
  return e == cudaSuccess ? Status::Ok()
                          : Internal(std::string(what) + ": " + cudaGetErrorString(e));
}

// Rank r's fp32 values: small integers (exact sums) or, with `order_sensitive`, values whose fp32
// sum depends on the order.
std::vector<float> RankValues(int r, size_t n, bool order_sensitive) {
  std::vector<float> v(n);
  std::mt19937 rng(100 + r);
  std::uniform_int_distribution<int> small(-64, 64);
  std::normal_distribution<float> wide(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    v[i] =
        order_sensitive ? wide(rng) * (i % 3 == 0 ? 1e7f : 1.0f) : static_cast<float>(small(rng));
  }
  return v;
}

struct Buffers {
  std::vector<std::vector<float>> f32;       // [ranks][n] after the collective
  std::vector<std::vector<uint16_t>> bf16;   // [ranks][n]
  std::vector<std::vector<float>> gathered;  // [ranks][ranks * n]
};

// All-reduces RankValues (fp32 and bf16 copies) and all-gathers them, on a stream per rank.
Buffers RunCollectives(NcclCommunicatorGroup& group, size_t n, bool order_sensitive) {
  const int ranks = group.size();
  Buffers out{std::vector<std::vector<float>>(ranks), std::vector<std::vector<uint16_t>>(ranks),
              std::vector<std::vector<float>>(ranks)};
  const auto status = OnEveryRank(group, [&](int r, Communicator* comm) -> Status {
    const std::vector<float> host = RankValues(r, n, order_sensitive);
    std::vector<uint16_t> host_bf16(n);
    for (size_t i = 0; i < n; ++i) host_bf16[i] = F32ToBf16(host[i]);
    cudaStream_t stream;
    LLM_RETURN_IF_ERROR(Cuda(cudaStreamCreate(&stream), "cudaStreamCreate"));
    float *x = nullptr, *gathered = nullptr;
    uint16_t* h = nullptr;
    LLM_RETURN_IF_ERROR(Cuda(cudaMalloc(&x, n * 4), "cudaMalloc"));
    LLM_RETURN_IF_ERROR(Cuda(cudaMalloc(&h, n * 2), "cudaMalloc"));
    LLM_RETURN_IF_ERROR(Cuda(cudaMalloc(&gathered, ranks * n * 4), "cudaMalloc"));
    LLM_RETURN_IF_ERROR(Cuda(cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice), "copy"));
    LLM_RETURN_IF_ERROR(
        Cuda(cudaMemcpy(h, host_bf16.data(), n * 2, cudaMemcpyHostToDevice), "copy"));
    LLM_RETURN_IF_ERROR(comm->AllGather(x, gathered, n, DType::kF32, stream));
    LLM_RETURN_IF_ERROR(comm->AllReduceSum(x, n, DType::kF32, stream));
    LLM_RETURN_IF_ERROR(comm->AllReduceSum(h, n, DType::kBF16, stream));
    LLM_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    out.f32[r].resize(n);
    out.bf16[r].resize(n);
    out.gathered[r].resize(ranks * n);
    LLM_RETURN_IF_ERROR(
        Cuda(cudaMemcpy(out.f32[r].data(), x, n * 4, cudaMemcpyDeviceToHost), "copy"));
    LLM_RETURN_IF_ERROR(
        Cuda(cudaMemcpy(out.bf16[r].data(), h, n * 2, cudaMemcpyDeviceToHost), "copy"));
    LLM_RETURN_IF_ERROR(
        Cuda(cudaMemcpy(out.gathered[r].data(), gathered, ranks * n * 4, cudaMemcpyDeviceToHost),
             "copy"));
    cudaFree(x);
    cudaFree(h);
    cudaFree(gathered);
    return Cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": " << status[r].message());
    REQUIRE(status[r].ok());
  }
  return out;
}

std::unique_ptr<NcclCommunicatorGroup> MakeGroup() {
  const int ranks = RankCount();
  REQUIRE(ranks >= 1);
  std::vector<int> devices(ranks);
  for (int r = 0; r < ranks; ++r) devices[r] = r;
  auto group = NcclCommunicatorGroup::Create(devices);
  INFO((group.ok() ? std::string() : group.status().message()));
  REQUIRE(group.ok());
  return std::move(group).value();
}

TEST_CASE("NCCL communicator: exact sums and gathers on every GPU", "[gpu][nccl]") {
  auto group = MakeGroup();
  const int ranks = group->size();
  WARN("NCCL ranks: " << ranks);
  const size_t n = 4099;  // not a multiple of any chunking
  const Buffers b = RunCollectives(*group, n, /*order_sensitive=*/false);
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> v = RankValues(r, n, false);
    for (size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(b.f32[r] == sum);
    size_t bf16_wrong = 0;
    for (size_t i = 0; i < n; ++i) bf16_wrong += Bf16ToF32(b.bf16[r][i]) != sum[i];
    CHECK(bf16_wrong == 0);  // |sum| <= 512: exact in bf16's 8 bits
    for (int k = 0; k < ranks; ++k) {
      const std::vector<float> v = RankValues(k, n, false);
      CHECK(std::equal(v.begin(), v.end(), b.gathered[r].begin() + k * n));
    }
  }
}

TEST_CASE("NCCL communicator: every rank gets the same bits", "[gpu][nccl]") {
  auto group = MakeGroup();
  const Buffers b = RunCollectives(*group, 1 << 20, /*order_sensitive=*/true);
  for (int r = 1; r < group->size(); ++r) {
    INFO("rank " << r);
    CHECK(std::memcmp(b.f32[r].data(), b.f32[0].data(), b.f32[0].size() * 4) == 0);
    CHECK(b.bf16[r] == b.bf16[0]);
  }
}

TEST_CASE("NCCL communicator: an all-reduce captured in a CUDA graph replays", "[gpu][nccl]") {
  auto group = MakeGroup();
  const int ranks = group->size();
  const size_t n = 1000;
  std::vector<std::vector<float>> result(ranks);
  const auto status = OnEveryRank(*group, [&](int r, Communicator* comm) -> Status {
    const std::vector<float> host = RankValues(r, n, false);
    cudaStream_t stream;
    LLM_RETURN_IF_ERROR(Cuda(cudaStreamCreate(&stream), "cudaStreamCreate"));
    float* x = nullptr;
    LLM_RETURN_IF_ERROR(Cuda(cudaMalloc(&x, n * 4), "cudaMalloc"));
    LLM_RETURN_IF_ERROR(Cuda(cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice), "copy"));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    LLM_RETURN_IF_ERROR(Cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                             "cudaStreamBeginCapture"));
    const Status captured = comm->AllReduceSum(x, n, DType::kF32, stream);
    LLM_RETURN_IF_ERROR(Cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture"));
    LLM_RETURN_IF_ERROR(captured);
    LLM_RETURN_IF_ERROR(Cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"));
    // Two replays: x becomes (sum over ranks) * ranks.
    for (int i = 0; i < 2; ++i) {
      LLM_RETURN_IF_ERROR(Cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"));
    }
    LLM_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    result[r].resize(n);
    LLM_RETURN_IF_ERROR(
        Cuda(cudaMemcpy(result[r].data(), x, n * 4, cudaMemcpyDeviceToHost), "copy"));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(x);
    return Cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  });
  std::vector<float> expect(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> v = RankValues(r, n, false);
    for (size_t i = 0; i < n; ++i) expect[i] += v[i];
  }
  for (float& v : expect) v *= static_cast<float>(ranks);
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": " << status[r].message());
    REQUIRE(status[r].ok());
    CHECK(result[r] == expect);
  }
}

TEST_CASE("NCCL communicator: other dtypes are refused by name", "[gpu][nccl]") {
  auto group = MakeGroup();
  const auto status = OnEveryRank(*group, [&](int, Communicator* comm) -> Status {
    return comm->AllReduceSum(nullptr, 0, DType::kI8, nullptr);
  });
  CHECK(status[0].message() ==
        "collectives take float32 or bfloat16 buffers, not " + std::string(DTypeName(DType::kI8)));
}

}  // namespace
}  // namespace llm

#endif  // LLM_HAVE_NCCL
