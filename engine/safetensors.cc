#include "engine/safetensors.h"

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

StatusOr<const TensorView*> WeightStore::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return NotFound("missing tensor '" + name + "'");
  return it->second;
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
