// The 4-bit GEMM on Intel AMX tiles, over gemm_q4.h's packed blocks: the same integer sums per group and the same
// float steps per row, so a row's bits equal gemm_q4.h's whatever the kernel or the pass size.
//
// gemm_q4.h's float part needs each group's integer sum (32 inputs) apart, so a tile multiply is one group: an A tile
// of 16 activation rows x 32 bytes (`tdpbsud`: signed activations) against a B tile of the group's 8 quads x 16
// columns of unsigned nibbles. A packed group's nibble vector j holds, per column, inputs 8j..8j+3 in its low
// nibbles and 8j+4..8j+7 in its high ones: the low half is quad 2j and the high half quad 2j + 1, so the B tile is
// the four vectors' low and high nibbles interleaved (unpacked once per group and block, shared by every row).
// 8-bit weights (Q8_0) are packed in that order already: their B tile is the group's first 512 bytes as they are.
// Each step's 16 x 16 sums go to memory and through gemm_q4.h's three float steps per row (a conversion, m * psum,
// two fused multiply-adds): the work a row still does per group, where the vector kernel also spends 8 vpdpbusd.
//
// A tile always loads 16 rows; the rows past the pass's end read whatever the activation buffer holds there (the
// caller sizes it to whole tiles, q4_amx_padded_rows) and their sums are dropped. Passes of up to
// kQ4AmxMinRows rows go to gemm_q4.h's vector kernel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gemm_amx.h"
#include "gemm_q4.h"

namespace paradecode {

// Passes of up to this many rows go to the vector kernel. The tiles' fixed work per group (an A tile load, per block a
// B tile load, a multiply and a 1 KiB store) is as much for 1 row as for 16: on an Intel Xeon with AMX, 2 threads,
// SmolLM2-135M's 3072 x 576 weight (benchmarks/q4_kernel.py), the tiles took 42-45 us at 4 rows against 27-31,
// 54-56 at 8 against 52, 79-81 at 16 against 104 and 294-300 at 64 against 405.
constexpr int64_t kQ4AmxMinRows = 8;
constexpr int kQ4AmxBlocks = 2;       // column blocks per tile step (x 2 groups: 4 accumulators, 2 weight tiles)

inline int64_t q4_amx_padded_rows(int64_t rows) { return (rows + kAmxRows - 1) / kAmxRows * kAmxRows; }

// Blocks per piece when a pass's column blocks are shared out over threads: what q4_amx_gemm's tile step for `rows`
// takes at once (q4_gemm's for the passes it hands over).
inline int64_t q4_amx_tile_blocks(int64_t rows) { return rows <= kQ4AmxMinRows ? q4_tile_blocks() : kQ4AmxBlocks; }

#ifdef PARADECODE_AMX
// Two groups per step, each with its own tiles: tiles 0-3 are the int32 accumulators [group][block] (16 rows x 16
// columns), 4-5 each group's activations (16 rows x 32 bytes), 6-7 a block's nibbles (8 quads x 16 columns).
inline void q4_amx_configure() {
  AmxConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = t == 4 || t == 5 ? kQ4Group : 64;
    config.rows[t] = t >= 6 ? kQ4Group / 4 : 16;
  }
  amx_load_config(config);
}

// One packed group's nibbles as a B tile: [8 quads][16 columns][4 bytes], quad 2j the low nibbles of vector j.
inline void q4_amx_unpack(const uint8_t* group, uint8_t* tile) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int j = 0; j < 4; ++j) {
    const __m512i v = _mm512_loadu_si512(group + j * 64);
    _mm512_store_si512(tile + (2 * j) * 64, _mm512_and_si512(v, low));
    _mm512_store_si512(tile + (2 * j + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
  }
}

// One group's multiply: its activations into tile A, then per block (NB: 1 or 2) a zeroed accumulator (C0, C1)
// plus A times the block's nibbles (tiles 6, 7). GCC's tile intrinsics take the tile's number as written.
#define PARADECODE_Q4_AMX_GROUP(A, C0, C1, h)      \
  _tile_loadd(A, a + (h) * kQ4Group, x.p_stride);  \
  _tile_zero(C0);                                  \
  _tile_loadd(6, nibbles[h][0], 64);               \
  _tile_dpbsud(C0, A, 6);                          \
  if constexpr (NB > 1) {                          \
    _tile_zero(C1);                                \
    _tile_loadd(7, nibbles[h][1], 64);             \
    _tile_dpbsud(C1, A, 7);                        \
  }

// The sums of G (1 or 2) groups from g x NB (1 or 2) blocks for the 16 rows from `first`, into sums[group][block].
template <int G, int NB>
inline void q4_amx_step(const Q4Rows& x, int64_t first, int64_t g, const uint8_t (*nibbles)[NB][kQ4Group / 4 * 64],
                        int32_t (*sums)[NB][kAmxRows * kBlockCols]) {
  const int8_t* a = x.p + first * x.p_stride + g * kQ4Group;
  PARADECODE_Q4_AMX_GROUP(4, 0, 1, 0)
  if constexpr (G > 1) {
    PARADECODE_Q4_AMX_GROUP(5, 2, 3, 1)
  }
  _tile_stored(0, sums[0][0], 64);
  if constexpr (NB > 1) _tile_stored(1, sums[0][1], 64);
  if constexpr (G > 1) {
    _tile_stored(2, sums[1][0], 64);
    if constexpr (NB > 1) _tile_stored(3, sums[1][1], 64);
  }
}
#undef PARADECODE_Q4_AMX_GROUP

// NB (1 or 2) blocks from b0 for `rows` rows (<= kMaxTileRows): y[r * y_stride + c] for the tile's 16 * NB columns.
template <int NB>
inline void q4_amx_blocks(const PackedQ4& w, int64_t b0, const Q4Rows& x, int64_t rows, float* y, int64_t y_stride) {
  alignas(64) float acc[kMaxTileRows * NB * kBlockCols];
  std::fill(acc, acc + rows * NB * kBlockCols, 0.f);
  alignas(64) uint8_t nibbles[2][NB][kQ4Group / 4 * 64];
  alignas(64) int32_t sums[2][NB][kAmxRows * kBlockCols];
  const int64_t block_stride = w.groups * w.group_bytes;
  const bool has_m = w.has_m(), eight = w.bits() == 8;
  for (int64_t g = 0; g < w.groups; g += 2) {
    const int pair = g + 1 < w.groups ? 2 : 1;
    __m512 d[2][NB], m[2][NB];
    for (int h = 0; h < pair; ++h)
      unroll<NB>([&](auto b) {
        const uint8_t* group = w.data + ((b0 + b) * w.groups + g + h) * w.group_bytes;
        for (int64_t off = 0; off < w.group_bytes; off += 64)  // the weights this thread reads next
          __builtin_prefetch(group + kQ4PrefetchGroups * w.group_bytes + off, 0, 2);
        if (eight) {  // 8-bit weights are packed as the B tile holds them
          std::memcpy(nibbles[h][b], group, sizeof(nibbles[h][b]));
          q4_scales(group + kScalesAt<8>, false, kImpliedM<8>, d[h][b], m[h][b]);
        } else {
          q4_amx_unpack(group, nibbles[h][b]);
          q4_scales(group + kScalesAt<4>, has_m, kImpliedM<4>, d[h][b], m[h][b]);
        }
      });
    for (int64_t first = 0; first < rows; first += kAmxRows) {
      if (pair == 2) q4_amx_step<2, NB>(x, first, g, nibbles, sums);
      else q4_amx_step<1, NB>(x, first, g, nibbles, sums);
      const int64_t last = std::min(rows, first + kAmxRows);
      for (int64_t r = first; r < last; ++r)  // gemm_q4.h's float steps, groups in order
        for (int h = 0; h < pair; ++h) {
          const __m512 a = _mm512_set1_ps(x.scale[r * x.group_stride + g + h]);
          const __m512 psum = _mm512_set1_ps(x.sum[r * x.group_stride + g + h]);
          unroll<NB>([&](auto b) {
            q4_finish(d[h][b], m[h][b], _mm512_load_si512(sums[h][b] + (r - first) * kBlockCols), a, psum,
                      acc + (r * NB + b) * kBlockCols);
          });
        }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    std::copy(acc + r * NB * kBlockCols, acc + (r + 1) * NB * kBlockCols, y + r * y_stride);
}
#endif

// The columns of blocks [b0, b1) for rows [0, rows), as q4_gemm computes them (same bits; up to kQ4AmxMinRows rows
// it is q4_gemm). x.p holds q4_amx_padded_rows(rows) rows; `spill` holds 16 * kMaxTileRows floats.
inline void q4_amx_gemm(const PackedQ4& w, const Q4Rows& x, int64_t rows, float* y, int64_t y_stride, int64_t b0,
                        int64_t b1, float* spill) {
#ifdef PARADECODE_AMX
  // 5- and 6-bit and Q4_K blocks have no tile form: the vector kernel, same bits
  const int bits = w.bits();
  if (rows <= kQ4AmxMinRows || bits == 5 || bits == 6 || bits == kQ4K)
    return q4_gemm(w, x, rows, y, y_stride, b0, b1, spill);
  q4_amx_configure();
  for (int64_t first = 0; first < rows; first += kMaxTileRows) {
    const int64_t n_rows = std::min<int64_t>(kMaxTileRows, rows - first);
    const Q4Rows part = x.from(first);
    for_blocks<kQ4AmxBlocks>(w.n, n_rows, y + first * y_stride, y_stride, b0, b1, spill,
                             [&](auto nb, int64_t b, float* out, int64_t stride) {
                               q4_amx_blocks<decltype(nb)::value>(w, b, part, n_rows, out, stride);
                             });
  }
  _tile_release();
#else  // never offered without AMX (amx_ready); the same sums by the vector kernel all the same
  q4_gemm(w, x, rows, y, y_stride, b0, b1, spill);
#endif
}

}  // namespace paradecode
