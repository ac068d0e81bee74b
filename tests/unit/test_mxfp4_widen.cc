// The host-testable parts of the MXFP4 grouped GEMMs (kernels/cuda/moe/mxfp4_widen.h and
// moe_ops.h), on the CPU: the prmt lookup widening of e2m1 codes to bf16 against base/mxfp4.h at
// every scale MoeMxfp4ScaleOk accepts, the activation tile layout (a permutation, and
// conflict-free fragment loads), the tile-size choice and its tile bound, and the packing.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "base/dtype.h"
#include "base/mxfp4.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/moe/mxfp4_widen.h"

namespace llm::cuda {
namespace {

// The exact bf16 bits of nibble code times 2^(s - 127) (normal for every accepted scale).
uint16_t WantBits(int code, int s) {
  const float v = std::ldexp(Fp4E2M1ToFloat(static_cast<uint8_t>(code)), s - 127);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  REQUIRE((bits & 0xFFFFu) == 0);  // exact in bf16
  return static_cast<uint16_t>(bits >> 16);
}

// The 4 values of half h of w, widened.
void Widen(uint32_t w, int h, int s, uint16_t out[4]) {
  uint32_t lo, hi;
  Mxfp4Widen4(w, h, Mxfp4MakeLut(static_cast<uint32_t>(s)), &lo, &hi);
  out[0] = static_cast<uint16_t>(lo), out[1] = static_cast<uint16_t>(lo >> 16);
  out[2] = static_cast<uint16_t>(hi), out[3] = static_cast<uint16_t>(hi >> 16);
}

TEST_CASE("MXFP4 widening: every code in every nibble at every accepted scale", "[mxfp4]") {
  std::mt19937 rng(7);
  int checked = 0;
  for (int s = 0; s < 256; ++s) {
    if (!MoeMxfp4ScaleOk(static_cast<uint8_t>(s))) continue;
    for (int code = 0; code < 16; ++code) {
      for (int pos = 0; pos < 8; ++pos) {
        // The other nibbles random: they must not leak into this value.
        const uint32_t w = (static_cast<uint32_t>(rng()) & ~(0xFu << (4 * pos))) |
                           (static_cast<uint32_t>(code) << (4 * pos));
        uint16_t got[4];
        Widen(w, pos / 4, s, got);
        INFO("scale " << s << " code " << code << " nibble " << pos);
        REQUIRE(got[pos % 4] == WantBits(code, s));
        ++checked;
      }
    }
  }
  CHECK(checked == 251 * 16 * 8);
}

TEST_CASE("MXFP4 widening: every 4-nibble pattern at the edge and middle scales", "[mxfp4]") {
  for (const int s : {2, 118, 127, 252}) {
    for (uint32_t p = 0; p < 0x10000u; ++p) {
      for (int h = 0; h < 2; ++h) {
        const uint32_t w = h ? (p << 16) | 0x5A3Cu : p | 0xC3A50000u;
        uint16_t got[4];
        Widen(w, h, s, got);
        for (int j = 0; j < 4; ++j) {
          if (got[j] != WantBits(static_cast<int>((p >> (4 * j)) & 0xF), s)) {
            FAIL("scale " << s << " pattern " << p << " half " << h << " value " << j);
          }
        }
      }
    }
  }
}

// Each token row's 16 units land on 16 distinct places, and the 8 threads of a 16-byte load
// phase (g in {2 p, 2 p + 1}, c in 0..3, reading unit 4 c + i of token 8 nb + g) hit 8 distinct
// 16-byte bank groups (rows of 256 bytes, 128 bytes of banks).
TEST_CASE("MXFP4 activation tile layout: a permutation, conflict-free fragment loads", "[mxfp4]") {
  for (int t = 0; t < 64; ++t) {
    std::set<int> pos;
    for (int q = 0; q < 16; ++q) pos.insert(Mxfp4ActUnit(t, q));
    CHECK(pos.size() == 16);
    CHECK(*pos.begin() == 0);
    CHECK(*pos.rbegin() == 15);
  }
  for (int nb = 0; nb < 8; ++nb) {
    for (int i = 0; i < 4; ++i) {
      for (int p = 0; p < 4; ++p) {
        std::set<int> banks;
        for (int g = 2 * p; g < 2 * p + 2; ++g) {
          for (int c = 0; c < 4; ++c) {
            const int t = 8 * nb + g;
            banks.insert((t * 16 + Mxfp4ActUnit(t, 4 * c + i)) % 8);
          }
        }
        INFO("n8 block " << nb << " step " << i << " phase " << p);
        CHECK(banks.size() == 8);
      }
    }
  }
}

TEST_CASE("MXFP4 tile rows: 16 for decode, larger as experts fill, within the 16-row bound",
          "[mxfp4]") {
  // gpt-oss-20b: 32 experts, top-4.
  CHECK(MoeMxfp4TileRows(1, 4, 32) == 16);
  CHECK(MoeMxfp4TileRows(8, 4, 32) == 16);
  CHECK(MoeMxfp4TileRows(16, 4, 32) == 16);
  CHECK(MoeMxfp4TileRows(64, 4, 32) == 16);   // 8 rows per expert on average
  CHECK(MoeMxfp4TileRows(128, 4, 32) == 32);  // 16
  CHECK(MoeMxfp4TileRows(256, 4, 32) == 64);  // 32
  CHECK(MoeMxfp4TileRows(8192, 4, 32) == 64);
  CHECK(MoeMxfp4TileRows(40, 1, 1) == 64);  // one expert holds every token
  CHECK(MoeMxfp4TileRows(5, 0, 0) == 16);   // no division by zero
  for (const int E : {1, 8, 32, 128}) {
    for (const int K : {1, 2, 4, 8}) {
      int prev = 16;
      for (int T = 0; T <= 4096; T += 7) {
        const int tr = MoeMxfp4TileRows(T, K, E);
        REQUIRE(MoeMxfp4TileRowsOk(tr));
        REQUIRE(tr >= prev);  // grows with the batch
        prev = tr;
        // The layer reserves MoeMaxTiles at 16 rows: an upper bound for every tile size.
        REQUIRE(MoeMaxTiles(T * K, E, 0, tr) <= MoeMaxTiles(T * K, E, 0));
      }
    }
  }
  CHECK(!MoeMxfp4TileRowsOk(8));
  CHECK(!MoeMxfp4TileRowsOk(128));
}

// Tiles of tile_rows rows over every split of S slots among E experts: what the permutation
// makes, sum over experts of ceil(count / tile_rows), never exceeds MoeMaxTiles.
TEST_CASE("MoeMaxTiles bounds the tiles of every tile size", "[mxfp4]") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const int E = 1 + static_cast<int>(rng() % 64), S = static_cast<int>(rng() % 600);
    const int tr = 16 << (rng() % 3);
    std::vector<int> count(E, 0);
    for (int s = 0; s < S; ++s) ++count[rng() % E];
    int tiles = 0;
    for (int c : count) tiles += (c + tr - 1) / tr;
    REQUIRE(tiles <= MoeMaxTiles(S, E, 0, tr));
  }
}

TEST_CASE("PackMoeMxfp4: padded k, gate / up rows split, zero values at scale 127", "[mxfp4]") {
  const int64_t E = 2, rows = 4, k = 160;  // 5 groups; padded to 256 (8 groups)
  const int64_t groups = k / 32, kp = MoeMxfp4KPad(static_cast<int>(k));
  REQUIRE(kp == 256);
  std::vector<uint8_t> blocks(static_cast<size_t>(E * rows * groups * 16)),
      scales(static_cast<size_t>(E * rows * groups));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(100 + i);
  for (const bool split : {false, true}) {
    std::vector<uint8_t> v, s;
    PackMoeMxfp4(blocks.data(), scales.data(), E, rows, k, split, &v, &s);
    REQUIRE(v.size() == static_cast<size_t>(E * rows * kp / 2));
    REQUIRE(s.size() == static_cast<size_t>(E * rows * kp / 32));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < rows; ++r) {
        // split: checkpoint row r (gate 2 i, up 2 i + 1) lands at i or rows / 2 + i.
        const int64_t dst = split ? (r % 2 == 0 ? r / 2 : rows / 2 + r / 2) : r;
        const int64_t src_row = e * rows + r, dst_row = e * rows + dst;
        for (int64_t b = 0; b < kp / 2; ++b) {
          const uint8_t want = b < groups * 16 ? blocks[src_row * groups * 16 + b] : 0;
          REQUIRE(v[dst_row * kp / 2 + b] == want);
        }
        for (int64_t gi = 0; gi < kp / 32; ++gi) {
          const uint8_t want = gi < groups ? scales[src_row * groups + gi] : 127;
          REQUIRE(s[dst_row * kp / 32 + gi] == want);
        }
      }
    }
  }
}

}  // namespace
}  // namespace llm::cuda
