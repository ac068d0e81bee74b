// Memory-mapped reader (and a small writer) for the safetensors format, single file or sharded
// with `model.safetensors.index.json`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/loader/model_config.h"

namespace llm {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // points into the mapping; valid while the file is open
  size_t nbytes = 0;
  std::string file;  // which file it came from, for error messages

  int64_t numel() const;
  std::string ShapeString() const;
};

// One mapped .safetensors file. Validates the header fully at open: every tensor's dtype is
// known, its byte range lies inside the file and matches its shape, and ranges do not overlap.
class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A pre-quantized fp8 linear weight as the checkpoint stores it (WeightStore::ReadFp8).
struct Fp8Weight {
  enum class Scale { kTensor, kChannel, kBlock };
  const uint8_t* data = nullptr;  // e4m3 [rows, cols], in the mapping
  int64_t rows = 0, cols = 0;
  Scale kind = Scale::kTensor;
  // kTensor [1]; kChannel [rows]; kBlock row-major [ceil(rows / br), ceil(cols / bc)]. value =
  // e4m3 * scale (weight_scale and weight_scale_inv are both multipliers of the stored bytes).
  std::vector<float> scale;
  int block_rows = 0, block_cols = 0;  // kBlock
  bool has_input_scale = false;        // a static per-tensor activation scale (input_scale)
  float input_scale = 0.f;
};

struct TensorToWrite;

// All weights of a model directory: `model.safetensors`, or the shards named by
// `model.safetensors.index.json`. Every tensor handed out is recorded, so that a loader can
// refuse a checkpoint with tensors it did not read (CheckAllConsumed).
class WeightStore {
 public:
  static StatusOr<std::unique_ptr<WeightStore>> Open(const std::string& model_dir);
  // A store over tensors held in memory (one tensor-parallel rank's slices of a checkpoint,
  // sharded_weights.h); DataLoss naming a tensor given twice or whose bytes disagree with its
  // dtype and shape.
  static StatusOr<std::unique_ptr<WeightStore>> FromTensors(std::vector<TensorToWrite> tensors);

  // Pre-quantized checkpoints: ReadF32 dequantizes fp8 weights with their scale tensors.
  void set_quantization(const WeightQuantization& q) { quantization_ = q; }
  const WeightQuantization& quantization() const { return quantization_; }

  // NotFound naming the tensor when absent. Marks the tensor consumed.
  StatusOr<const TensorView*> Get(const std::string& name) const;
  bool Has(const std::string& name) const { return index_.count(name) > 0; }
  // Get + shape check; the error names the tensor, the expected and the actual shape.
  StatusOr<const TensorView*> GetWithShape(const std::string& name,
                                           const std::vector<int64_t>& shape) const;
  // Converts a tensor of any float dtype to fp32 (after a shape check). An fp8 e4m3 `X.weight`
  // of a quantized checkpoint is dequantized exactly (e4m3 value * scale in fp32) with
  // `X.weight_scale` (per tensor [] / [1], or per output channel [rows] / [rows, 1]) or
  // `X.weight_scale_inv` / a block `X.weight_scale` ([ceil(rows / br), ceil(cols / bc)]);
  // `X.input_scale` (a static activation scale) is consumed with it.
  Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                 std::vector<float>* out) const;
  size_t num_tensors() const { return index_.size(); }
  // An fp8 e4m3 `X.weight` of a quantized checkpoint with its scale tensors (shapes checked as
  // ReadF32 checks them; all consumed), without dequantizing: the CUDA fp8 GEMMs use the bytes.
  StatusOr<Fp8Weight> ReadFp8(const std::string& name, const std::vector<int64_t>& shape) const;
  // The stored dtype of a tensor (NotFound naming it). Does not mark it consumed.
  StatusOr<DType> StoredDType(const std::string& name) const;
  // Every tensor's name, sorted. Does not mark them consumed.
  std::vector<std::string> TensorNames() const;

  // Fails naming the tensors that no Get/ReadF32 touched, except those on the ignore list
  // (IgnoredTensor) and those `also_ignore` accepts.
  Status CheckAllConsumed(const std::string& model_name,
                          bool (*also_ignore)(const std::string&, const void*) = nullptr,
                          const void* ctx = nullptr) const;

 private:
  StatusOr<Fp8Weight> ParseFp8(const TensorView& v) const;
  Status DequantFp8(const TensorView& v, std::vector<float>* out) const;

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // FromTensors: the tensors' bytes and their views (the index points at them).
  std::vector<std::vector<std::byte>> owned_data_;
  std::vector<std::unique_ptr<TensorView>> owned_views_;
  std::map<std::string, const TensorView*> index_;
  WeightQuantization quantization_;
  mutable std::set<std::string> consumed_;
};

// Checkpoint tensors no model here reads, by design:
//   *.rotary_emb.inv_freq   rotary tables that old checkpoints saved; recomputed from the config
//   KV-cache scales (*.k_scale, *.v_scale, *.kv_scale, *.cache_k_scale, *.cache_v_scale,
//   *.k_proj.output_scale, *.v_proj.output_scale)   read only by a static 8-bit KV cache
bool IgnoredTensor(const std::string& name);

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace llm
