// Which CUDA graph a step replays, and the step as that graph sees it (the CUDA runner's host-side
// choice, plain C++ so that it is tested without a GPU). A graph covers a decode-shaped step:
// `seqs` sequences (the batch padded to a bucket: 1, 2, 4, then multiples of 8) of `q` query rows
// each: q = 1 for a one-token decode step, 1 + K for a speculative verify step whose sequences
// all draft K tokens. A step whose sequences have different row counts (some paused, adaptive K,
// a draft model's catch-up) is padded to its most rows: each shorter sequence gets pad rows in
// front of its own, at the positions just before them, whose K/V the cache already holds; a pad
// row appends nothing (slot -1) and no logit row reads it, so every real row computes what it
// would eagerly.
#pragma once

#include "engine/runtime/model.h"
#include "kernels/attention_backend.h"

namespace llm {

struct GraphLimits {
  int max_seqs = 0;           // ModelLoadOptions::cuda_graph_max_batch; 0: no graphs
  int max_q = 1;              // ModelLoadOptions::cuda_graph_max_query_rows
  int max_pages_per_seq = 0;  // block-table entries a graph step's sequence may have
};

// The padded sequence count of a step of n (1 <= n) sequences: 1, 2, 4, then multiples of 8 (as
// vLLM: at most 7 padding sequences past 8), never above max(max_seqs, n).
int GraphSeqBucket(int n, int max_seqs);

struct GraphStepPlan {
  GraphShape shape;     // shape.seqs == 0: the step runs eagerly
  bool padded = false;  // some sequence has fewer than shape.q rows (PadQueryRows first)
};

// The graph of a step: every sequence has 1..limits.max_q query rows and at most
// max_pages_per_seq block-table entries, and at most max_seqs sequences; q is the most rows of
// a sequence. A sequence with fewer rows is padded only where its cache holds the positions its
// pad rows take (kv_len >= q) and its block table has no freed (-1) block (a front pad row's
// sliding window may reach further back than the scheduler kept); otherwise the step runs
// eagerly.
GraphStepPlan PlanGraphStep(const AttentionBatch& batch, const GraphLimits& limits);

// `batch` with every sequence padded to q query rows (PlanGraphStep's plan): pad rows of token 0
// at the positions before the sequence's first row, slot -1, no logit row; the logit rows move
// with the rows they name. The sampling fields are kept as they are.
ForwardBatch PadQueryRows(const ForwardBatch& batch, int q);

}  // namespace llm
