// paradecode's own int8 GEMM for the native forward (no torch types: tests compile it alone for several CPUs).
//
// y[r][n] = float(sum_k q[r][k] * w[n][k]) * scale[n]: int8 activations q (|q| <= 127) against int8 weights
// (|w| <= 127) with exact int32 sums, then the one float rounding every kernel of the forward shares (fbgemm
// and torch._int_mm give the same bits), so the kernel chosen never changes a logit.
//
// Weights are packed once in blocks of 16 output columns: [block][k / 4][16 columns][4 k] bytes, each w + 128
// as an unsigned byte. One pass over a block's bytes serves every row of the pass: the weights are read from
// memory once whatever the number of rows, which is what makes verifying several draft tokens cost little more
// than one token while the weights dominate. The inner product per instruction, by what the build targets:
//   AVX512-VNNI: vpdpbusd on 64 bytes (16 columns x 4 k) per row, u8 weights x s8 activations; the +128 is
//                taken off once per row as 128 * sum_k q[r][k].
//   AVX-VNNI:    the same on 32-byte halves.
//   AVX2:        vpmaddubsw with the activation's sign moved onto the weight (|q| x sign(q) w; pair sums stay
//                within int16 since both magnitudes are <= 127), then vpmaddwd into int32.
//   otherwise:   plain integer loops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace paradecode {

constexpr int64_t kBlockCols = 16;  // output columns per packed block

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define PARADECODE_GEMM_ISA "avx512-vnni"
#elif defined(__AVXVNNI__)
#define PARADECODE_GEMM_ISA "avx-vnni"
#elif defined(__AVX2__)
#define PARADECODE_GEMM_ISA "avx2"
#else
#define PARADECODE_GEMM_ISA "scalar"
#endif

inline const char* gemm_isa() { return PARADECODE_GEMM_ISA; }

struct PackedInt8 {
  const uint8_t* data;  // [blocks][kq][16][4]
  const float* scale;   // [n]
  int64_t n, k, kq, blocks;
};

inline int64_t packed_quads(int64_t k) { return (k + 3) / 4; }
inline int64_t packed_bytes(int64_t n, int64_t k) { return (n + kBlockCols - 1) / kBlockCols * packed_quads(k) * 64; }

// w [n, k] int8 row-major -> out (packed_bytes(n, k) bytes); missing columns and k past the end hold weight 0.
inline void pack_int8(const int8_t* w, int64_t n, int64_t k, uint8_t* out) {
  const int64_t kq = packed_quads(k), blocks = (n + kBlockCols - 1) / kBlockCols;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < kq; ++i)
      for (int64_t c = 0; c < kBlockCols; ++c)
        for (int64_t j = 0; j < 4; ++j) {
          const int64_t col = b * kBlockCols + c, kk = 4 * i + j;
          const int v = col < n && kk < k ? w[col * k + kk] : 0;
          out[((b * kq + i) * kBlockCols + c) * 4 + j] = static_cast<uint8_t>(v + 128);
        }
}

template <class F, size_t... I>
__attribute__((always_inline)) inline void unroll_seq(std::index_sequence<I...>, F&& f) {
  (f(std::integral_constant<int, static_cast<int>(I)>{}), ...);
}
// f(0), f(1), ..., f(N - 1) with compile-time indices, so arrays indexed by them stay in registers.
template <int N, class F>
__attribute__((always_inline)) inline void unroll(F&& f) {
  unroll_seq(std::make_index_sequence<N>{}, f);
}

// The last `left` (<= N) rows, from row r, as one tile of exactly that height.
template <int N, class Tile>
inline void rest_tile(int64_t left, int64_t r, Tile& tile) {
  if constexpr (N >= 1) {
    if (left == N) return tile(std::integral_constant<int, N>{}, r);
    rest_tile<N - 1>(left, r, tile);
  }
}

// Rows [0, rows) through `tile(rows_in_tile, first_row)`: MR at a time, then the rows left over as one tile of
// their own height (3 rows left are one pass over the tile's weights, not three).
template <int MR, class Tile>
inline void row_tiles(int64_t rows, Tile&& tile) {
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) tile(std::integral_constant<int, MR>{}, r);
  rest_tile<MR - 1>(rows - r, r, tile);
}

#if defined(__AVXVNNI__) || defined(__AVX2__)
// 256-bit code: a 32-byte half of one quad's packed weights (8 columns x 4 k), as the dot
// product below takes them: unsigned for AVX-VNNI, back to the signed weight for AVX2.
inline __m256i load_weights(const uint8_t* p) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
#if defined(__AVXVNNI__)
  return w;
#else
  return _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
#endif
}
// acc + each of 8 columns' sum of its 4 weights x the row's 4 activations (a: the row's quad, broadcast).
// AVX2: vpmaddubsw with the activation's sign moved onto the weight (|q| x sign(q) w), then vpmaddwd into int32.
inline __m256i dot_quad(__m256i acc, __m256i w, __m256i a) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, w, a);
#else
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(w, a));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}
#endif

// MR rows x NB blocks of 16 columns, quads [i0, i1) of k: the int32 sums in `sums` ([MR][NB][16], read and
// written back, so a block's weights are read from memory once while every row's sums advance chunk by chunk).
template <int MR, int NB>
inline void gemm_tile(const PackedInt8& w, int64_t b0, const int8_t* q, int64_t q_stride, int64_t i0, int64_t i1,
                      int32_t* sums) {
  const int64_t block_bytes = w.kq * 64;
  const uint8_t* wb = w.data + b0 * block_bytes;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  __m512i acc[MR][NB];
  unroll<MR>([&](auto r) { unroll<NB>([&](auto b) { acc[r][b] = _mm512_loadu_si512(sums + (r * NB + b) * 16); }); });
  for (int64_t i = i0; i < i1; ++i) {
    __m512i wv[NB];
    unroll<NB>([&](auto b) { wv[b] = _mm512_loadu_si512(wb + b * block_bytes + i * 64); });
    unroll<MR>([&](auto r) {
      int32_t quad;
      std::memcpy(&quad, q + r * q_stride + 4 * i, 4);
      const __m512i a = _mm512_set1_epi32(quad);
      unroll<NB>([&](auto b) { acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], wv[b], a); });
    });
  }
  unroll<MR>([&](auto r) { unroll<NB>([&](auto b) { _mm512_storeu_si512(sums + (r * NB + b) * 16, acc[r][b]); }); });
#elif defined(__AVXVNNI__) || defined(__AVX2__)
  __m256i acc[MR][2 * NB];
  unroll<MR>([&](auto r) { unroll<2 * NB>([&](auto b) {
    acc[r][b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + (r * NB) * 16 + b * 8)); }); });
  for (int64_t i = i0; i < i1; ++i) {
    __m256i wv[2 * NB];
    unroll<2 * NB>([&](auto b) { wv[b] = load_weights(wb + (b / 2) * block_bytes + i * 64 + (b % 2) * 32); });
    unroll<MR>([&](auto r) {
      int32_t quad;
      std::memcpy(&quad, q + r * q_stride + 4 * i, 4);
      const __m256i a = _mm256_set1_epi32(quad);
      unroll<2 * NB>([&](auto b) { acc[r][b] = dot_quad(acc[r][b], wv[b], a); });
    });
  }
  unroll<MR>([&](auto r) { unroll<2 * NB>([&](auto b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + (r * NB) * 16 + b * 8), acc[r][b]); }); });
#else
  for (int64_t r = 0; r < MR; ++r) {
    for (int64_t b = 0; b < NB; ++b) {
      int32_t* out = sums + (r * NB + b) * 16;
      const uint8_t* block = wb + b * block_bytes;
      const int8_t* row = q + r * q_stride;
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t c = 0; c < kBlockCols; ++c)
          for (int64_t j = 0; j < 4; ++j)
            out[c] += (static_cast<int32_t>(block[(i * kBlockCols + c) * 4 + j]) - 128) * row[4 * i + j];
    }
  }
#endif
}

// Whether the kernel's sums carry the +128 of the unsigned weights (taken off as 128 * the row's sum of q).
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) || defined(__AVXVNNI__)
constexpr bool kOffsetSums = true;
#else
constexpr bool kOffsetSums = false;
#endif

constexpr int64_t kChunkQuads = 8;  // k quads per chunk: a tile's weights for one chunk stay in L1 across rows
// With several rows, the weights 32 quads (2 KiB per block) ahead are asked into L2 while a chunk is multiplied:
// the rows' multiply-adds then overlap the memory read instead of waiting for it. Measured on an AMD EPYC Zen 4
// (2 threads, the 135M model's matrices): 64 quads ahead against none, 4 rows 5.6 -> 5.0 ms, 8 rows 6.2 -> 5.9 ms
// per forward's GEMMs; asking into L1 (a chunk or two ahead) was slower than no prefetch at all (8 rows 7.0 ms),
// as was a non-temporal hint. 32 quads against 64 (the same CPU kind, a forward's 120 matrices of 135M shapes,
// 106 MB, the two alternating rep by rep, median of 41 per-rep ratios, two runs): 0.930-0.936x at 8 rows,
// 0.935-0.940x at 4, 0.985-0.993x at 16; 24 and 40 quads within 2% of 32, 16 and 48 quads 0.96-0.97x
// (benchmarks/int8_tiles.py compares such variants).
constexpr int64_t kPrefetchQuads = 32;
constexpr int kMaxTileRows = 64;     // rows whose sums one tile keeps (more rows: several passes over the tile)

// The int32 sums of `rows` rows ([rows][cols], from column b0 * 16) -> y[r * y_stride + c]: less the +128 the
// unsigned weights carry (kOffsetSums), times each column's scale: the one float rounding of every kernel.
inline void scale_sums(const PackedInt8& w, int64_t b0, const int32_t* sums, int64_t cols, const int32_t* rowsum,
                       int64_t rows, float* y, int64_t y_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t offset = kOffsetSums ? 128 * rowsum[r] : 0;
    for (int64_t c = 0; c < cols; ++c)
      y[r * y_stride + c] = static_cast<float>(sums[r * cols + c] - offset) * w.scale[b0 * kBlockCols + c];
  }
}

// NB blocks from b0 for `rows` rows (<= kMaxTileRows), MR rows at a time: y[r * y_stride + c] for the tile's
// 16 * NB columns. (Chunk and Prefetch: kChunkQuads and kPrefetchQuads, other values for benchmarks/int8_tiles.py.)
template <int MR, int NB, int64_t Chunk = kChunkQuads, int64_t Prefetch = kPrefetchQuads>
inline void gemm_blocks(const PackedInt8& w, int64_t b0, const int8_t* q, int64_t q_stride, const int32_t* rowsum,
                        int64_t rows, float* y, int64_t y_stride) {
  alignas(64) int32_t sums[kMaxTileRows * NB * kBlockCols];
  std::fill(sums, sums + rows * NB * kBlockCols, 0);
  const int64_t block_bytes = w.kq * 64;
  const uint8_t* wb = w.data + b0 * block_bytes;
  for (int64_t i0 = 0; i0 < w.kq; i0 += Chunk) {
    const int64_t i1 = std::min(w.kq, i0 + Chunk);
    if (rows > 1) {  // past the end: the next tile's weights, which this thread reads next
      const uint8_t* ahead = wb + (i0 + Prefetch) * 64;
      for (int b = 0; b < NB; ++b)
        for (int64_t off = 0; off < (i1 - i0) * 64; off += 64) __builtin_prefetch(ahead + b * block_bytes + off, 0, 2);
    }
    row_tiles<MR>(rows, [&](auto mr, int64_t r) {
      gemm_tile<decltype(mr)::value, NB>(w, b0, q + r * q_stride, q_stride, i0, i1, sums + r * NB * kBlockCols);
    });
  }
  scale_sums(w, b0, sums, NB * kBlockCols, rowsum, rows, y, y_stride);
}

// One or two rows (a token, or a token and its residual row): blocks [b0, b1) one after the other, so the pass reads
// the packed bytes as one sequential stream (blocks lie end to end), the pattern the hardware prefetcher follows best,
// with two rows the bytes kPrefetchQuads quads ahead asked into L2 besides. One row reads faster left to the hardware
// alone (AMD EPYC Zen 4, 2 threads, int8, the two forms alternating pass by pass in one process, greedy after 256
// tokens, medians of the per-pass ratios: SmolLM2-135M T=1 0.942x (61 passes), gemma3-270m 0.902x (41), a synthetic
// Llama-3.2-1B 0.963x (21); two rows 0.99-1.00x, so they keep it). The latency of the dependent multiply-adds is hidden
// by kRowChains independent sums per row over interleaved quads, added up at the end of the block: integer sums, so the
// order changes no bit. Against streaming 8 blocks at once (8 streams 9 KiB apart on SmolLM2-135M's shapes, no
// prefetch), a forward's 120 matrices (106 MB on 2 MiB pages, 2 threads, one row, the two alternating rep by rep,
// median of 61 per-rep ratios, four runs) took 0.85-0.90x the time on an AMD EPYC Zen 4; in the forward (SmolLM2-135M
// after 256 tokens, the two alternating pass by pass in one process, medians of 61-101 per-pass ratios, two runs) int8
// T=1 0.96-0.99x, T=2 0.96-0.97x, q4 T=1 (its int8 LM head) 0.96-0.985x.
constexpr int kRowChains = 4;

template <int MR>
inline void gemm_rows_stream(const PackedInt8& w, const int8_t* q, int64_t q_stride, const int32_t* rowsum,
                             float* y, int64_t y_stride, int64_t b0, int64_t b1, float* spill) {
  const int64_t block_bytes = w.kq * 64, full = w.n / kBlockCols;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = w.data + b * block_bytes;
    alignas(64) int32_t sums[MR][kBlockCols];
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    __m512i acc[MR][kRowChains];
    unroll<MR>([&](auto r) { unroll<kRowChains>([&](auto c) { acc[r][c] = _mm512_setzero_si512(); }); });
    auto step = [&](int64_t i, auto c) {
      const __m512i wv = _mm512_loadu_si512(wb + i * 64);
      unroll<MR>([&](auto r) {
        int32_t quad;
        std::memcpy(&quad, q + r * q_stride + 4 * i, 4);
        acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], wv, _mm512_set1_epi32(quad));
      });
    };
    auto finish = [&] {
      unroll<MR>([&](auto r) {
        unroll<kRowChains - 1>([&](auto c) { acc[r][0] = _mm512_add_epi32(acc[r][0], acc[r][c + 1]); });
        _mm512_store_si512(sums[r], acc[r][0]);
      });
    };
#elif defined(__AVXVNNI__) || defined(__AVX2__)
    __m256i acc[MR][kRowChains][2];
    unroll<MR>([&](auto r) { unroll<kRowChains>([&](auto c) { acc[r][c][0] = acc[r][c][1] = _mm256_setzero_si256(); }); });
    auto step = [&](int64_t i, auto c) {
      const __m256i wv[2] = {load_weights(wb + i * 64), load_weights(wb + i * 64 + 32)};
      unroll<MR>([&](auto r) {
        int32_t quad;
        std::memcpy(&quad, q + r * q_stride + 4 * i, 4);
        const __m256i a = _mm256_set1_epi32(quad);
        unroll<2>([&](auto h) { acc[r][c][h] = dot_quad(acc[r][c][h], wv[h], a); });
      });
    };
    auto finish = [&] {
      unroll<MR>([&](auto r) {
        unroll<2>([&](auto h) {
          unroll<kRowChains - 1>([&](auto c) { acc[r][0][h] = _mm256_add_epi32(acc[r][0][h], acc[r][c + 1][h]); });
          _mm256_store_si256(reinterpret_cast<__m256i*>(sums[r] + h * 8), acc[r][0][h]);
        });
      });
    };
#else
    std::fill(&sums[0][0], &sums[0][0] + MR * kBlockCols, 0);
    auto step = [&](int64_t i, auto) {
      for (int64_t r = 0; r < MR; ++r)
        for (int64_t c = 0; c < kBlockCols; ++c)
          for (int64_t j = 0; j < 4; ++j)
            sums[r][c] += (static_cast<int32_t>(wb[(i * kBlockCols + c) * 4 + j]) - 128) * q[r * q_stride + 4 * i + j];
    };
    auto finish = [] {};
#endif
    int64_t i = 0;
    for (; i + kRowChains <= w.kq; i += kRowChains) {
      // the bytes ahead (past this block's end: the next block's, which come next)
      if constexpr (MR > 1)
        unroll<kRowChains>([&](auto c) { __builtin_prefetch(wb + (i + c + kPrefetchQuads) * 64, 0, 2); });
      unroll<kRowChains>([&](auto c) { step(i + c, c); });
    }
    for (; i < w.kq; ++i) step(i, std::integral_constant<int, 0>{});
    finish();
    float* out = b < full ? y + b * kBlockCols : spill;  // a partial last block goes through `spill`
    scale_sums(w, b, &sums[0][0], kBlockCols, rowsum, MR, out, b < full ? y_stride : kBlockCols);
    if (b >= full)
      for (int64_t r = 0; r < MR; ++r)
        std::copy(spill + r * kBlockCols, spill + r * kBlockCols + (w.n - b * kBlockCols), y + r * y_stride + b * kBlockCols);
  }
}

// The one- and two-row alternative to the stream, which the kernel choice at load may pick per pass-size bucket
// (kernel "interleaved"): kOneRowBlocks blocks at once, each its own stream, nothing asked ahead.
#if defined(__AVX512F__)
constexpr int kOneRowBlocks = 8;
#elif defined(__AVX2__)
constexpr int kOneRowBlocks = 4;
#else
constexpr int kOneRowBlocks = 1;
#endif

// Tile shapes for more rows: 4 x 4 (the accumulators stay in registers: 16 of 32 vector registers with AVX-512;
// 256-bit code has 16 registers and takes 2 x 2 blocks, i.e. 4 x 2 halves).
#if defined(__AVX512F__)
constexpr int kTileRows = 4, kTileBlocks = 4;
#elif defined(__AVX2__)
constexpr int kTileRows = 2, kTileBlocks = 2;
#else
constexpr int kTileRows = 1, kTileBlocks = 1;
#endif

// Blocks per piece when a pass's column blocks are shared out over threads (a multiple of every tile's width).
inline int64_t own_tile_blocks() { return std::max(kOneRowBlocks, kTileBlocks); }

// Blocks [b0, b1) of an n-column output for `rows` rows, NB at a time and then one at a time:
// run(std::integral_constant<int, nb>, first block, out, out_stride) computes nb blocks into out; the partial last
// block (fewer than 16 columns) goes through `spill` (16 * kMaxTileRows floats) and only its columns are copied.
template <int NB, class Run>
inline void for_blocks(int64_t n, int64_t rows, float* y, int64_t y_stride, int64_t b0, int64_t b1, float* spill,
                       Run&& run) {
  const int64_t full = std::min(b1, n / kBlockCols);  // blocks whose 16 columns all exist
  int64_t b = b0;
  for (; b + NB <= full; b += NB) run(std::integral_constant<int, NB>{}, b, y + b * kBlockCols, y_stride);
  for (; b < full; ++b) run(std::integral_constant<int, 1>{}, b, y + b * kBlockCols, y_stride);
  if (b < b1) {
    run(std::integral_constant<int, 1>{}, b, spill, kBlockCols);
    const int64_t cols = n - b * kBlockCols;
    for (int64_t r = 0; r < rows; ++r)
      std::copy(spill + r * kBlockCols, spill + r * kBlockCols + cols, y + r * y_stride + b * kBlockCols);
  }
}

template <int MR, int NB>
inline void gemm_range(const PackedInt8& w, const int8_t* q, int64_t q_stride, const int32_t* rowsum, int64_t rows,
                       float* y, int64_t y_stride, int64_t b0, int64_t b1, float* spill) {
  for_blocks<NB>(w.n, rows, y, y_stride, b0, b1, spill, [&](auto nb, int64_t b, float* out, int64_t stride) {
    gemm_blocks<MR, decltype(nb)::value>(w, b, q, q_stride, rowsum, rows, out, stride);
  });
}

// The columns of blocks [b0, b1) for rows [0, rows): y[r * y_stride + col] for col < n (a partial last block
// goes through `spill`, 16 * kMaxTileRows floats). q rows hold kq * 4 bytes (zero-padded). One or two rows read
// the blocks as one stream, or `interleaved`, kOneRowBlocks at once (the same bits either way).
inline void int8_gemm(const PackedInt8& w, const int8_t* q, int64_t q_stride, const int32_t* rowsum, int64_t rows,
                      float* y, int64_t y_stride, int64_t b0, int64_t b1, float* spill, bool interleaved = false) {
  if (rows <= 2 && interleaved) {
    if (rows == 1) return gemm_range<1, kOneRowBlocks>(w, q, q_stride, rowsum, 1, y, y_stride, b0, b1, spill);
    return gemm_range<2, kOneRowBlocks>(w, q, q_stride, rowsum, 2, y, y_stride, b0, b1, spill);
  }
  if (rows == 1) return gemm_rows_stream<1>(w, q, q_stride, rowsum, y, y_stride, b0, b1, spill);
  if (rows == 2) return gemm_rows_stream<2>(w, q, q_stride, rowsum, y, y_stride, b0, b1, spill);
  for (int64_t first = 0; first < rows; first += kMaxTileRows) {
    const int64_t n_rows = std::min<int64_t>(kMaxTileRows, rows - first);
    gemm_range<kTileRows, kTileBlocks>(w, q + first * q_stride, q_stride, rowsum + first, n_rows,
                                       y + first * y_stride, y_stride, b0, b1, spill);
  }
}

}  // namespace paradecode
