// The reduction of a device-local tensor-parallel all-reduce
// (engine/runtime/cuda/device_local_communicator.h): out = the sum of N ranks' buffers, taken in
// rank order in fp32 (bf16 values widened, the sum rounded once), so every rank that computes it
// gets the same bits. Plain C++ launcher header: pointers are device pointers, `stream` is a
// cudaStream_t.
#pragma once

#include <cstddef>

namespace llm::cuda {

inline constexpr int kMaxRankSlots = 8;

// out[count] = slots[0][i] + slots[1][i] + ... + slots[n - 1][i], n <= kMaxRankSlots; fp32 or
// (bf16 = true) bf16 buffers. out may be one of the slots.
void LaunchSumRankSlots(const void* const* slots, int n, void* out, size_t count, bool bf16,
                        void* stream);

}  // namespace llm::cuda
