// Tests for the safetensors reader/writer and the WeightStore: round trips in F32/F16/BF16,
// sharded checkpoints, error messages for malformed files, and a header fuzz loop.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/loader/safetensors.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("llm_test_safetensors_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::vector<std::byte> F32Bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<std::byte> U16Bytes(const std::vector<uint16_t>& v) {
  std::vector<std::byte> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<std::byte> F16Bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(F32ToF16(x));
  return U16Bytes(h);
}

std::vector<std::byte> Bf16Bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(F32ToBf16(x));
  return U16Bytes(h);
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A raw file: 8-byte little-endian header length, header, data.
void WriteRaw(const std::string& path, uint64_t header_len, const std::string& header,
              const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

void WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
  WriteRaw(path, header.size(), header, data);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("Safetensors F32/F16/BF16 round trip through ReadF32", "[safetensors]") {
  TempDir dir;
  const std::vector<float> a = RandomFloats(6, 1), b = RandomFloats(12, 2), c = RandomFloats(5, 3);
  std::vector<TensorToWrite> tensors = {
      {"model.a", DType::kF32, {2, 3}, F32Bytes(a)},
      {"model.b", DType::kF16, {3, 4}, F16Bytes(b)},
      {"model.c", DType::kBF16, {5}, Bf16Bytes(c)},
      {"model.empty", DType::kF32, {0, 4}, {}},
  };
  REQUIRE(WriteSafetensors(dir.file("model.safetensors"), tensors, {{"format", "pt"}}).ok());

  auto store_or = WeightStore::Open(dir.path().string());
  REQUIRE(store_or.ok());
  const WeightStore& store = **store_or;
  CHECK(store.num_tensors() == 4);
  CHECK(store.Has("model.a"));
  CHECK_FALSE(store.Has("model.d"));

  std::vector<float> out;
  REQUIRE(store.ReadF32("model.a", {2, 3}, &out).ok());
  CHECK(out == a);  // exact

  REQUIRE(store.ReadF32("model.b", {3, 4}, &out).ok());
  REQUIRE(out.size() == b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    INFO("f16 element " << i);
    CHECK(out[i] == Approx(b[i]).epsilon(1e-3));  // 11-bit significand
  }
  REQUIRE(store.ReadF32("model.c", {5}, &out).ok());
  REQUIRE(out.size() == c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    INFO("bf16 element " << i);
    CHECK(out[i] == Approx(c[i]).epsilon(4e-3));  // 8-bit significand
  }
  REQUIRE(store.ReadF32("model.empty", {0, 4}, &out).ok());
  CHECK(out.empty());

  auto view = store.Get("model.b");
  REQUIRE(view.ok());
  CHECK((*view)->dtype == DType::kF16);
  CHECK((*view)->shape == std::vector<int64_t>{3, 4});
  CHECK((*view)->nbytes == 24);
  CHECK((*view)->numel() == 12);
  CHECK((*view)->ShapeString() == "[3, 4]");
  CHECK(Contains((*view)->file, "model.safetensors"));

  auto file = SafetensorsFile::Open(dir.file("model.safetensors"));
  REQUIRE(file.ok());
  CHECK((*file)->tensors().size() == 4);
  REQUIRE((*file)->metadata().count("format") == 1);
  CHECK((*file)->metadata().at("format") == "pt");
  // Tensor data is 8-byte aligned in the file.
  const auto& views = (*file)->tensors();
  CHECK(reinterpret_cast<uintptr_t>(views.at("model.a").data) % 8 == 0);
}

TEST_CASE("Safetensors ReadF32 rejects a non-float dtype", "[safetensors]") {
  TempDir dir;
  std::vector<std::byte> bytes(4, std::byte{1});
  REQUIRE(WriteSafetensors(dir.file("model.safetensors"), {{"q", DType::kI8, {4}, bytes}}).ok());
  auto store = WeightStore::Open(dir.path().string());
  REQUIRE(store.ok());
  std::vector<float> out;
  const Status st = (*store)->ReadF32("q", {4}, &out);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(Contains(st.message(), "int8"));
}

TEST_CASE("Safetensors sharded WeightStore via model.safetensors.index.json", "[safetensors]") {
  TempDir dir;
  const std::vector<float> w1 = RandomFloats(4, 10), w2 = RandomFloats(6, 11),
                           w3 = RandomFloats(2, 12);
  const std::string shard1 = "model-00001-of-00002.safetensors";
  const std::string shard2 = "model-00002-of-00002.safetensors";
  REQUIRE(WriteSafetensors(dir.file(shard1), {{"layers.0.w", DType::kF32, {2, 2}, F32Bytes(w1)},
                                              {"embed", DType::kF32, {2, 3}, F32Bytes(w2)}})
              .ok());
  REQUIRE(
      WriteSafetensors(dir.file(shard2), {{"layers.1.w", DType::kF32, {2}, F32Bytes(w3)}}).ok());
  WriteAll(dir.file("model.safetensors.index.json"),
           R"({"metadata": {"total_size": 48}, "weight_map": {
                "layers.0.w": ")" +
               shard1 + R"(", "embed": ")" + shard1 + R"(",
                "layers.1.w": ")" +
               shard2 + R"("}})");

  auto store_or = WeightStore::Open(dir.path().string());
  REQUIRE(store_or.ok());
  const WeightStore& store = **store_or;
  CHECK(store.num_tensors() == 3);
  std::vector<float> out;
  REQUIRE(store.ReadF32("layers.0.w", {2, 2}, &out).ok());
  CHECK(out == w1);
  REQUIRE(store.ReadF32("embed", {2, 3}, &out).ok());
  CHECK(out == w2);
  REQUIRE(store.ReadF32("layers.1.w", {2}, &out).ok());
  CHECK(out == w3);
  CHECK(Contains((*store.Get("layers.1.w"))->file, shard2));
  CHECK(Contains((*store.Get("embed"))->file, shard1));

  SECTION("a tensor in two shards is an error") {
    REQUIRE(WriteSafetensors(dir.file(shard2), {{"embed", DType::kF32, {2}, F32Bytes(w3)}}).ok());
    auto dup = WeightStore::Open(dir.path().string());
    REQUIRE_FALSE(dup.ok());
    CHECK(dup.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(dup.status().message(), "embed"));
  }
  SECTION("a missing shard is an error naming it") {
    fs::remove(dir.file(shard2));
    auto missing = WeightStore::Open(dir.path().string());
    REQUIRE_FALSE(missing.ok());
    CHECK(Contains(missing.status().message(), shard2));
  }
  SECTION("a shard path outside the directory is rejected") {
    WriteAll(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "../evil.safetensors"}})");
    auto evil = WeightStore::Open(dir.path().string());
    REQUIRE_FALSE(evil.ok());
    CHECK(evil.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(evil.status().message(), "evil.safetensors"));
  }
  SECTION("an index without weight_map is an error") {
    WriteAll(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
    auto bad = WeightStore::Open(dir.path().string());
    REQUIRE_FALSE(bad.ok());
    CHECK(Contains(bad.status().message(), "weight_map"));
  }
}

TEST_CASE("Safetensors missing tensor and wrong shape name the problem", "[safetensors]") {
  TempDir dir;
  REQUIRE(WriteSafetensors(dir.file("model.safetensors"),
                           {{"lm_head.weight", DType::kF32, {2, 3}, F32Bytes(RandomFloats(6, 4))}})
              .ok());
  auto store = WeightStore::Open(dir.path().string());
  REQUIRE(store.ok());

  auto missing = (*store)->Get("model.norm.weight");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(Contains(missing.status().message(), "missing tensor"));
  CHECK(Contains(missing.status().message(), "model.norm.weight"));
  std::vector<float> out;
  const Status read_missing = (*store)->ReadF32("model.norm.weight", {3}, &out);
  CHECK(read_missing.code() == StatusCode::kNotFound);
  CHECK(Contains(read_missing.message(), "model.norm.weight"));

  auto wrong = (*store)->GetWithShape("lm_head.weight", {3, 2});
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().code() == StatusCode::kInvalidArgument);
  CHECK(Contains(wrong.status().message(), "lm_head.weight"));
  CHECK(Contains(wrong.status().message(), "[2, 3]"));
  CHECK(Contains(wrong.status().message(), "[3, 2]"));
  const Status read_wrong = (*store)->ReadF32("lm_head.weight", {6}, &out);
  CHECK(read_wrong.code() == StatusCode::kInvalidArgument);
  CHECK(Contains(read_wrong.message(), "[6]"));

  auto right = (*store)->GetWithShape("lm_head.weight", {2, 3});
  CHECK(right.ok());
}

TEST_CASE("Safetensors malformed files give DataLoss naming the problem", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");

  SECTION("truncated file") {
    REQUIRE(WriteSafetensors(path, {{"a", DType::kF32, {4}, F32Bytes(RandomFloats(4, 5))},
                                    {"big.weight", DType::kF32, {8}, F32Bytes(RandomFloats(8, 6))}})
                .ok());
    fs::resize_file(path, fs::file_size(path) - 5);
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
    const std::string& m = f.status().message();
    CHECK((Contains(m, "big.weight") || Contains(m, "outside")));
    auto store = WeightStore::Open(dir.path().string());
    REQUIRE_FALSE(store.ok());
    CHECK(store.status().code() == StatusCode::kDataLoss);
  }
  SECTION("file cut inside the header") {
    REQUIRE(WriteSafetensors(path, {{"a", DType::kF32, {4}, F32Bytes(RandomFloats(4, 5))}}).ok());
    fs::resize_file(path, 20);
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(f.status().message(), "header length"));
  }
  SECTION("header length larger than the file") {
    WriteRaw(path, 1000, "{}", "");
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(f.status().message(), "header length 1000"));
  }
  SECTION("huge header length") {
    WriteRaw(path, ~0ull, "{}", "");
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
  }
  SECTION("file shorter than the length field") {
    WriteAll(path, "abc");
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(f.status().message(), "too small"));
  }
  SECTION("garbage header JSON") {
    WriteRaw(path, "{not json at all", "");
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(f.status().message(), "JSON"));
  }
  SECTION("header that is JSON but not an object") {
    WriteRaw(path, "[1, 2, 3]", "");
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(Contains(f.status().message(), "JSON object"));
  }
  SECTION("unknown dtype") {
    WriteRaw(path, R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})",
             std::string(16, '\0'));
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(f.status().message(), "F64"));
    CHECK(Contains(f.status().message(), "'w'"));
  }
  SECTION("overlapping ranges") {
    WriteRaw(path,
             R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                 "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
             std::string(24, '\0'));
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kDataLoss);
    CHECK(Contains(f.status().message(), "overlap"));
  }
  SECTION("byte count that does not match the shape") {
    WriteRaw(path, R"({"w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})",
             std::string(16, '\0'));
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(Contains(f.status().message(), "[5]"));
  }
  SECTION("offsets in the wrong order") {
    WriteRaw(path, R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})",
             std::string(8, '\0'));
    CHECK_FALSE(SafetensorsFile::Open(path).ok());
  }
  SECTION("negative dimension") {
    WriteRaw(path, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
             std::string(4, '\0'));
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(Contains(f.status().message(), "shape"));
  }
  SECTION("malformed entry") {
    WriteRaw(path, R"({"w": {"dtype": "F32", "shape": [1]}})", std::string(4, '\0'));
    auto f = SafetensorsFile::Open(path);
    REQUIRE_FALSE(f.ok());
    CHECK(Contains(f.status().message(), "malformed"));
  }
  SECTION("missing file and missing directory contents") {
    auto f = SafetensorsFile::Open(dir.file("nope.safetensors"));
    REQUIRE_FALSE(f.ok());
    CHECK(f.status().code() == StatusCode::kNotFound);
    auto store = WeightStore::Open(dir.path().string());
    REQUIRE_FALSE(store.ok());
    CHECK(store.status().code() == StatusCode::kNotFound);
  }
}

// Dimensions of 2^32 each pass the per-dimension limit, and their product wraps a signed 64-bit
// element count to 0, which then "matches" an empty byte range.
TEST_CASE("Safetensors rejects shapes whose element count overflows", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  WriteRaw(path,
           R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
           "");
  auto f = SafetensorsFile::Open(path);
  CHECK_FALSE(f.ok());
}

TEST_CASE("Safetensors header fuzz never crashes Open", "[safetensors]") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  REQUIRE(WriteSafetensors(
              good,
              {{"model.embed_tokens.weight", DType::kF32, {4, 3}, F32Bytes(RandomFloats(12, 7))},
               {"model.layers.0.w", DType::kF16, {2, 5}, F16Bytes(RandomFloats(10, 8))},
               {"model.norm", DType::kBF16, {6}, Bf16Bytes(RandomFloats(6, 9))}},
              {{"format", "pt"}})
              .ok());
  const std::string original = ReadAll(good);
  uint64_t header_len = 0;
  std::memcpy(&header_len, original.data(), 8);
  REQUIRE(header_len + 8 < original.size());

  std::mt19937 rng(4242);
  const std::string fuzz = dir.file("fuzz.safetensors");
  const char kInteresting[] = "{}[]\":,0123456789-eE. \\x";
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string bytes = original;
    const int edits = std::uniform_int_distribution<int>(1, 8)(rng);
    for (int e = 0; e < edits; ++e) {
      // Mostly the JSON header, sometimes the length field.
      const bool length_field = std::uniform_int_distribution<int>(0, 19)(rng) == 0;
      const size_t pos = length_field
                             ? std::uniform_int_distribution<size_t>(0, 7)(rng)
                             : std::uniform_int_distribution<size_t>(8, 8 + header_len - 1)(rng);
      if (std::uniform_int_distribution<int>(0, 1)(rng) == 0) {
        bytes[pos] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
      } else {
        bytes[pos] =
            kInteresting[std::uniform_int_distribution<size_t>(0, sizeof(kInteresting) - 2)(rng)];
      }
    }
    WriteAll(fuzz, bytes);
    auto f = SafetensorsFile::Open(fuzz);
    if (!f.ok()) {
      ++rejected;
      CHECK_FALSE(f.status().message().empty());
      continue;
    }
    ++accepted;
    // Whatever was accepted describes readable bytes inside the file.
    for (const auto& [name, v] : (*f)->tensors()) {
      CHECK(v.nbytes == static_cast<size_t>(v.numel()) * DTypeSize(v.dtype));
      CHECK(v.nbytes <= bytes.size());
      volatile unsigned sink = 0;  // touch every byte: it must be mapped
      for (size_t i = 0; i < v.nbytes; ++i) sink = sink + static_cast<unsigned>(v.data[i]);
    }
  }
  CHECK(accepted + rejected == 300);
  CHECK(rejected > 0);
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

TensorToWrite F32Tensor(const std::string& name, std::vector<int64_t> shape,
                        const std::vector<float>& v) {
  TensorToWrite t{name, DType::kF32, std::move(shape), {}};
  t.data.resize(v.size() * 4);
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

// ReadFp8 (what the CUDA fp8 path uploads) hands out the stored e4m3 bytes and scales of every
// granularity, consumes the scale tensors, and agrees with ReadF32's dequantization.
TEST_CASE("Safetensors ReadFp8 returns the stored e4m3 bytes and scales", "[safetensors][fp8]") {
  using M = WeightQuantization::Method;
  struct Case {
    const char* name;
    M method;
    std::string scale_name;
    std::vector<int64_t> scale_shape;
    Fp8Weight::Scale kind;
    bool input_scale;
  };
  const int64_t rows = 40, cols = 24;
  const std::vector<Case> cases = {
      {"per tensor, static input",
       M::kFp8PerTensor,
       "w.weight_scale",
       {},
       Fp8Weight::Scale::kTensor,
       true},
      {"per channel",
       M::kFp8PerChannel,
       "w.weight_scale",
       {rows, 1},
       Fp8Weight::Scale::kChannel,
       false},
      {"blocks 16x16", M::kFp8Block, "w.weight_scale_inv", {3, 2}, Fp8Weight::Scale::kBlock, false},
  };
  std::mt19937 rng(4);
  for (const Case& c : cases) {
    INFO(c.name);
    TempDir dir;
    TensorToWrite w{"w.weight", DType::kFp8E4M3, {rows, cols}, {}};
    w.data.resize(rows * cols);
    for (auto& b : w.data) b = static_cast<std::byte>(rng() % 0x7e);  // positive, never NaN
    int64_t n_scales = 1;
    for (int64_t d : c.scale_shape) n_scales *= d;
    std::vector<float> scales(n_scales);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.01f * static_cast<float>(i + 1);
    std::vector<TensorToWrite> ts = {w, F32Tensor(c.scale_name, c.scale_shape, scales)};
    if (c.input_scale) ts.push_back(F32Tensor("w.input_scale", {}, {0.25f}));
    REQUIRE(WriteSafetensors(dir.file("model.safetensors"), ts).ok());
    auto store = WeightStore::Open(dir.path().string());
    REQUIRE(store.ok());
    WeightQuantization q;
    q.method = c.method;
    q.quant_method = "test";
    q.static_input_scales = c.input_scale;
    if (c.method == M::kFp8Block) q.block_rows = q.block_cols = 16;
    (*store)->set_quantization(q);
    auto got = (*store)->ReadFp8("w.weight", {rows, cols});
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CHECK(got->kind == c.kind);
    CHECK(got->rows == rows);
    CHECK(got->cols == cols);
    CHECK(got->scale == scales);
    CHECK(std::memcmp(got->data, w.data.data(), w.data.size()) == 0);
    CHECK(got->has_input_scale == c.input_scale);
    if (c.input_scale) CHECK(got->input_scale == 0.25f);
    CHECK((*store)->CheckAllConsumed("test").ok());
    std::vector<float> deq;
    REQUIRE((*store)->ReadF32("w.weight", {rows, cols}, &deq).ok());
    bool same = true;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t col = 0; col < cols; ++col) {
        const float s = c.kind == Fp8Weight::Scale::kTensor    ? scales[0]
                        : c.kind == Fp8Weight::Scale::kChannel ? scales[r]
                                                               : scales[(r / 16) * 2 + col / 16];
        float v = 0.f;
        ConvertToF32(DType::kFp8E4M3, got->data + r * cols + col, &v, 1);
        same &= deq[r * cols + col] == v * s;
      }
    }
    CHECK(same);
    auto dtype = (*store)->StoredDType("w.weight");
    REQUIRE(dtype.ok());
    CHECK(*dtype == DType::kFp8E4M3);
    CHECK_FALSE((*store)->StoredDType("nope").ok());
  }
}

TEST_CASE("Safetensors ReadFp8 refuses a tensor that is not e4m3, naming it",
          "[safetensors][fp8]") {
  TempDir dir;
  REQUIRE(WriteSafetensors(dir.file("model.safetensors"),
                           {F32Tensor("w.weight", {2, 2}, {1.f, 2.f, 3.f, 4.f})})
              .ok());
  auto store = WeightStore::Open(dir.path().string());
  REQUIRE(store.ok());
  WeightQuantization q;
  q.method = WeightQuantization::Method::kFp8PerTensor;
  (*store)->set_quantization(q);
  auto got = (*store)->ReadFp8("w.weight", {2, 2});
  REQUIRE_FALSE(got.ok());
  CHECK_THAT(got.status().message(), Catch::Contains("w.weight"));
  CHECK_THAT(got.status().message(), Catch::Contains("float8_e4m3"));
}

}  // namespace
}  // namespace llm
