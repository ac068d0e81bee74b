// Memory-mapped reader (and a small writer) for the safetensors format, single file or sharded
// with `model.safetensors.index.json`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/dtype.h"
#include "engine/base/status.h"

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

// All weights of a model directory: `model.safetensors`, or the shards named by
// `model.safetensors.index.json`.
class WeightStore {
 public:
  static StatusOr<std::unique_ptr<WeightStore>> Open(const std::string& model_dir);

  // NotFound naming the tensor when absent.
  StatusOr<const TensorView*> Get(const std::string& name) const;
  bool Has(const std::string& name) const { return index_.count(name) > 0; }
  // Get + shape check; the error names the tensor, the expected and the actual shape.
  StatusOr<const TensorView*> GetWithShape(const std::string& name,
                                           const std::vector<int64_t>& shape) const;
  // Converts a tensor of any float dtype to fp32 (after a shape check).
  Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                 std::vector<float>* out) const;
  size_t num_tensors() const { return index_.size(); }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace llm
