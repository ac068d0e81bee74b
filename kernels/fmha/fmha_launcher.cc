// Host side of the FMHA forward: validation, plan (warp layout, row tiles, KV splits), dispatch
// to the per-dtype device code. Plain C++ (compiled by the host compiler for CUDA and HIP).
#include "kernels/fmha/fmha_launcher.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/fmha/fmha_dispatch.h"
#include "kernels/split_kv.h"

#if LLM_FMHA_WGMMA
#include "kernels/cuda/common/device_info.h"  // CUDA builds with the sm_90a kernel only
#endif

namespace llm {
namespace {

using fmha::Layout;

constexpr int kMaxSplits = 64;
constexpr int kMinKeysPerSplit = 256;

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

int MaxSeqlenQ(const FmhaParams& p) {
  return p.seqstart_q ? p.max_seqlen_q : p.seqlen_q;
}

// Upper bound of any sequence's key count, known on the host.
int64_t MaxSeqlenK(const FmhaParams& p) {
  if (p.block_size > 0) return static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  return p.seqstart_k ? p.max_seqlen_k : p.cache_seqlen;
}

Layout ChooseLayout(const FmhaParams& p, FmhaKernel kernel) {
  const int64_t rows = static_cast<int64_t>(MaxSeqlenQ(p)) * (p.num_q_heads / p.num_kv_heads);
  if (rows <= fmha::kDecodeRows) return Layout::kDecode;
  // The wgmma kernel has head dims 64 and 128 only; 256 takes the portable one.
  if (p.head_dim == 256) return Layout::kPrefill;
  if (kernel == FmhaKernel::kWgmma || (kernel == FmhaKernel::kAuto && FmhaWgmmaAvailable())) {
    return Layout::kPrefillWgmma;
  }
  return Layout::kPrefill;
}

const char* ResidentCtas(const fmha::Run& run, int* per_sm) {
  const bool bf16 = run.p.dtype == FmhaDType::kBf16;
#if LLM_FMHA_WGMMA
  if (run.layout == Layout::kPrefillWgmma) {
    return bf16 ? fmha::ResidentCtasWgmmaBf16(run, per_sm)
                : fmha::ResidentCtasWgmmaFp16(run, per_sm);
  }
#endif
  return bf16 ? fmha::ResidentCtasBf16(run, per_sm) : fmha::ResidentCtasFp16(run, per_sm);
}

const char* Launch(const fmha::Run& run, void* stream) {
  const bool bf16 = run.p.dtype == FmhaDType::kBf16;
#if LLM_FMHA_WGMMA
  if (run.layout == Layout::kPrefillWgmma) {
    return bf16 ? fmha::LaunchWgmmaBf16(run, stream) : fmha::LaunchWgmmaFp16(run, stream);
  }
#endif
  return bf16 ? fmha::LaunchBf16(run, stream) : fmha::LaunchFp16(run, stream);
}

int RowTiles(const FmhaParams& p, Layout layout) {
  const int64_t rows = static_cast<int64_t>(MaxSeqlenQ(p)) * (p.num_q_heads / p.num_kv_heads);
  const int tile = fmha::LayoutRows(layout, p.head_dim);
  return static_cast<int>((rows + tile - 1) / tile);
}

struct DeviceInfo {
  int num_sms = 0;
  int smem_optin = 0;
};

DeviceInfo QueryDeviceInfo() {
  DeviceInfo d;
  if (fmha::QueryDevice(&d.num_sms, &d.smem_optin) != nullptr) d = DeviceInfo{};
  return d;
}

// Splits for the automatic choice: the count whose grid fills the GPU's resident CTA slots in the
// fullest waves (a 1.3-wave grid idles most SMs during its tail; a tiny grid leaves SMs empty),
// never below kMinKeysPerSplit keys per split; a split beyond one wave must gain 3%.
int AutoSplits(const FmhaParams& p, Layout layout, int row_tiles) {
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.num_kv_heads * row_tiles;
  const DeviceInfo dev = QueryDeviceInfo();
  if (ctas <= 0 || dev.num_sms <= 0) return 1;
  fmha::Run probe;
  probe.p = p;
  probe.layout = layout;
  probe.row_tiles = row_tiles;
  int per_sm = 0;
  if (ResidentCtas(probe, &per_sm) != nullptr || per_sm <= 0) per_sm = 1;
  const int64_t slots = static_cast<int64_t>(dev.num_sms) * per_sm;
  auto waves_of = [&](int64_t n) { return static_cast<double>(ctas * n) / slots; };
  const int64_t max_splits = std::clamp<int64_t>(MaxSeqlenK(p) / kMinKeysPerSplit, 1, kMaxSplits);
  int best = 1;
  double best_e = WaveEfficiency(waves_of(1));
  for (int n = 2; n <= max_splits; ++n) {
    const double e = WaveEfficiency(waves_of(n));
    if (SplitImproves(waves_of(n), e, best_e)) {
      best = n;
      best_e = e;
    }
  }
  return best;
}

}  // namespace

bool FmhaWgmmaAvailable() {
#if LLM_FMHA_WGMMA
  return cuda::CurrentDeviceIsSm90();  // cached per device: asked on every launch
#else
  return false;
#endif
}

Status FmhaCheckParams(const FmhaParams& p) {
  auto bad = [](const std::string& m) { return InvalidArgument("FmhaForward: " + m); };
  if (p.dtype != FmhaDType::kBf16 && p.dtype != FmhaDType::kFp16) {
    return bad("dtype must be bf16 or fp16");
  }
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    return bad("head_dim " + std::to_string(p.head_dim) + " unsupported (64, 128 or 256)");
  }
  if (p.batch < 0) return bad("batch " + std::to_string(p.batch) + " < 0");
  if (p.num_q_heads <= 0 || p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
    return bad("num_q_heads (" + std::to_string(p.num_q_heads) +
               ") must be a positive multiple of num_kv_heads (" + std::to_string(p.num_kv_heads) +
               ")");
  }
  if (p.seqstart_q) {
    if (p.max_seqlen_q < 0) return bad("group mode needs max_seqlen_q >= 0");
  } else if (p.seqlen_q < 0) {
    return bad("seqlen_q " + std::to_string(p.seqlen_q) + " < 0");
  }
  if (p.batch == 0 || MaxSeqlenQ(p) == 0) return Status::Ok();  // nothing to do
  if (!p.seqlen_k) return bad("seqlen_k is null");
  // With out_fp8 the output goes there (out is not written and may be null).
  const void* out = p.out_fp8 ? p.out_fp8 : p.out;
  if (!p.q || !p.k || !p.v || !out) return bad("q, k, v and out (or out_fp8) must be non-null");
  if (!Aligned16(p.q) || !Aligned16(p.k) || !Aligned16(p.v) || !Aligned16(out)) {
    return bad("q, k, v and out (or out_fp8) must be 16-byte aligned");
  }
  if (p.out_fp8 && !(p.out_fp8_inv_scale > 0.f && std::isfinite(p.out_fp8_inv_scale))) {
    return bad("out_fp8_inv_scale must be positive and finite");
  }
  if (p.block_size > 0) {
    if (p.block_size % 16 != 0) {
      return bad("block_size " + std::to_string(p.block_size) + " is not a multiple of 16");
    }
    if (!p.block_table || p.max_blocks_per_seq <= 0) {
      return bad("paged KV needs block_table and max_blocks_per_seq > 0");
    }
  } else if (p.block_size < 0) {
    return bad("block_size " + std::to_string(p.block_size) + " < 0");
  } else if (p.seqstart_k) {
    if (p.max_seqlen_k <= 0) return bad("packed KV (seqstart_k) needs max_seqlen_k > 0");
    if (p.cache_batch_idx) return bad("packed KV (seqstart_k) takes no cache_batch_idx");
  } else if (p.cache_seqlen <= 0) {
    return bad("contiguous KV (block_size 0) needs cache_seqlen > 0");
  }
  if (p.mask.sink_tokens < 0) return bad("mask.sink_tokens < 0");
  switch (p.mask.type) {
    case FmhaMaskType::kNone:
    case FmhaMaskType::kCausalTopLeft:
    case FmhaMaskType::kCausalBottomRight:
    case FmhaMaskType::kWindow:
      break;
    default:
      return bad("unknown mask type");
  }
  if (!std::isfinite(p.softmax_scale)) return bad("softmax_scale is not finite");
  if (!(p.softcap >= 0.f) || !std::isfinite(p.softcap)) return bad("softcap must be >= 0");
  const int64_t rows = static_cast<int64_t>(MaxSeqlenQ(p)) * (p.num_q_heads / p.num_kv_heads);
  const int64_t tile_rows = p.head_dim == 256 ? fmha::kPrefillRowsD256 : fmha::kPrefillRows;
  if (rows > tile_rows * 65535 || p.batch > 65535) {
    return bad("grid too large: max_seqlen_q * group must be <= " +
               std::to_string(tile_rows * 65535) + " and batch <= 65535");
  }
  return Status::Ok();
}

size_t FmhaWorkspaceBytes(const FmhaParams& p, int num_splits) {
  if (!FmhaCheckParams(p).ok() || p.batch == 0 || MaxSeqlenQ(p) == 0) return 0;
  const Layout layout = ChooseLayout(p, FmhaKernel::kAuto);
  const int row_tiles = RowTiles(p, layout);
  if (num_splits == 0) {
    num_splits = AutoSplits(p, layout, row_tiles);
  }
  return fmha::WorkspaceBytes(p, layout, row_tiles, num_splits);
}

int FmhaAutoSplits(const FmhaParams& p) {
  if (!FmhaCheckParams(p).ok() || p.batch == 0 || MaxSeqlenQ(p) == 0) return 1;
  const Layout layout = ChooseLayout(p, FmhaKernel::kAuto);
  return AutoSplits(p, layout, RowTiles(p, layout));
}

Status FmhaForward(const FmhaParams& p, void* stream) {
  return FmhaForward(p, FmhaLaunchOptions{}, stream);
}

Status FmhaForward(const FmhaParams& p, const FmhaLaunchOptions& options, void* stream) {
  LLM_RETURN_IF_ERROR(FmhaCheckParams(p));
  if (p.batch == 0 || MaxSeqlenQ(p) == 0) return Status::Ok();
  if (options.num_splits < 0) {
    return InvalidArgument("FmhaForward: num_splits " + std::to_string(options.num_splits) +
                           " < 0");
  }
  if (options.kernel == FmhaKernel::kWgmma && p.head_dim == 256) {
    return InvalidArgument("FmhaForward: the wgmma kernel has no head_dim 256 (kAuto serves it)");
  }
  if (options.kernel == FmhaKernel::kWgmma && !FmhaWgmmaAvailable()) {
    return InvalidArgument(
        "FmhaForward: the wgmma kernel needs a compute capability 9.0 device and a build that "
        "includes sm_90a");
  }
  fmha::Run run;
  run.p = p;
  run.layout = ChooseLayout(p, options.kernel);
  run.row_tiles = RowTiles(p, run.layout);
  int splits = options.num_splits;
  if (splits == 0) {
    // The automatic count is the one FmhaWorkspaceBytes(p, 0) sized (the kAuto kernel's).
    splits =
        options.workspace ? AutoSplits(p, ChooseLayout(p, FmhaKernel::kAuto), run.row_tiles) : 1;
  }
  splits = std::min(splits, kMaxSplits);
  if (splits > 1) {
    const size_t need = fmha::WorkspaceBytes(p, run.layout, run.row_tiles, splits);
    if (!options.workspace || options.workspace_bytes < need || !Aligned16(options.workspace)) {
      return InvalidArgument("FmhaForward: " + std::to_string(splits) +
                             " KV splits need a 16-byte aligned " + std::to_string(need) +
                             "-byte workspace, got " +
                             std::to_string(options.workspace ? options.workspace_bytes : 0));
    }
    if (static_cast<int64_t>(p.num_kv_heads) * splits > (int64_t{1} << 31) - 1) {
      return InvalidArgument("FmhaForward: num_kv_heads * num_splits too large");
    }
    const size_t parts = static_cast<size_t>(p.batch) * p.num_kv_heads * run.row_tiles * splits *
                         fmha::LayoutRows(run.layout, p.head_dim);
    auto* base = static_cast<char*>(options.workspace);
    run.partial_o = reinterpret_cast<float*>(base);
    run.partial_lse = reinterpret_cast<float*>(base + parts * p.head_dim * sizeof(float));
  }
  run.num_splits = splits;
  const char* err = Launch(run, stream);
  if (err) return Internal(std::string("FmhaForward: kernel launch failed: ") + err);
  return Status::Ok();
}

}  // namespace llm
