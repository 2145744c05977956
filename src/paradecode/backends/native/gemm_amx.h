// The int8 GEMM on Intel AMX tiles (Sapphire Rapids and later), over the same packed weights as gemm.h.
//
// gemm.h packs each block of 16 output columns as [k / 4][16 columns][4 k] unsigned bytes (w + 128): 16 quads of
// k are exactly an AMX B tile (16 rows of 64 bytes), so the weights need no second copy. An A tile is 16
// activation rows x 64 bytes of k; `tdpbsud` (signed A x unsigned B) adds a 16 x 16 int32 product per
// instruction, and the +128 is taken off per row as 128 * sum_k q[r][k], as gemm.h's VNNI path does. Integer
// sums are exact in any order, and the one float rounding (sum * scale) is gemm.h's, so a row's bits equal the
// other kernels' whatever the pass size.
//
// No software prefetch: the weights stream through tile loads in address order, which the hardware prefetchers
// follow; asking for them ahead (the next blocks, or 64-256 quads on as gemm.h does) was slower on an Intel Xeon with
// AMX (576 x 1536 weights streamed, one thread, 1-16 rows: 2.1-2.3 ms without, 2.3-3.8 ms with).
//
// Rows come in tiles of 16: up to 16 rows use one A tile against four blocks (4 accumulators), more rows two A
// tiles against two blocks (2 x 2 accumulators). A tile always loads 16 rows; the rows past the pass's end read
// whatever the activation buffer holds there (the caller sizes it to whole groups) and their sums are dropped,
// since an output row depends only on its own activation row.
//
// AMX needs the kernel's permission once per process (arch_prctl ARCH_REQ_XCOMP_PERM); where it is refused, or
// the build's target has no AMX, `amx_ready` is false and the kernel is not offered.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gemm.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define PARADECODE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace paradecode {

constexpr int64_t kAmxRows = 16;       // rows of an A tile
constexpr int64_t kAmxQuads = 16;      // k quads per tile step (64 bytes of k)
constexpr int64_t kAmxGroupRows = 32;  // rows one pass over a block set serves (two A tiles)
// Passes of up to this many rows go to gemm.h's vector kernel: a tile multiplies 16 rows whatever the number used,
// and streaming the weights through tile loads was slower than through vector loads for 1-4 rows (Intel Xeon with
// AMX, one thread, 3072 x 576 weights streamed: 2 rows 4.0 vs 4.3 ms, 4 rows about equal, 8 rows 5.8 vs 4.5 ms).
constexpr int64_t kAmxMinRows = 4;

// Whether this build has the AMX kernel and the OS lets the process use the tiles.
inline bool amx_ready() {
#ifdef PARADECODE_AMX
  static const bool ready = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return ready;
#else
  return false;
#endif
}

// Whether a weight of k inputs fits the kernel's whole tile steps.
inline bool amx_fits(int64_t k) { return k % (4 * kAmxQuads) == 0; }

// The activation buffer's rows for `rows` rows: whole groups the tiles may read.
inline int64_t amx_padded_rows(int64_t rows) {
  return rows <= kAmxRows ? kAmxRows : (rows + kAmxGroupRows - 1) / kAmxGroupRows * kAmxGroupRows;
}

// Blocks per piece when a pass's column blocks are shared out over threads: what amx_gemm's tile shape for
// `rows` takes at once (gemm.h's for the passes it hands over).
inline int64_t amx_tile_blocks(int64_t rows) {
  return rows <= kAmxMinRows ? own_tile_blocks() : rows <= kAmxRows ? 4 : 2;
}

#ifdef PARADECODE_AMX
struct alignas(64) AmxConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// ldtilecfg with the whole 64-byte configuration as its memory operand. GCC 12's _tile_loadconfig names only the
// first 8 bytes, so the compiler may drop the stores of the tiles' shapes as dead: a q4 tile configuration built on
// the stack was loaded with garbage shapes (a general-protection fault, SIGSEGV) until this.
inline void amx_load_config(const AmxConfig& config) { __asm__ volatile("ldtilecfg %0" ::"m"(config)); }

// Tiles 0-3: int32 accumulators; 4-5: activation rows; 5-7 (one A tile) or 6-7 (two): weights. All 16 x 64 bytes.
inline void amx_configure() {
  AmxConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  amx_load_config(config);
}

// sums [tiles][16][16]: the accumulators in order (1 x NB or 2 x NB), then y = (sum - 128 * rowsum) * scale.
inline void amx_finish(const PackedInt8& w, int64_t b0, int nb, int a_tiles, const int32_t* sums,
                       const int32_t* rowsum, int64_t rows, float* y, int64_t y_stride) {
  for (int a = 0; a < a_tiles; ++a)
    for (int b = 0; b < nb; ++b) {
      const int32_t* tile = sums + (a * nb + b) * kAmxRows * kBlockCols;
      const float* scale = w.scale + (b0 + b) * kBlockCols;
      for (int64_t r = 0; r < kAmxRows && a * kAmxRows + r < rows; ++r) {
        const int64_t row = a * kAmxRows + r;
        const int32_t offset = 128 * rowsum[row];
        // one vector of 16 columns: int32 -> float rounds as static_cast<float> does, then the same product
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(
            _mm512_load_si512(tile + r * kBlockCols), _mm512_set1_epi32(offset)));
        _mm512_storeu_ps(y + row * y_stride + b * kBlockCols, _mm512_mul_ps(sum, _mm512_loadu_ps(scale)));
      }
    }
}

// NB (1..4) blocks from b0 for up to 16 rows: one A tile against NB weight tiles per step of k.
template <int NB>
inline void amx_one_tile(const PackedInt8& w, int64_t b0, const int8_t* q, int64_t q_stride, const int32_t* rowsum,
                         int64_t rows, float* y, int64_t y_stride) {
  const int64_t block_bytes = w.kq * 64;
  const uint8_t* wb = w.data + b0 * block_bytes;
  _tile_zero(0);
  if (NB > 1) _tile_zero(1);
  if (NB > 2) _tile_zero(2);
  if (NB > 3) _tile_zero(3);
  for (int64_t i = 0; i < w.kq; i += kAmxQuads) {
    _tile_loadd(4, q + 4 * i, q_stride);
    _tile_loadd(5, wb + i * 64, 64);
    if (NB > 1) _tile_loadd(6, wb + block_bytes + i * 64, 64);
    if (NB > 2) _tile_loadd(7, wb + 2 * block_bytes + i * 64, 64);
    _tile_dpbsud(0, 4, 5);
    if (NB > 1) _tile_dpbsud(1, 4, 6);
    if (NB > 2) _tile_dpbsud(2, 4, 7);
    if (NB > 3) {
      _tile_loadd(5, wb + 3 * block_bytes + i * 64, 64);
      _tile_dpbsud(3, 4, 5);
    }
  }
  alignas(64) int32_t sums[4 * kAmxRows * kBlockCols];
  _tile_stored(0, sums, 64);
  if (NB > 1) _tile_stored(1, sums + 1 * kAmxRows * kBlockCols, 64);
  if (NB > 2) _tile_stored(2, sums + 2 * kAmxRows * kBlockCols, 64);
  if (NB > 3) _tile_stored(3, sums + 3 * kAmxRows * kBlockCols, 64);
  amx_finish(w, b0, NB, 1, sums, rowsum, rows, y, y_stride);
}

// NB (1 or 2) blocks from b0 for up to 32 rows: two A tiles against NB weight tiles (accumulators a * 2 + b).
template <int NB>
inline void amx_two_tiles(const PackedInt8& w, int64_t b0, const int8_t* q, int64_t q_stride, const int32_t* rowsum,
                          int64_t rows, float* y, int64_t y_stride) {
  const int64_t block_bytes = w.kq * 64;
  const uint8_t* wb = w.data + b0 * block_bytes;
  const int8_t* q1 = q + kAmxRows * q_stride;
  _tile_zero(0);
  _tile_zero(2);
  if (NB > 1) {
    _tile_zero(1);
    _tile_zero(3);
  }
  for (int64_t i = 0; i < w.kq; i += kAmxQuads) {
    _tile_loadd(4, q + 4 * i, q_stride);
    _tile_loadd(5, q1 + 4 * i, q_stride);
    _tile_loadd(6, wb + i * 64, 64);
    if (NB > 1) _tile_loadd(7, wb + block_bytes + i * 64, 64);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(2, 5, 6);
    if (NB > 1) {
      _tile_dpbsud(1, 4, 7);
      _tile_dpbsud(3, 5, 7);
    }
  }
  // stored in amx_finish's order: A tile 0's NB accumulators, then A tile 1's
  alignas(64) int32_t sums[4 * kAmxRows * kBlockCols];
  _tile_stored(0, sums, 64);
  if (NB > 1) _tile_stored(1, sums + kAmxRows * kBlockCols, 64);
  _tile_stored(2, sums + NB * kAmxRows * kBlockCols, 64);
  if (NB > 1) _tile_stored(3, sums + (NB + 1) * kAmxRows * kBlockCols, 64);
  amx_finish(w, b0, NB, 2, sums, rowsum, rows, y, y_stride);
}
#endif

// Blocks [b0, b1) for rows [0, rows), as int8_gemm computes them (same bits; up to kAmxMinRows rows it is
// int8_gemm). q holds amx_padded_rows(rows) rows of q_stride bytes; w.kq is a multiple of 16 (amx_fits); `spill`
// holds 16 * kMaxTileRows floats.
inline void amx_gemm(const PackedInt8& w, const int8_t* q, int64_t q_stride, const int32_t* rowsum, int64_t rows,
                     float* y, int64_t y_stride, int64_t b0, int64_t b1, float* spill) {
#ifdef PARADECODE_AMX
  if (rows <= kAmxMinRows) return int8_gemm(w, q, q_stride, rowsum, rows, y, y_stride, b0, b1, spill);
  amx_configure();
  if (rows <= kAmxRows) {
    for_blocks<4>(w.n, rows, y, y_stride, b0, b1, spill, [&](auto nb, int64_t b, float* out, int64_t stride) {
      amx_one_tile<decltype(nb)::value>(w, b, q, q_stride, rowsum, rows, out, stride);
    });
  } else {
    // kMaxTileRows rows at a time (what `spill` holds), a block pair's weights staying in L2 across its row groups
    for (int64_t first = 0; first < rows; first += kMaxTileRows) {
      const int64_t chunk = std::min<int64_t>(kMaxTileRows, rows - first);
      for_blocks<2>(w.n, chunk, y + first * y_stride, y_stride, b0, b1, spill,
                    [&](auto nb, int64_t b, float* out, int64_t stride) {
                      for (int64_t g = 0; g < chunk; g += kAmxGroupRows)
                        amx_two_tiles<decltype(nb)::value>(w, b, q + (first + g) * q_stride, q_stride,
                                                           rowsum + first + g, std::min(kAmxGroupRows, chunk - g),
                                                           out + g * stride, stride);
                    });
    }
  }
  _tile_release();
#else  // never offered without AMX (amx_ready); the same sums by the vector kernel all the same
  int8_gemm(w, q, q_stride, rowsum, rows, y, y_stride, b0, b1, spill);
#endif
}

}  // namespace paradecode
