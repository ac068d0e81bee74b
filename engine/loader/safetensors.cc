#include "engine/loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace llm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool ParseSafetensorsDType(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "F16")
    *out = DType::kF16;
  else if (s == "BF16")
    *out = DType::kBF16;
  else if (s == "I8")
    *out = DType::kI8;
  else if (s == "F8_E4M3")
    *out = DType::kFp8E4M3;
  else if (s == "U8")
    *out = DType::kU8;
  else
    return false;
  return true;
}

const char* SafetensorsDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI8:
      return "I8";
    case DType::kFp8E4M3:
      return "F8_E4M3";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open safetensors file " + path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return DataLoss("cannot stat " + path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return DataLoss(path + ": file too small for a safetensors header (" + std::to_string(size) +
                    " bytes)");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return DataLoss("mmap failed for " + path);
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->map_ = map;
  file->map_size_ = size;

  const auto* base = static_cast<const std::byte*>(map);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian on every platform we build for
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " exceeds the file size " + std::to_string(size));
  }
  json header = json::parse(reinterpret_cast<const char*>(base + 8),
                            reinterpret_cast<const char*>(base + 8 + header_len), nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return DataLoss(path + ": header is not a JSON object");
  }
  const std::byte* data_start = base + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_object()) {
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (m->is_string()) file->metadata_[m.key()] = m->get<std::string>();
        }
      }
      continue;
    }
    const json& t = *it;
    const std::string where = path + ": tensor '" + it.key() + "'";
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("data_offsets") || !t["dtype"].is_string() || !t["shape"].is_array() ||
        !t["data_offsets"].is_array() || t["data_offsets"].size() != 2) {
      return DataLoss(where + " has a malformed header entry");
    }
    TensorView v;
    v.name = it.key();
    v.file = path;
    if (!ParseSafetensorsDType(t["dtype"].get<std::string>(), &v.dtype)) {
      return DataLoss(where + " has unsupported dtype " + t["dtype"].get<std::string>());
    }
    int64_t numel = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) {
        return DataLoss(where + " has an invalid shape");
      }
      v.shape.push_back(d.get<int64_t>());
      // Check before multiplying: the product of two valid dims can overflow int64.
      if (v.shape.back() != 0 && numel > (1ll << 40) / v.shape.back()) {
        return DataLoss(where + " is implausibly large");
      }
      numel *= v.shape.back();
    }
    const json& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return DataLoss(where + " has invalid data_offsets");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return DataLoss(where + " data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ") lie outside the file's " +
                      std::to_string(data_size) + " data bytes (truncated file?)");
    }
    v.nbytes = end - begin;
    if (static_cast<uint64_t>(numel) * DTypeSize(v.dtype) != v.nbytes) {
      return DataLoss(where + " holds " + std::to_string(v.nbytes) + " bytes but shape " +
                      v.ShapeString() + " needs " + std::to_string(numel * DTypeSize(v.dtype)));
    }
    v.data = data_start + begin;
    if (v.nbytes > 0) ranges.emplace_back(begin, end);
    file->tensors_.emplace(v.name, std::move(v));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return DataLoss(path + ": tensor data ranges overlap");
    }
  }
  return file;
}

StatusOr<std::unique_ptr<WeightStore>> WeightStore::Open(const std::string& model_dir) {
  auto store = std::make_unique<WeightStore>();
  const fs::path dir(model_dir);
  std::vector<std::string> files;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return DataLoss(index_path.string() + ": not a valid safetensors index (no weight_map)");
    }
    std::set<std::string> shard_set;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it->is_string()) return DataLoss(index_path.string() + ": bad weight_map entry");
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
        return DataLoss(index_path.string() + ": shard name '" + shard + "' is not a plain file");
      }
      shard_set.insert(shard);
    }
    files.assign(shard_set.begin(), shard_set.end());
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    return NotFound("no model.safetensors or model.safetensors.index.json in " + model_dir);
  }
  for (const std::string& f : files) {
    LLM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open((dir / f).string()));
    for (const auto& [name, view] : file->tensors()) {
      if (!store->index_.emplace(name, &view).second) {
        return DataLoss("tensor '" + name + "' appears in more than one shard");
      }
    }
    store->files_.push_back(std::move(file));
  }
  return store;
}

StatusOr<std::unique_ptr<WeightStore>> WeightStore::FromTensors(
    std::vector<TensorToWrite> tensors) {
  auto store = std::make_unique<WeightStore>();
  for (TensorToWrite& t : tensors) {
    auto view = std::make_unique<TensorView>();
    view->name = t.name;
    view->dtype = t.dtype;
    view->shape = t.shape;
    view->file = "(memory)";
    if (static_cast<size_t>(view->numel()) * DTypeSize(t.dtype) != t.data.size()) {
      return DataLoss("in-memory tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
                      " bytes for " + DTypeName(t.dtype) + " " + view->ShapeString());
    }
    store->owned_data_.push_back(std::move(t.data));
    view->data = store->owned_data_.back().data();
    view->nbytes = store->owned_data_.back().size();
    if (!store->index_.emplace(view->name, view.get()).second) {
      return DataLoss("in-memory tensor '" + view->name + "' given twice");
    }
    store->owned_views_.push_back(std::move(view));
  }
  return store;
}

std::vector<std::string> WeightStore::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, view] : index_) names.push_back(name);
  return names;
}

StatusOr<const TensorView*> WeightStore::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return NotFound("missing tensor '" + name + "'");
  consumed_.insert(name);
  return it->second;
}

bool IgnoredTensor(const std::string& name) {
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (std::string_view s :
       {".rotary_emb.inv_freq", ".k_scale", ".v_scale", ".kv_scale", ".cache_k_scale",
        ".cache_v_scale", ".k_proj.output_scale", ".v_proj.output_scale"}) {
    if (ends(s)) return true;
  }
  return false;
}

Status WeightStore::CheckAllConsumed(const std::string& model_name,
                                     bool (*also_ignore)(const std::string&, const void*),
                                     const void* ctx) const {
  std::vector<std::string> unused;
  for (const auto& [name, view] : index_) {
    if (consumed_.count(name) || IgnoredTensor(name)) continue;
    if (also_ignore != nullptr && also_ignore(name, ctx)) continue;
    unused.push_back(name);
  }
  if (unused.empty()) return Status::Ok();
  std::string list;
  for (size_t i = 0; i < unused.size() && i < 8; ++i) list += (i ? ", " : "") + unused[i];
  if (unused.size() > 8) list += ", ... (" + std::to_string(unused.size()) + " in all)";
  return InvalidArgument("checkpoint tensor(s) not used by " + model_name +
                         " with this config.json (a key such as attention_bias, mlp_bias or "
                         "tie_word_embeddings disagrees with the weights, or the architecture has "
                         "parts this server does not implement): " +
                         list);
}

StatusOr<Fp8Weight> WeightStore::ParseFp8(const TensorView& v) const {
  const std::string& name = v.name;
  using M = WeightQuantization::Method;
  const WeightQuantization& q = quantization_;
  if (!q.quantized()) {
    return InvalidArgument("tensor '" + name +
                           "' is float8_e4m3 but config.json has no quantization_config");
  }
  if (q.method == M::kMxfp4) {
    return InvalidArgument("tensor '" + name +
                           "' is float8_e4m3 but config.json's quantization_config is mxfp4");
  }
  const std::string suffix = ".weight";
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0 ||
      v.shape.size() != 2) {
    return InvalidArgument("fp8 tensor '" + name + "' (shape " + v.ShapeString() +
                           ") is not a 2-D linear weight; only those may be fp8");
  }
  const std::string stem = name.substr(0, name.size() - suffix.size());
  Fp8Weight w;
  w.data = reinterpret_cast<const uint8_t*>(v.data);
  w.rows = v.shape[0];
  w.cols = v.shape[1];
  const int64_t rows = w.rows, cols = w.cols;
  std::string scale_name = stem + ".weight_scale_inv";
  if (!Has(scale_name)) scale_name = stem + ".weight_scale";
  if (!Has(scale_name)) {
    return InvalidArgument("fp8 weight '" + name + "' (" + q.quant_method + " checkpoint) has no " +
                           stem + ".weight_scale or " + stem + ".weight_scale_inv tensor");
  }
  LLM_ASSIGN_OR_RETURN(const TensorView* s, Get(scale_name));
  if (s->dtype != DType::kF32 && s->dtype != DType::kBF16 && s->dtype != DType::kF16) {
    return InvalidArgument("scale '" + scale_name + "' has dtype " + DTypeName(s->dtype) +
                           "; expected float32, bfloat16 or float16");
  }
  w.scale.resize(static_cast<size_t>(s->numel()));
  ConvertToF32(s->dtype, s->data, w.scale.data(), w.scale.size());
  if (Has(stem + ".input_scale")) {
    if (!q.static_input_scales) {
      return InvalidArgument("tensor '" + stem +
                             ".input_scale' is a static activation scale, "
                             "but quantization_config says activations are dynamic");
    }
    LLM_ASSIGN_OR_RETURN(const TensorView* in, Get(stem + ".input_scale"));
    if (in->numel() != 1 ||
        (in->dtype != DType::kF32 && in->dtype != DType::kBF16 && in->dtype != DType::kF16)) {
      return InvalidArgument("input scale '" + in->name + "' has shape " + in->ShapeString() +
                             " and dtype " + DTypeName(in->dtype) +
                             "; only a per-tensor float scale is supported");
    }
    ConvertToF32(in->dtype, in->data, &w.input_scale, 1);
    w.has_input_scale = true;
  }
  const std::vector<int64_t>& ss = s->shape;
  auto bad_shape = [&](const std::string& want) {
    return InvalidArgument("scale '" + scale_name + "' of fp8 weight '" + name + "' " +
                           v.ShapeString() + " has shape " + s->ShapeString() + "; " +
                           q.quant_method + " expects " + want);
  };
  if (q.method == M::kFp8Block) {
    const int64_t br = q.block_rows, bc = q.block_cols;
    const int64_t nr = (rows + br - 1) / br, nc = (cols + bc - 1) / bc;
    if (ss != std::vector<int64_t>{nr, nc}) {
      return bad_shape("[" + std::to_string(nr) + ", " + std::to_string(nc) + "] (" +
                       std::to_string(br) + "x" + std::to_string(bc) + " blocks)");
    }
    w.kind = Fp8Weight::Scale::kBlock;
    w.block_rows = q.block_rows;
    w.block_cols = q.block_cols;
    return w;
  }
  const bool per_tensor =
      s->numel() == 1 && (ss.empty() || ss.size() == 1 || ss == std::vector<int64_t>{1, 1});
  const bool per_channel = ss == std::vector<int64_t>{rows} || ss == std::vector<int64_t>{rows, 1};
  if (q.method == M::kFp8PerTensor && !per_tensor) return bad_shape("a per-tensor scale [] or [1]");
  if (q.method == M::kFp8PerChannel && !per_channel && !per_tensor) {
    return bad_shape("a per-channel scale [" + std::to_string(rows) + "] or [" +
                     std::to_string(rows) + ", 1]");
  }
  w.kind = per_tensor ? Fp8Weight::Scale::kTensor : Fp8Weight::Scale::kChannel;
  return w;
}

Status WeightStore::DequantFp8(const TensorView& v, std::vector<float>* out) const {
  LLM_ASSIGN_OR_RETURN(const Fp8Weight w, ParseFp8(v));
  out->resize(static_cast<size_t>(v.numel()));
  ConvertToF32(DType::kFp8E4M3, v.data, out->data(), out->size());
  const int64_t rows = w.rows, cols = w.cols;
  if (w.kind == Fp8Weight::Scale::kBlock) {
    const int64_t br = w.block_rows, bc = w.block_cols, nc = (cols + bc - 1) / bc;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) (*out)[r * cols + c] *= w.scale[(r / br) * nc + c / bc];
    }
    return Status::Ok();
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float f = w.kind == Fp8Weight::Scale::kTensor ? w.scale[0] : w.scale[r];
    for (int64_t c = 0; c < cols; ++c) (*out)[r * cols + c] *= f;
  }
  return Status::Ok();
}

StatusOr<Fp8Weight> WeightStore::ReadFp8(const std::string& name,
                                         const std::vector<int64_t>& shape) const {
  LLM_ASSIGN_OR_RETURN(const TensorView* v, GetWithShape(name, shape));
  if (v->dtype != DType::kFp8E4M3) {
    return InvalidArgument("tensor '" + name + "' has dtype " + DTypeName(v->dtype) +
                           "; expected float8_e4m3 (a pre-quantized weight)");
  }
  return ParseFp8(*v);
}

StatusOr<DType> WeightStore::StoredDType(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return NotFound("checkpoint has no tensor '" + name + "'");
  return it->second->dtype;
}

StatusOr<const TensorView*> WeightStore::GetWithShape(const std::string& name,
                                                      const std::vector<int64_t>& shape) const {
  LLM_ASSIGN_OR_RETURN(const TensorView* v, Get(name));
  if (v->shape != shape) {
    TensorView expected;
    expected.shape = shape;
    return InvalidArgument("tensor '" + name + "' has shape " + v->ShapeString() + ", expected " +
                           expected.ShapeString());
  }
  return v;
}

Status WeightStore::ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                            std::vector<float>* out) const {
  LLM_ASSIGN_OR_RETURN(const TensorView* v, GetWithShape(name, shape));
  if (v->dtype == DType::kFp8E4M3) return DequantFp8(*v, out);
  if (v->dtype != DType::kF32 && v->dtype != DType::kF16 && v->dtype != DType::kBF16) {
    return InvalidArgument("tensor '" + name + "' has dtype " + DTypeName(v->dtype) +
                           "; weights must be float32, float16 or bfloat16");
  }
  out->resize(static_cast<size_t>(v->numel()));
  ConvertToF32(v->dtype, v->data, out->data(), out->size());
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", SafetensorsDTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // keeps tensor data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Internal("cannot write " + path);
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size()));
  }
  if (!out) return Internal("short write to " + path);
  return Status::Ok();
}

}  // namespace llm
