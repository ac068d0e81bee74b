#include "engine/loader/sharded_weights.h"

#include <algorithm>
#include <cstring>

namespace llm {
namespace {

// src [outer, n, inner] -> [outer, s.padded, inner] holding rows [s.begin, s.begin + s.count)
// of the middle dimension (zeros past them).
template <typename T>
std::vector<T> Cut(const std::vector<T>& src, const std::vector<int64_t>& shape,
                   const TensorShard& s) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < s.dim; ++i) outer *= shape[i];
  for (size_t i = s.dim + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t n = shape[s.dim];
  std::vector<T> out(static_cast<size_t>(outer * s.padded * inner), T{});
  for (int64_t o = 0; o < outer; ++o) {
    std::copy_n(src.begin() + (o * n + s.begin) * inner, s.count * inner,
                out.begin() + o * s.padded * inner);
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<WeightStore>> ShardWeights(const WeightStore& full,
                                                    const TensorParallelPlan& plan) {
  std::vector<TensorToWrite> tensors;
  std::vector<float> data;
  for (const std::string& name : full.TensorNames()) {
    if (plan.Dropped(name)) continue;
    LLM_ASSIGN_OR_RETURN(const TensorView* view, full.Get(name));
    // Tensors the loaders read only on request (rotary tables, KV-cache scales) are carried as
    // they are, except a static KV cache's per-head or per-channel scales: the rank caches its
    // KV heads, so their scales are cut by the plan's KV-head rules (a scalar has nothing to cut;
    // the loader refuses it by name when asked for it).
    const bool kv_scales = IgnoredTensor(name) && !view->shape.empty() &&
                           plan.ShardOf(name, view->shape).ok() &&
                           plan.ShardOf(name, view->shape)->split == TensorSplit::kKvHeads;
    if (IgnoredTensor(name) && !kv_scales) {
      const auto* bytes = view->data;
      tensors.push_back({name, view->dtype, view->shape, {bytes, bytes + view->nbytes}});
      continue;
    }
    const std::vector<int64_t> shape = view->shape;
    LLM_ASSIGN_OR_RETURN(const TensorShard s, plan.ShardOf(name, shape));
    if (view->dtype == DType::kU8) {  // MXFP4 blocks / scales: cut as stored, never widened
      if (s.split == TensorSplit::kFirstRank || s.split == TensorSplit::kVocab) {
        return InvalidArgument("tensor '" + name + "': a uint8 tensor is cut only by rows");
      }
      std::vector<std::byte> bytes(view->data, view->data + view->nbytes);
      std::vector<int64_t> local_shape = shape;
      if (s.split != TensorSplit::kReplicated) {
        bytes = Cut(bytes, shape, s);
        local_shape[s.dim] = s.padded;
      }
      tensors.push_back({name, DType::kU8, std::move(local_shape), std::move(bytes)});
      continue;
    }
    LLM_RETURN_IF_ERROR(full.ReadF32(name, shape, &data));
    std::vector<int64_t> local_shape = shape;
    switch (s.split) {
      case TensorSplit::kReplicated:
        break;
      case TensorSplit::kFirstRank:
        if (s.zeros) std::fill(data.begin(), data.end(), 0.0f);
        break;
      default:
        data = Cut(data, shape, s);
        local_shape[s.dim] = s.padded;
        break;
    }
    TensorToWrite t{name, DType::kF32, std::move(local_shape),
                    std::vector<std::byte>(data.size() * sizeof(float))};
    std::memcpy(t.data.data(), data.data(), t.data.size());
    tensors.push_back(std::move(t));
  }
  LLM_ASSIGN_OR_RETURN(auto store, WeightStore::FromTensors(std::move(tensors)));
  store->set_quantization(full.quantization());  // MXFP4 experts read as the unsharded load's
  return store;
}

}  // namespace llm
