// The e2m1 -> bf16 widening and the activation tile layout of the MXFP4 grouped GEMMs
// (moe_gemm_mxfp4.cu), as inline functions for the host and the device alike, so that
// tests/unit/test_mxfp4_widen.cc checks them on the CPU: every code at every scale against
// base/mxfp4.h, and the shared-memory layout for conflict-free reads. Plain C++ header: no CUDA
// types.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LLM_MX_HD __host__ __device__ __forceinline__
#else
#define LLM_MX_HD inline
#endif

namespace llm::cuda {

// Byte n of the result is byte sel<4n+2 : 4n> of the 8 bytes {a (bytes 0-3), b (bytes 4-7)}
// (PTX prmt with selector nibbles below 8; callers keep bit 3 of every nibble clear).
LLM_MX_HD uint32_t Mxfp4Prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    r |= static_cast<uint32_t>((v >> (8 * ((sel >> (4 * n)) & 7))) & 0xFFu) << (8 * n);
  }
  return r;
#endif
}

// The bf16 bits of the 8 e2m1 magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^(s - 127), split
// into their low bytes (lo0: magnitudes 0-3, lo1: 4-7) and high bytes, for prmt lookups. With
// s7 = s << 7 the bits are (s - 1) << 7 for 0.5, s7 + {0, 0x40, 0x80, 0xC0, 0x100, 0x140} for
// 1 .. 6 and 0 for 0: exact and normal for 2 <= s <= 252 (MoeMxfp4ScaleOk), no carry between
// the two bf16 halves of a word.
struct Mxfp4Lut {
  uint32_t lo0, lo1, hi0, hi1;
};
LLM_MX_HD Mxfp4Lut Mxfp4MakeLut(uint32_t s) {
  const uint32_t s7 = s << 7, both = s7 * 0x00010001u;
  const uint32_t e01 = (s7 - 0x80u) << 16;  // {0, 0.5}
  const uint32_t e23 = both + 0x00400000u;  // {1, 1.5}
  const uint32_t e45 = both + 0x00C00080u;  // {2, 3}
  const uint32_t e67 = both + 0x01400100u;  // {4, 6}
  return {Mxfp4Prmt(e01, e23, 0x6420), Mxfp4Prmt(e45, e67, 0x6420), Mxfp4Prmt(e01, e23, 0x7531),
          Mxfp4Prmt(e45, e67, 0x7531)};
}

// Nibbles 4 h .. 4 h + 3 of w (e2m1 codes, the low nibble first) widened with the lookup
// table: *lo_pair = bf16x2 of nibbles (4 h, 4 h + 1), *hi_pair of (4 h + 2, 4 h + 3), the
// first of each pair in the low half. The magnitude bits index the tables; the sign bits move
// into the high bytes (bit 3 of nibble j is bit 7 of byte j of w << 4 for even j, of w for odd).
LLM_MX_HD void Mxfp4Widen4(uint32_t w, int h, const Mxfp4Lut& t, uint32_t* lo_pair,
                           uint32_t* hi_pair) {
  const uint32_t idx = (h != 0 ? w >> 16 : w) & 0x7777u;
  const uint32_t sgn = Mxfp4Prmt(w << 4, w, h != 0 ? 0x7362u : 0x5140u) & 0x80808080u;
  const uint32_t lo = Mxfp4Prmt(t.lo0, t.lo1, idx);
  const uint32_t hi = Mxfp4Prmt(t.hi0, t.hi1, idx) | sgn;
  *lo_pair = Mxfp4Prmt(lo, hi, 0x5140);
  *hi_pair = Mxfp4Prmt(lo, hi, 0x7362);
}

// Where 16-byte unit q (bf16 k 8 q .. 8 q + 7, q < 16) of a 128-wide k slice of tile token t
// sits in the activation stage (units of 16 bytes, 16 per token row): the four units of each
// 64-byte quarter c = q / 4 rotated by c, the quarters of odd tokens swapped in pairs. Thread
// (g, c) of a warp reads unit 4 c + i of token 8 nb + g at load step i, and the 8 threads of a
// 16-byte-load phase (g in {2 p, 2 p + 1}, c in 0..3) then hit 8 distinct 16-byte bank groups.
LLM_MX_HD int Mxfp4ActUnit(int t, int q) {
  const int c = q >> 2;
  return 4 * (c ^ (t & 1)) + (((q & 3) + c) & 3);
}

}  // namespace llm::cuda
