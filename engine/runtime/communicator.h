// The collectives of one tensor-parallel rank (tensor_parallel_plan.h): its place in the group
// and the two operations the sharded decoders need, an all-reduce sum after each row-split
// projection and an all-gather of the LM head's vocabulary slices.
//
// Every rank must make the same calls in the same order with the same counts (as NCCL requires);
// a call returns when this rank's output is complete. Buffers are device memory for a device
// implementation and `stream` its stream (a cudaStream_t: the call is enqueued on it, so it can
// be captured in a CUDA graph as ncclAllReduce / ncclAllGather can); host memory and a null
// stream for the CPU one (cpu/in_process_communicator.h).
#pragma once

#include <cstddef>

#include "base/dtype.h"
#include "base/status.h"

namespace llm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  // No synchronization: what the rank was created as.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the collectives may be enqueued inside a CUDA graph capture of `stream` (NCCL's are
  // kernels on the stream). False: a caller that captures graphs runs its steps eagerly instead.
  virtual bool capturable() const = 0;
  // buf[count] of dtype (kF32 or kBF16) becomes, in place on every rank, the sum over the ranks
  // of their buf: the same bits on every rank.
  virtual Status AllReduceSum(void* buf, size_t count, DType dtype, void* stream) = 0;
  // out[size * count] = rank 0's in[count], then rank 1's, ...; in and out do not overlap.
  virtual Status AllGather(const void* in, void* out, size_t count, DType dtype, void* stream) = 0;
};

// The communicators of every rank of one group, created together; each lives as long as the group.
class CommunicatorGroup {
 public:
  virtual ~CommunicatorGroup() = default;
  virtual int size() const = 0;
  // Rank r's communicator, for the thread that runs rank r.
  virtual Communicator* rank(int r) = 0;
};

}  // namespace llm
