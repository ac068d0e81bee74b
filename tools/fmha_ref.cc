// Runs the CPU FMHA reference (kernels/cpu/cpu_fmha.h) on one case described by a JSON file, so
// an independent oracle (tests/python/test_fmha_vs_torch.py, PyTorch) can check it.
//
//   llm-fmha-ref CASE.json OUT.f32 LSE.f32
//
// CASE.json (field meanings as in kernels/fmha/fmha_params.h; optional fields marked ?):
//   "dtype": "bf16" | "fp16", "batch", "num_q_heads", "num_kv_heads", "head_dim",
//   "seqlen_q" (batch mode) or "seqstart_q": [batch + 1] (group mode), "seqlen_k": [batch],
//   "block_size": 0 (contiguous KV) or > 0 (paged KV),
//     paged:      "num_blocks", "max_blocks_per_seq", "block_table": [batch * max_blocks_per_seq]
//     contiguous: "num_cache_rows", "cache_seqlen", "cache_batch_idx"?: [batch]
//   "softmax_scale", "softcap"?, "alibi_slopes"?: [num_q_heads], "sink_logits"?: [num_q_heads],
//   "mask"?: {"type": "none" | "causal_top_left" | "causal_bottom_right" | "window",
//             "window_left"?, "window_right"?, "sink_tokens"?},
//   "q", "k", "v": paths (relative to CASE.json's folder) of raw little-endian uint16 bf16/fp16
//             bits in the fmha_params.h layouts.
// Writes OUT.f32 [total_q, num_q_heads, head_dim] and LSE.f32 [total_q, num_q_heads] as raw
// little-endian fp32. Every index the reference would follow is range-checked first, so bad
// input ends in an error message and exit status 1, never in a crash or a CHECK.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "kernels/cpu/cpu_fmha.h"

namespace {

using json = nlohmann::json;
using llm::InvalidArgument;
using llm::Status;
using llm::StatusOr;

constexpr uint64_t kMaxElems = uint64_t{1} << 30;  // 2 GiB of bf16: far beyond any test case

static_assert(std::endian::native == std::endian::little, "raw files are little-endian");

// Everything one case owns: the params point into these vectors.
struct Case {
  llm::FmhaParams p;
  std::vector<int32_t> seqstart_q, seqlen_k, block_table, cache_batch_idx;
  std::vector<float> alibi, sinks;
  std::vector<uint16_t> q, k, v;
};

StatusOr<int> GetInt(const json& j, const std::string& key, std::optional<int> fallback = {}) {
  if (!j.contains(key)) {
    if (fallback) return *fallback;
    return InvalidArgument("missing field \"" + key + "\"");
  }
  const json& e = j[key];
  if (!e.is_number_integer() || e.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
      e.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("field \"" + key + "\" must be a 32-bit integer, got " + e.dump());
  }
  return static_cast<int>(e.get<int64_t>());
}

StatusOr<float> GetFloat(const json& j, const std::string& key, std::optional<float> fallback) {
  if (!j.contains(key)) {
    if (fallback) return *fallback;
    return InvalidArgument("missing field \"" + key + "\"");
  }
  const json& e = j[key];
  if (!e.is_number() || !std::isfinite(e.get<double>())) {
    return InvalidArgument("field \"" + key + "\" must be a finite number, got " + e.dump());
  }
  return static_cast<float>(e.get<double>());
}

// A list of exactly `n` integers (or absent, when `optional`: returns an empty vector).
StatusOr<std::vector<int32_t>> GetInts(const json& j, const std::string& key, size_t n,
                                       bool optional = false) {
  std::vector<int32_t> out;
  if (!j.contains(key) && optional) return out;
  if (!j.contains(key)) return InvalidArgument("missing field \"" + key + "\"");
  const json& e = j[key];
  if (!e.is_array() || e.size() != n) {
    return InvalidArgument("field \"" + key + "\" must be a list of " + std::to_string(n) +
                           " integers");
  }
  for (size_t i = 0; i < n; ++i) {
    if (!e[i].is_number_integer() || e[i].get<int64_t>() < std::numeric_limits<int32_t>::min() ||
        e[i].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidArgument(key + "[" + std::to_string(i) +
                             "] is not a 32-bit integer: " + e[i].dump());
    }
    out.push_back(static_cast<int32_t>(e[i].get<int64_t>()));
  }
  return out;
}

StatusOr<std::vector<float>> GetFloats(const json& j, const std::string& key, size_t n) {
  std::vector<float> out;
  if (!j.contains(key)) return out;  // all float lists are optional
  const json& e = j[key];
  if (!e.is_array() || e.size() != n) {
    return InvalidArgument("field \"" + key + "\" must be a list of " + std::to_string(n) +
                           " numbers");
  }
  for (size_t i = 0; i < n; ++i) {
    if (!e[i].is_number() || !std::isfinite(e[i].get<double>())) {
      return InvalidArgument(key + "[" + std::to_string(i) +
                             "] is not a finite number: " + e[i].dump());
    }
    out.push_back(static_cast<float>(e[i].get<double>()));
  }
  return out;
}

// Reads a raw uint16 file that must hold exactly `elems` elements.
StatusOr<std::vector<uint16_t>> ReadBits(const json& j, const std::string& key,
                                         const std::filesystem::path& dir, uint64_t elems) {
  if (!j.contains(key) || !j[key].is_string()) {
    return InvalidArgument("field \"" + key + "\" must be a file path");
  }
  const std::filesystem::path path = dir / j[key].get<std::string>();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return llm::NotFound("cannot open " + key + " file " + path.string());
  const uint64_t bytes = static_cast<uint64_t>(in.tellg());
  if (bytes != elems * sizeof(uint16_t)) {
    return InvalidArgument(key + " file " + path.string() + " has " + std::to_string(bytes) +
                           " bytes; the shape needs " + std::to_string(elems) +
                           " x 2 = " + std::to_string(elems * sizeof(uint16_t)));
  }
  // At least one element: an empty cache is valid, but the reference rejects null pointers.
  std::vector<uint16_t> bits(std::max<uint64_t>(elems, 1));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bits.data()), static_cast<std::streamsize>(bytes))) {
    return llm::DataLoss("short read from " + path.string());
  }
  return bits;
}

StatusOr<llm::FmhaMask> ParseMask(const json& j) {
  llm::FmhaMask m;  // absent: the struct's default (causal bottom-right)
  if (!j.contains("mask")) return m;
  const json& mj = j["mask"];
  if (!mj.is_object() || !mj.contains("type") || !mj["type"].is_string()) {
    return InvalidArgument("field \"mask\" must be an object with a string \"type\"");
  }
  const std::string type = mj["type"].get<std::string>();
  if (type == "none") {
    m.type = llm::FmhaMaskType::kNone;
  } else if (type == "causal_top_left") {
    m.type = llm::FmhaMaskType::kCausalTopLeft;
  } else if (type == "causal_bottom_right") {
    m.type = llm::FmhaMaskType::kCausalBottomRight;
  } else if (type == "window") {
    m.type = llm::FmhaMaskType::kWindow;
  } else {
    return InvalidArgument("mask type \"" + type +
                           "\" is not none, causal_top_left, causal_bottom_right or window");
  }
  LLM_ASSIGN_OR_RETURN(m.window_left, GetInt(mj, "window_left", -1));
  LLM_ASSIGN_OR_RETURN(m.window_right, GetInt(mj, "window_right", 0));
  LLM_ASSIGN_OR_RETURN(m.sink_tokens, GetInt(mj, "sink_tokens", 0));
  if (m.sink_tokens < 0) return InvalidArgument("mask sink_tokens must be >= 0");
  return m;
}

StatusOr<Case> LoadCase(const std::string& path) {
  std::ifstream in(path);
  if (!in) return llm::NotFound("cannot open case file " + path);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("not a JSON object");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();

  Case c;
  llm::FmhaParams& p = c.p;
  if (!j.contains("dtype") || !j["dtype"].is_string()) {
    return InvalidArgument("field \"dtype\" must be \"bf16\" or \"fp16\"");
  }
  const std::string dtype = j["dtype"].get<std::string>();
  if (dtype != "bf16" && dtype != "fp16") {
    return InvalidArgument("dtype \"" + dtype + "\" is not bf16 or fp16");
  }
  p.dtype = dtype == "bf16" ? llm::FmhaDType::kBf16 : llm::FmhaDType::kFp16;
  LLM_ASSIGN_OR_RETURN(p.batch, GetInt(j, "batch"));
  LLM_ASSIGN_OR_RETURN(p.num_q_heads, GetInt(j, "num_q_heads"));
  LLM_ASSIGN_OR_RETURN(p.num_kv_heads, GetInt(j, "num_kv_heads"));
  LLM_ASSIGN_OR_RETURN(p.head_dim, GetInt(j, "head_dim"));
  if (p.batch < 0) return InvalidArgument("batch must be >= 0");
  if (p.head_dim <= 0) return InvalidArgument("head_dim must be > 0");
  if (p.num_q_heads <= 0 || p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
    return InvalidArgument("num_q_heads " + std::to_string(p.num_q_heads) +
                           " must be a positive multiple of num_kv_heads " +
                           std::to_string(p.num_kv_heads));
  }

  // Query layout: exactly one of batch mode and group mode.
  if (j.contains("seqlen_q") == j.contains("seqstart_q")) {
    return InvalidArgument("give exactly one of \"seqlen_q\" (batch mode) and \"seqstart_q\"");
  }
  if (j.contains("seqstart_q")) {
    LLM_ASSIGN_OR_RETURN(c.seqstart_q, GetInts(j, "seqstart_q", p.batch + 1));
    if (c.seqstart_q[0] != 0) return InvalidArgument("seqstart_q[0] must be 0");
    for (int b = 0; b < p.batch; ++b) {
      const int64_t rows = static_cast<int64_t>(c.seqstart_q[b + 1]) - c.seqstart_q[b];
      if (rows < 0) {
        return InvalidArgument("seqstart_q decreases at sequence " + std::to_string(b));
      }
      p.max_seqlen_q = std::max(p.max_seqlen_q, static_cast<int>(rows));
    }
    p.seqstart_q = c.seqstart_q.data();
  } else {
    LLM_ASSIGN_OR_RETURN(p.seqlen_q, GetInt(j, "seqlen_q"));
    if (p.seqlen_q < 0) return InvalidArgument("seqlen_q must be >= 0");
    if (static_cast<int64_t>(p.batch) * p.seqlen_q > std::numeric_limits<int32_t>::max()) {
      return InvalidArgument("batch x seqlen_q overflows int32");
    }
    p.max_seqlen_q = p.seqlen_q;
  }
  LLM_ASSIGN_OR_RETURN(c.seqlen_k, GetInts(j, "seqlen_k", p.batch));
  p.seqlen_k = c.seqlen_k.data();

  // KV layout; every block / row some key j < seqlen_k maps to must exist.
  LLM_ASSIGN_OR_RETURN(p.block_size, GetInt(j, "block_size"));
  if (p.block_size < 0) return InvalidArgument("block_size must be >= 0");
  double kv_dims = 0;  // k/v element count, as a double so a huge shape cannot wrap
  if (p.block_size > 0) {
    LLM_ASSIGN_OR_RETURN(const int num_blocks, GetInt(j, "num_blocks"));
    LLM_ASSIGN_OR_RETURN(p.max_blocks_per_seq, GetInt(j, "max_blocks_per_seq"));
    if (num_blocks < 0 || p.max_blocks_per_seq < 0) {
      return InvalidArgument("num_blocks and max_blocks_per_seq must be >= 0");
    }
    LLM_ASSIGN_OR_RETURN(c.block_table, GetInts(j, "block_table",
                                                static_cast<size_t>(p.batch) *
                                                    static_cast<size_t>(p.max_blocks_per_seq)));
    p.block_table = c.block_table.data();
    const int64_t capacity = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
    for (int b = 0; b < p.batch; ++b) {
      if (c.seqlen_k[b] < 0 || c.seqlen_k[b] > capacity) {
        return InvalidArgument("seqlen_k[" + std::to_string(b) +
                               "] = " + std::to_string(c.seqlen_k[b]) + " is outside [0, " +
                               std::to_string(capacity) + "] (max_blocks_per_seq x block_size)");
      }
      const int used = (c.seqlen_k[b] + p.block_size - 1) / p.block_size;
      for (int x = 0; x < used; ++x) {
        const int32_t blk = c.block_table[static_cast<size_t>(b) * p.max_blocks_per_seq + x];
        if (blk < 0 || blk >= num_blocks) {
          return InvalidArgument("block_table[" + std::to_string(b) + "][" + std::to_string(x) +
                                 "] = " + std::to_string(blk) + " is outside [0, " +
                                 std::to_string(num_blocks) + ")");
        }
      }
    }
    kv_dims = static_cast<double>(num_blocks) * p.num_kv_heads * p.block_size * p.head_dim;
  } else {
    LLM_ASSIGN_OR_RETURN(const int rows, GetInt(j, "num_cache_rows"));
    LLM_ASSIGN_OR_RETURN(p.cache_seqlen, GetInt(j, "cache_seqlen"));
    if (rows < 0 || p.cache_seqlen < 0) {
      return InvalidArgument("num_cache_rows and cache_seqlen must be >= 0");
    }
    LLM_ASSIGN_OR_RETURN(c.cache_batch_idx,
                         GetInts(j, "cache_batch_idx", p.batch, /*optional=*/true));
    if (!c.cache_batch_idx.empty()) p.cache_batch_idx = c.cache_batch_idx.data();
    for (int b = 0; b < p.batch; ++b) {
      const int row = c.cache_batch_idx.empty() ? b : c.cache_batch_idx[b];
      if (row < 0 || row >= rows) {
        return InvalidArgument("sequence " + std::to_string(b) + " reads cache row " +
                               std::to_string(row) + ", outside [0, " + std::to_string(rows) + ")");
      }
      if (c.seqlen_k[b] < 0 || c.seqlen_k[b] > p.cache_seqlen) {
        return InvalidArgument(
            "seqlen_k[" + std::to_string(b) + "] = " + std::to_string(c.seqlen_k[b]) +
            " is outside [0, cache_seqlen " + std::to_string(p.cache_seqlen) + "]");
      }
    }
    kv_dims = static_cast<double>(rows) * p.cache_seqlen * p.num_kv_heads * p.head_dim;
  }

  LLM_ASSIGN_OR_RETURN(p.softmax_scale, GetFloat(j, "softmax_scale", std::nullopt));
  LLM_ASSIGN_OR_RETURN(p.softcap, GetFloat(j, "softcap", 0.0f));
  if (p.softcap < 0.0f) return InvalidArgument("softcap must be >= 0 (0 = off)");
  LLM_ASSIGN_OR_RETURN(p.mask, ParseMask(j));
  LLM_ASSIGN_OR_RETURN(c.alibi, GetFloats(j, "alibi_slopes", p.num_q_heads));
  LLM_ASSIGN_OR_RETURN(c.sinks, GetFloats(j, "sink_logits", p.num_q_heads));
  if (!c.alibi.empty()) p.alibi_slopes = c.alibi.data();
  if (!c.sinks.empty()) p.sink_logits = c.sinks.data();

  // Bounds the declared shapes before any product can wrap (each factor is < 2^31).
  const double q_dims = static_cast<double>(llm::FmhaTotalQ(p)) * p.num_q_heads * p.head_dim;
  if (q_dims > static_cast<double>(kMaxElems) || kv_dims > static_cast<double>(kMaxElems)) {
    return InvalidArgument("declared q or k/v shape exceeds " + std::to_string(kMaxElems) +
                           " elements");
  }
  const auto q_elems = static_cast<uint64_t>(q_dims);
  const auto kv_elems = static_cast<uint64_t>(kv_dims);
  LLM_ASSIGN_OR_RETURN(c.q, ReadBits(j, "q", dir, q_elems));
  LLM_ASSIGN_OR_RETURN(c.k, ReadBits(j, "k", dir, kv_elems));
  LLM_ASSIGN_OR_RETURN(c.v, ReadBits(j, "v", dir, kv_elems));
  p.q = c.q.data();
  p.k = c.k.data();
  p.v = c.v.data();
  return c;
}

Status WriteFloats(const std::string& path, const std::vector<float>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out) return llm::Internal("cannot write " + path);
  return Status();
}

Status Run(const std::string& case_path, const std::string& out_path, const std::string& lse_path) {
  LLM_ASSIGN_OR_RETURN(Case c, LoadCase(case_path));
  const size_t rows = static_cast<size_t>(llm::FmhaTotalQ(c.p)) * c.p.num_q_heads;
  std::vector<float> out(rows * c.p.head_dim), lse(rows);
  c.p.lse = lse.data();
  llm::CpuFmhaForward(c.p, out.data());
  LLM_RETURN_IF_ERROR(WriteFloats(out_path, out));
  return WriteFloats(lse_path, lse);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CASE.json OUT.f32 LSE.f32\n", argv[0]);
    return 2;
  }
  Status s;
  try {
    s = Run(argv[1], argv[2], argv[3]);
  } catch (const std::exception& e) {  // e.g. bad_alloc on a huge declared shape
    s = llm::Internal(e.what());
  }
  if (!s.ok()) {
    std::fprintf(stderr, "llm-fmha-ref: %s: %s\n", argv[1], s.ToString().c_str());
    return 1;
  }
  return 0;
}
