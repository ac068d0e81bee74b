// Helpers shared by the GPU tests: device copies of host vectors, and paged attention batches
// whose block tables draw from a shuffled pool.
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/attention_backend.h"

namespace llm::cuda {

// A fresh seed per run, so every run tries new inputs; LLM_TEST_SEED=<n> replays one.
inline uint32_t TestSeed() {
  if (const char* s = std::getenv("LLM_TEST_SEED")) {
    return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  }
  return std::random_device{}();
}

// Declares `std::mt19937 name` seeded by TestSeed(), and names the seed in every failure report
// of the enclosing scope.
#define GPU_TEST_RNG(name)                                                             \
  const uint32_t name##_seed = ::llm::cuda::TestSeed();                                \
  INFO("seed " << name##_seed << " (LLM_TEST_SEED=" << name##_seed << " replays it)"); \
  std::mt19937 name(name##_seed)

// A device copy of h (at least 16 bytes allocated, so an empty vector still gets a pointer).
template <typename T>
T* Upload(const std::vector<T>& h) {
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, std::max<size_t>(h.size() * sizeof(T), 16)) == cudaSuccess);
  if (!h.empty()) {
    REQUIRE(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  return static_cast<T*>(d);
}

template <typename T>
std::vector<T> Download(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

// Device copies (Upload) freed at scope exit.
struct DeviceAllocs {
  std::vector<void*> p;
  template <typename T>
  T* Up(const std::vector<T>& h) {
    T* d = Upload(h);
    p.push_back(d);
    return d;
  }
  ~DeviceAllocs() {
    for (void* x : p) cudaFree(x);
  }
};

// A batch of sequences (q_len, kv_len), q_len <= kv_len, over block size bs: each sequence's
// blocks drawn in order from a shuffled pool of the blocks needed plus `spare` (*num_blocks in
// all), slots for its last q_len positions.
inline AttentionBatch ShuffledPagedBatch(const std::vector<std::pair<int, int>>& seqs, int bs,
                                         int spare, std::mt19937& rng, int* num_blocks) {
  AttentionBatch b;
  b.num_seqs = static_cast<int>(seqs.size());
  b.q_indptr.push_back(0);
  b.page_indptr.push_back(0);
  int total_blocks = 0;
  for (auto [q, kv] : seqs) total_blocks += (kv + bs - 1) / bs;
  *num_blocks = total_blocks + spare;
  std::vector<int32_t> pool(*num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  int next = 0;
  for (auto [q, kv] : seqs) {
    REQUIRE(q <= kv);
    for (int i = 0; i < (kv + bs - 1) / bs; ++i) b.page_indices.push_back(pool[next++]);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.kv_lens.push_back(kv);
    b.q_indptr.push_back(b.q_indptr.back() + q);
  }
  b.num_tokens = b.q_indptr.back();
  for (int s = 0; s < b.num_seqs; ++s) {
    const int q_len = b.q_indptr[s + 1] - b.q_indptr[s], kv = b.kv_lens[s];
    for (int i = kv - q_len; i < kv; ++i) {
      b.slot_mapping.push_back(b.page_indices[b.page_indptr[s] + i / bs] * bs + i % bs);
    }
  }
  return b;
}

}  // namespace llm::cuda
