// The 4-bit GEMM of the native forward: a GGUF checkpoint's own Q4_0 / Q4_1 weight blocks, as stored, against
// int8 activations quantized per group of 32 (no torch types: tests compile it alone for several CPUs).
//
// A Q4_1 block holds 32 weights of one output column as w = d * q + m (q in 0..15; Q4_0 is the case m = -8 d).
// The activations of a row are quantized per group of the same 32 inputs: x ~ a * p (p in -127..127, a the
// group's max |x| / 127). Then, per column n and group g,
//   sum_k x_k w_k ~ a_g * (d * sum_k q_k p_k + m * sum_k p_k),
// where both sums are exact integers (the unsigned nibbles times signed bytes of vpdpbusd). The float part is
// three roundings per group in a fixed order (m * psum, then d * qsum + that, then a_g * that + the column's sum
// so far), groups in order, so a row's result is the same bits whatever the tile shape, the number of rows in
// the pass or the thread that computes it: the row exactness the speculative methods and batching rely on.
//
// Packed layout, per block of 16 output columns and per group of 32 inputs, 320 bytes (Q4_1) or 288 (Q4_0):
//   256 bytes: four 64-byte vectors j = 0..3, each [16 columns][4 bytes]; byte i of column c holds input
//              8 j + i in its low nibble and input 8 j + 4 + i in its high nibble;
//   32 bytes:  d of the 16 columns (IEEE half floats); Q4_1 only, 32 bytes: m of the 16 columns. A Q4_0 weight's
//              m = -8 d is computed instead of read: in floats -8 times d is exact, so it is the same bits as
//              the half float -8 d that a stored m would hold, for 10% fewer bytes per token.
// A block's groups follow each other, so one thread streams each block's bytes in order.
//
// Q8_0 blocks (32 weights as w = d * q, q in -127..127) take the same kernel as 8-bit unsigned weights u = q + 128
// with m = -128 d, computed like Q4_0's: vpdpbusd multiplies unsigned by signed bytes, and m * psum = -128 d psum
// is exact in floats (an 11-bit d times an integer of at most 12 bits), so the fused multiply-add rounds
// d * (sum u p - 128 psum) = d * sum q p once, as if the signed sum had been taken first. Packed per 16 columns
// and 32 inputs, 544 bytes: eight 64-byte vectors v = 0..7, each [16 columns][4 bytes], byte i of column c being
// u of input 4 v + i; then the 16 columns' d. Vector 2 j and 2 j + 1 meet the activations the nibbles of 4-bit
// vector j meet (inputs 8 j .. 8 j + 3 and 8 j + 4 .. 8 j + 7), so the tiles below differ in how they get those
// bytes only.
//
// Q6_K blocks (256 weights of a column: w = d * sc_s * (q - 32), q in 0..63, an int8 scale sc_s per 16 weights and
// one half-float d per 256) keep their 6 bits: per 16 columns and 32 inputs, 416 bytes: the low 4 bits of q as the
// 4-bit layout's 256 bytes, then 128 bytes of high bits (two 64-byte vectors, [16 columns][4 bytes]: byte i of
// column c of vector t holds the 2 high bits of inputs 16 t + i, 16 t + 4 + i, 16 t + 8 + i and 16 t + 12 + i, from
// its low bits up, the high bits of the nibbles vectors 2 t and 2 t + 1 meet), then the two sub-blocks' scales
// (16 int8 for inputs 0-15, 16 for 16-31); after every 8 groups the 16 columns' d (32 bytes): 3,360 bytes per 16
// columns and 256 inputs, the file's 0.82 bytes per weight. Per sub-block s the exact integer
// T = sc_s * (sum q p - 32 sum p) (the activations' sums over 16 inputs come with them: Q4Rows::half_sum), then
// per row, in order: inner = fma(a_g, T_s, inner) per sub-block, and per 256 inputs acc = fma(d, inner, acc).
//
// Q5_0 blocks (32 weights as w = d (q - 16), q in 0..31) take the 4-bit layout's nibbles plus a plane of fifth bits,
// with m = -16 d (computed like Q4_0's: exact in floats): per 16 columns and 32 inputs, 352 bytes (the file's 5.5
// bits a weight): the 256 bytes of nibbles, then 64 bytes ([16 columns][4 bytes]: byte i of column c holds the
// fifth bits of inputs 8 j + i at bit 2 j and 8 j + 4 + i at bit 2 j + 1, for j = 0..3: those of nibble vector j),
// then the 16 columns' d.
//
// Q4_K blocks (256 weights of a column: half-float d and dmin, and per 32 weights a 6-bit scale sc and min mn: w =
// d sc q - dmin mn, q in 0..15) are Q4_1 blocks with d' = d sc and m' = -dmin mn, both exact float products (an
// 11-bit d times a 6-bit integer), computed as the tile needs them: the same float steps as Q4_1's on the file's own
// weights. Per 16 columns and 256 inputs, 2,368 bytes (4.625 bits a weight, the file's 4.5): per group the 4-bit
// layout's 256 bytes, then the 16 columns' sc and their mn (uint8); after 8 groups the 16 columns' d, then dmin.
// Its format id kQ4K stands where the others' bit widths do.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gemm.h"
#include "lanes.h"

namespace paradecode {

constexpr int64_t kQ4Group = 32;        // inputs per block of the checkpoint (and per activation scale)
constexpr int64_t kQ4GroupBytes = 320;  // packed bytes per 16 columns x 32 inputs with m (Q4_1)
constexpr int64_t kQ4GroupBytesNoM = 288;  // without m (Q4_0: m = -8 d)
constexpr int64_t kQ8GroupBytes = 544;     // 8-bit weights (Q8_0: m = -128 d, not stored)
constexpr int64_t kQ5GroupBytes = 352;     // 5-bit weights (Q5_0: m = -16 d, not stored)
constexpr int64_t kQ6GroupBytes = 416;     // 6-bit weights (Q6_K) per group, and per 8 groups their d:
constexpr int64_t kQ6SuperBytes = 8 * kQ6GroupBytes + 32;  // 3,360 bytes per 256 inputs,
constexpr int64_t kQ6MeanGroupBytes = kQ6SuperBytes / 8;   // 420 on average per group (PackedQ4::group_bytes)
constexpr int kQ4K = 14;                     // Q4_K's format id (4-bit weights, scale and min per 32), not a width
constexpr int64_t kQ4KGroupBytes = 288;      // per group: nibbles, the 16 columns' sc, their mn
constexpr int64_t kQ4KSuperBytes = 8 * kQ4KGroupBytes + 64;  // and per 256 inputs d and dmin: 2,368 bytes,
constexpr int64_t kQ4KMeanGroupBytes = kQ4KSuperBytes / 8;   // 296 on average per group
// With several rows, ask for the weights this far ahead (~4 KiB per block). One row reads faster without: its
// multiply-adds keep up with the memory, and the requests only compete with the prefetchers' own. AMD EPYC Zen 4,
// 2 threads, the forms alternating pass by pass in one process (greedy, 256-token context, medians of the per-pass
// ratios): SmolLM2-135M q4 T=1 0.963x (61 passes), a synthetic Llama-3.2-1B q4 T=1 0.883x and 0.941x (21 passes,
// two runs), GEMM stage 12.6 -> 10.9 ms; at T=2 and T=3 without it 0.98x on 135M but 1.01x and 1.06-1.07x at 1B,
// so several rows keep it.
constexpr int64_t kQ4PrefetchGroups = 12;

struct PackedQ4 {
  const uint8_t* data;  // [blocks][groups][group_bytes]
  int64_t n, k, groups, blocks;
  int64_t group_bytes = kQ4GroupBytes;  // kQ4GroupBytes, kQ4GroupBytesNoM where m = -8 d is not stored,
                                       // kQ8GroupBytes for 8-bit weights, kQ6MeanGroupBytes for 6-bit ones or
                                       // kQ4KMeanGroupBytes for Q4_K
  bool has_m() const { return group_bytes == kQ4GroupBytes; }  // 4 bits (Q4_0 / Q4_1): whether m is stored
  int bits() const {  // 4, 5, 6, 8 or kQ4K
    return group_bytes == kQ8GroupBytes        ? 8
           : group_bytes == kQ5GroupBytes      ? 5
           : group_bytes == kQ6MeanGroupBytes  ? 6
           : group_bytes == kQ4KMeanGroupBytes ? kQ4K
                                               : 4;
  }
};

// Bytes per 16 columns and 32 inputs of a weight with `bits` bits (4: with or without m; 5 and 8: never m; 6 and
// kQ4K: on average).
constexpr int64_t q4_group_bytes(bool with_m, int bits = 4) {
  return bits == 8      ? kQ8GroupBytes
         : bits == 5    ? kQ5GroupBytes
         : bits == 6    ? kQ6MeanGroupBytes
         : bits == kQ4K ? kQ4KMeanGroupBytes
         : with_m       ? kQ4GroupBytes
                        : kQ4GroupBytesNoM;
}

// Where group g of a column block starts within it.
template <int Bits>
inline int64_t q_group_offset(int64_t g, int64_t group_bytes) {
  if constexpr (Bits == 6) return (g >> 3) * kQ6SuperBytes + (g & 7) * kQ6GroupBytes;
  if constexpr (Bits == kQ4K) return (g >> 3) * kQ4KSuperBytes + (g & 7) * kQ4KGroupBytes;
  return g * group_bytes;
}

inline int64_t q4_packed_bytes(int64_t n, int64_t k, bool with_m = true, int bits = 4) {
  return (n + kBlockCols - 1) / kBlockCols * (k / kQ4Group) * q4_group_bytes(with_m, bits);
}

// Where a packed group's 16 d values start, and m's multiple of d where m is not stored (-8 for 4 bits, -128 for 8).
template <int Bits>
constexpr int64_t kScalesAt = Bits == 8 ? 512 : Bits == 5 ? 320 : 256;
template <int Bits>
constexpr float kImpliedM = Bits == 8 ? -128.f : Bits == 5 ? -16.f : -8.f;

// The activations of one row, quantized per group: p (int8, k values), a (float per group), psum (per group: an
// integer of at most 32 * 127, held as the float it converts to exactly, so the kernel broadcasts it as it is).
struct Q4Rows {
  const int8_t* p;
  const float* scale;
  const float* sum;
  int64_t p_stride, group_stride;  // bytes between rows of p; entries between rows of scale / sum
  const int32_t* half_sum = nullptr;  // 6-bit weights only: per group the sums of p over inputs 0-15 and 16-31
                                      // (2 * group_stride entries between rows)
  Q4Rows from(int64_t r) const {  // the rows from row r on
    return {p + r * p_stride, scale + r * group_stride, sum + r * group_stride, p_stride, group_stride,
            half_sum ? half_sum + 2 * r * group_stride : nullptr};
  }
};

// The activations that meet nibble vector j of group g: inputs 8j..8j+3 (low nibbles) and 8j+4..8j+7 (high).
inline void q4_quads(const Q4Rows& x, int64_t r, int64_t g, int j, int32_t& low, int32_t& high) {
  const int8_t* p = x.p + r * x.p_stride + g * kQ4Group + 8 * j;
  std::memcpy(&low, p, 4);
  std::memcpy(&high, p + 4, 4);
}

// One group of 32 activations quantized as lanes.h's quantize_row and to_int8 do it (a = max(max |x|, 1e-12),
// p = x * (127 / a) rounded half to even, then converted), writing p and returning a / 127 and the sum of p as
// `scale` and `sum`: the same operations on the same values, so the same bits. With AVX-512 the group is two
// registers and each reduction one instruction sequence, where the row functions' per-call lane loops cost more
// than the group's arithmetic.
inline void q4_quantize_group(const float* x, int8_t* p, float& scale, float& sum, int32_t* halves = nullptr) {
#if defined(__AVX512F__)
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const float amax = max_of(_mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1))), 1e-12f);
  const __m512 inv = _mm512_set1_ps(127.f / amax), round = _mm512_set1_ps(kRound);
  const __m512i q0 = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x0, inv), round), round));
  const __m512i q1 = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x1, inv), round), round));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16), _mm512_cvtepi32_epi8(q1));
  sum = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  scale = amax / 127.f;
  if (halves) {
    halves[0] = _mm512_reduce_add_epi32(q0);
    halves[1] = _mm512_reduce_add_epi32(q1);
  }
#else
  float qf[kQ4Group];
  scale = quantize_row(x, qf, kQ4Group) / 127.f;
  sum = static_cast<float>(to_int8(qf, p, kQ4Group));
  if (halves) {
    halves[0] = halves[1] = 0;
    for (int i = 0; i < kQ4Group; ++i) halves[i / 16] += p[i];
  }
#endif
}

inline void q4_finish_scalar(float d, float m, int32_t qsum, float a, float psum, float& acc) {
  acc = mul_add(a, mul_add(d, static_cast<float>(qsum), m * psum), acc);
}

// Where a Q4_K column block's group g keeps its sc and mn (16 bytes each), and its 256 inputs' d and dmin (16 half
// floats each).
inline const uint8_t* q4k_group(const uint8_t* block, int64_t g) {
  return block + (g >> 3) * kQ4KSuperBytes + (g & 7) * kQ4KGroupBytes;
}
inline const uint8_t* q4k_super_scales(const uint8_t* block, int64_t g) {
  return block + (g >> 3) * kQ4KSuperBytes + 8 * kQ4KGroupBytes;
}

#if defined(__AVX512F__)
// A packed group's d and m of its 16 columns (`scales`: the group's bytes from kScalesAt); m = implied_m * d
// without a stored m.
__attribute__((always_inline)) inline void q4_scales(const uint8_t* scales, bool has_m, float implied_m, __m512& d,
                                                     __m512& m) {
  d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
  m = has_m ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32)))
            : _mm512_mul_ps(d, _mm512_set1_ps(implied_m));
}

// Q4_K: d' = d sc and m' = dmin (-mn) of group g's 16 columns in a column block (exact products).
__attribute__((always_inline)) inline void q4k_scales(const uint8_t* block, int64_t g, __m512& d, __m512& m) {
  const uint8_t* group = q4k_group(block, g) + 256;
  const uint8_t* super = q4k_super_scales(block, g);
  const auto bytes = [](const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  };
  d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super))), bytes(group));
  m = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 32))),
                    _mm512_sub_ps(_mm512_setzero_ps(), bytes(group + 16)));
}

// q4_finish_scalar on 16 columns: out += a * (d * qsum + m * psum), in that order (every kernel's float step).
__attribute__((always_inline)) inline void q4_finish(__m512 d, __m512 m, __m512i qsum, __m512 a, __m512 psum,
                                                     float* out) {
  const __m512 term = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(qsum), _mm512_mul_ps(m, psum));
  _mm512_storeu_ps(out, _mm512_fmadd_ps(a, term, _mm512_loadu_ps(out)));
}
#endif

// MR rows x NB blocks, group g: the float sums `acc` ([MR][NB][16], read and written back) take the group's terms
// (6 bits: the sub-blocks' a_g * T_s, which q4_blocks multiplies by d per 256 inputs).
// Bits: 4 (the nibbles of Q4_0 / Q4_1), 8 (Q8_0's bytes plus 128) or 6 (Q6_K's q). Always inlined into the
// one- and two-row stream (q4_blocks): GCC 12 left it a call per group there. AMD EPYC Zen 4, 2 threads, the two
// forms alternating in one program (two runs, medians of 31-301 ratios): with the call one row of 4-bit blocks took
// 1.18-1.28x the time on 21 MB of weights (held in the L3 cache) and 0.98-1.15x on 113 MB (read from memory), two
// rows 1.17-1.35x and 1.02-1.27x; 8-bit blocks alike within 3%. Taller tiles keep the call: inlined, 3 rows took
// 1.02-1.07x and 8 rows 1.00-1.07x their time.
template <int MR, int NB, int Bits = 4>
__attribute__((always_inline)) inline void q4_tile_inlined(const PackedQ4& w, int64_t b0, int64_t g, const Q4Rows& x,
                                                           float* acc) {
  static_assert(Bits == 4 || Bits == 5 || Bits == 8 || Bits == 6 || Bits == kQ4K, "4- to 8-bit weights, or Q4_K");
  const int64_t block_stride = w.groups * w.group_bytes;
  const uint8_t* base = w.data + b0 * block_stride + q_group_offset<Bits>(g, w.group_bytes);
  const bool has_m = Bits == 4 && w.has_m();
  // 6 bits: sub-block s's scales and each row's a and activation sum over the sub-block's 16 inputs
  auto q6_scale_at = [&](int64_t b, int s) { return base + b * block_stride + 384 + 16 * s; };
  auto q6_row = [&](int64_t r, int s, float& a, int32_t& offset) {
    a = x.scale[r * x.group_stride + g];
    offset = 32 * x.half_sum[2 * (r * x.group_stride + g) + s];
  };
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  __m512i sums[MR][NB];
  unroll<MR>([&](auto r) { unroll<NB>([&](auto b) { sums[r][b] = _mm512_setzero_si512(); }); });
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int j = 0; j < 4; ++j) {
    __m512i lo[NB], hi[NB];
    unroll<NB>([&](auto b) {
      if constexpr (Bits == 8) {
        lo[b] = _mm512_loadu_si512(base + b * block_stride + 2 * j * 64);
        hi[b] = _mm512_loadu_si512(base + b * block_stride + (2 * j + 1) * 64);
      } else {
        const __m512i v = _mm512_loadu_si512(base + b * block_stride + j * 64);
        lo[b] = _mm512_and_si512(v, low);
        hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        if constexpr (Bits == 6) {  // the 2 high bits, moved to bits 4-5 of each byte
          const __m512i h = _mm512_loadu_si512(base + b * block_stride + 256 + (j >> 1) * 64);
          const __m512i top = _mm512_set1_epi8(0x30);
          const __m512i h_lo = (j & 1) ? h : _mm512_slli_epi16(h, 4);
          const __m512i h_hi = (j & 1) ? _mm512_srli_epi16(h, 2) : _mm512_slli_epi16(h, 2);
          lo[b] = _mm512_or_si512(lo[b], _mm512_and_si512(h_lo, top));
          hi[b] = _mm512_or_si512(hi[b], _mm512_and_si512(h_hi, top));
        }
        if constexpr (Bits == 5) {  // the fifth bits (2 j and 2 j + 1 of each byte), moved to bit 4
          const __m512i h = _mm512_loadu_si512(base + b * block_stride + 256);
          const __m512i fifth = _mm512_set1_epi8(0x10);
          const auto to_bit_4 = [&](int bit) {  // within each byte: 16-bit shifts move no bit 4 across bytes
            return bit <= 4 ? _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - bit))
                            : _mm512_srl_epi16(h, _mm_cvtsi32_si128(bit - 4));
          };
          lo[b] = _mm512_or_si512(lo[b], _mm512_and_si512(to_bit_4(2 * j), fifth));
          hi[b] = _mm512_or_si512(hi[b], _mm512_and_si512(to_bit_4(2 * j + 1), fifth));
        }
      }
    });
    unroll<MR>([&](auto r) {
      int32_t first, second;
      q4_quads(x, r, g, j, first, second);
      const __m512i a_lo = _mm512_set1_epi32(first), a_hi = _mm512_set1_epi32(second);
      unroll<NB>([&](auto b) {
        sums[r][b] = _mm512_dpbusd_epi32(sums[r][b], lo[b], a_lo);
        sums[r][b] = _mm512_dpbusd_epi32(sums[r][b], hi[b], a_hi);
      });
    });
    if constexpr (Bits == 6) {
      if (j & 1) {  // a sub-block's 16 inputs are summed: acc += a * sc * (sum q p - 32 sum p)
        unroll<NB>([&](auto b) {
          const __m512i sc =
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q6_scale_at(b, j >> 1))));
          unroll<MR>([&](auto r) {
            float a;
            int32_t offset;
            q6_row(r, j >> 1, a, offset);
            const __m512i t = _mm512_mullo_epi32(sc, _mm512_sub_epi32(sums[r][b], _mm512_set1_epi32(offset)));
            float* out = acc + (r * NB + b) * kBlockCols;
            _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_set1_ps(a), _mm512_cvtepi32_ps(t), _mm512_loadu_ps(out)));
            sums[r][b] = _mm512_setzero_si512();
          });
        });
      }
    }
  }
  if constexpr (Bits != 6) unroll<NB>([&](auto b) {
    __m512 d, m;
    if constexpr (Bits == kQ4K) q4k_scales(w.data + (b0 + b) * block_stride, g, d, m);
    else q4_scales(base + b * block_stride + kScalesAt<Bits>, has_m, kImpliedM<Bits>, d, m);
    unroll<MR>([&](auto r) {
      q4_finish(d, m, sums[r][b], _mm512_set1_ps(x.scale[r * x.group_stride + g]),
                _mm512_set1_ps(x.sum[r * x.group_stride + g]), acc + (r * NB + b) * kBlockCols);
    });
  });
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256i sums[MR][2 * NB];  // two halves of 8 columns per block
  unroll<MR>([&](auto r) { unroll<2 * NB>([&](auto b) { sums[r][b] = _mm256_setzero_si256(); }); });
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  for (int j = 0; j < 4; ++j) {
    __m256i lo[2 * NB], hi[2 * NB];
    unroll<2 * NB>([&](auto b) {
      const uint8_t* at = base + (b / 2) * block_stride + (b % 2) * 32;
      if constexpr (Bits == 8) {
        lo[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 2 * j * 64));
        hi[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + (2 * j + 1) * 64));
      } else {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + j * 64));
        lo[b] = _mm256_and_si256(v, low);
        hi[b] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (Bits == 6) {  // the 2 high bits, moved to bits 4-5 of each byte
          const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 256 + (j >> 1) * 64));
          const __m256i top = _mm256_set1_epi8(0x30);
          const __m256i h_lo = (j & 1) ? h : _mm256_slli_epi16(h, 4);
          const __m256i h_hi = (j & 1) ? _mm256_srli_epi16(h, 2) : _mm256_slli_epi16(h, 2);
          lo[b] = _mm256_or_si256(lo[b], _mm256_and_si256(h_lo, top));
          hi[b] = _mm256_or_si256(hi[b], _mm256_and_si256(h_hi, top));
        }
        if constexpr (Bits == 5) {  // the fifth bits (2 j and 2 j + 1 of each byte), moved to bit 4
          const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 256));
          const __m256i fifth = _mm256_set1_epi8(0x10);
          const auto to_bit_4 = [&](int bit) {
            return bit <= 4 ? _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - bit))
                            : _mm256_srl_epi16(h, _mm_cvtsi32_si128(bit - 4));
          };
          lo[b] = _mm256_or_si256(lo[b], _mm256_and_si256(to_bit_4(2 * j), fifth));
          hi[b] = _mm256_or_si256(hi[b], _mm256_and_si256(to_bit_4(2 * j + 1), fifth));
        }
      }
    });
    unroll<MR>([&](auto r) {
      int32_t first, second;
      q4_quads(x, r, g, j, first, second);
      const __m256i a_lo = _mm256_set1_epi32(first), a_hi = _mm256_set1_epi32(second);
      unroll<2 * NB>([&](auto b) {
        if constexpr (Bits == 8) {  // u = 16 h + l: each nibble's byte pairs stay within int16 (2 * 15 * 127)
          const auto part = [&](__m256i u, __m256i a) {
            const __m256i l = _mm256_maddubs_epi16(_mm256_and_si256(u, low), a);
            const __m256i h = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u, 4), low), a);
            return _mm256_add_epi32(_mm256_madd_epi16(l, ones), _mm256_madd_epi16(h, sixteen));
          };
          sums[r][b] = _mm256_add_epi32(sums[r][b], _mm256_add_epi32(part(lo[b], a_lo), part(hi[b], a_hi)));
        } else {  // the four products of a lane stay within int16: 4 * 15 * 127, 4 * 31 * 127 or 4 * 63 * 127
          const __m256i pairs =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo[b], a_lo), _mm256_maddubs_epi16(hi[b], a_hi));
          sums[r][b] = _mm256_add_epi32(sums[r][b], _mm256_madd_epi16(pairs, ones));
        }
      });
    });
    if constexpr (Bits == 6) {
      if (j & 1) {  // a sub-block's 16 inputs are summed: acc += a * sc * (sum q p - 32 sum p)
        unroll<2 * NB>([&](auto b) {
          const __m256i sc = _mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q6_scale_at(b / 2, j >> 1) + (b % 2) * 8)));
          unroll<MR>([&](auto r) {
            float a;
            int32_t offset;
            q6_row(r, j >> 1, a, offset);
            const __m256i t = _mm256_mullo_epi32(sc, _mm256_sub_epi32(sums[r][b], _mm256_set1_epi32(offset)));
            float* out = acc + (r * NB) * kBlockCols + b * 8;
            _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_set1_ps(a), _mm256_cvtepi32_ps(t), _mm256_loadu_ps(out)));
            sums[r][b] = _mm256_setzero_si256();
          });
        });
      }
    }
  }
  if constexpr (Bits != 6) unroll<2 * NB>([&](auto b) {
    __m256 d, m;
    const auto halves = [](const uint8_t* p) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    };
    if constexpr (Bits == kQ4K) {  // d sc and dmin (-mn), exact products
      const uint8_t* block = w.data + (b0 + b / 2) * block_stride;
      const uint8_t* group = q4k_group(block, g) + 256 + (b % 2) * 8;
      const uint8_t* super = q4k_super_scales(block, g) + (b % 2) * 16;
      const auto bytes = [](const uint8_t* p) {
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
      };
      d = _mm256_mul_ps(halves(super), bytes(group));
      m = _mm256_mul_ps(halves(super + 32), _mm256_sub_ps(_mm256_setzero_ps(), bytes(group + 16)));
    } else {
      const uint8_t* scales = base + (b / 2) * block_stride + kScalesAt<Bits> + (b % 2) * 16;
      d = halves(scales);
      m = has_m ? halves(scales + 32) : _mm256_mul_ps(d, _mm256_set1_ps(kImpliedM<Bits>));
    }
    unroll<MR>([&](auto r) {
      const __m256 a = _mm256_set1_ps(x.scale[r * x.group_stride + g]);
      const __m256 psum = _mm256_set1_ps(x.sum[r * x.group_stride + g]);
      const __m256 term = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums[r][b]), _mm256_mul_ps(m, psum));
      float* out = acc + (r * NB) * kBlockCols + b * 8;
      _mm256_storeu_ps(out, _mm256_fmadd_ps(a, term, _mm256_loadu_ps(out)));
    });
  });
#else
  for (int64_t r = 0; r < MR; ++r) {
    const int8_t* p = x.p + r * x.p_stride + g * kQ4Group;
    const float a = x.scale[r * x.group_stride + g];
    const float psum = x.sum[r * x.group_stride + g];
    for (int64_t b = 0; b < NB; ++b) {
      const uint8_t* block = base + b * block_stride;
      if constexpr (Bits == 6) {
        for (int64_t c = 0; c < kBlockCols; ++c)
          for (int s = 0; s < 2; ++s) {  // sub-block s: inputs 16 s .. 16 s + 15, vectors j = 2 s and 2 s + 1
            int32_t qsum = 0;
            for (int j = 2 * s; j < 2 * s + 2; ++j)
              for (int i = 0; i < 4; ++i) {
                const uint8_t byte = block[j * 64 + c * 4 + i], h = block[256 + s * 64 + c * 4 + i];
                const int shift = (j & 1) ? 4 : 0;  // bits 0-3 of h for vector 2 s, 4-7 for 2 s + 1
                qsum += ((byte & 0x0f) | (((h >> shift) & 3) << 4)) * p[8 * j + i] +
                        ((byte >> 4) | (((h >> (shift + 2)) & 3) << 4)) * p[8 * j + 4 + i];
              }
            float a6;
            int32_t offset;
            q6_row(r, s, a6, offset);
            const int32_t t = static_cast<int8_t>(block[384 + 16 * s + c]) * (qsum - offset);
            float& out = acc[(r * NB + b) * kBlockCols + c];
            out = mul_add(a6, static_cast<float>(t), out);
          }
        continue;
      }
      for (int64_t c = 0; c < kBlockCols; ++c) {
        int32_t qsum = 0;
        for (int j = 0; j < 4; ++j)
          for (int i = 0; i < 4; ++i) {
            if constexpr (Bits == 8) {
              qsum += block[2 * j * 64 + c * 4 + i] * p[8 * j + i] +
                      block[(2 * j + 1) * 64 + c * 4 + i] * p[8 * j + 4 + i];
            } else {
              const uint8_t byte = block[j * 64 + c * 4 + i];
              const int fifth = Bits == 5 ? block[256 + c * 4 + i] >> (2 * j) : 0;  // Q5_0's fifth bits
              qsum += ((byte & 0x0f) | ((fifth & 1) << 4)) * p[8 * j + i] +
                      ((byte >> 4) | ((fifth & 2) << 3)) * p[8 * j + 4 + i];
            }
          }
        half dh, mh;
        float d, m;
        if constexpr (Bits == kQ4K) {  // d sc and dmin (-mn), exact products
          const uint8_t* whole = w.data + (b0 + b) * block_stride;
          std::memcpy(&dh, q4k_super_scales(whole, g) + 2 * c, 2);
          std::memcpy(&mh, q4k_super_scales(whole, g) + 32 + 2 * c, 2);
          d = from_half(dh) * static_cast<float>(q4k_group(whole, g)[256 + c]);
          m = from_half(mh) * -static_cast<float>(q4k_group(whole, g)[272 + c]);
        } else {
          std::memcpy(&dh, block + kScalesAt<Bits> + 2 * c, 2);
          if (has_m) std::memcpy(&mh, block + 288 + 2 * c, 2);
          d = from_half(dh);
          m = has_m ? from_half(mh) : kImpliedM<Bits> * from_half(dh);
        }
        q4_finish_scalar(d, m, qsum, a, psum, acc[(r * NB + b) * kBlockCols + c]);
      }
    }
  }
#endif
}

template <int MR, int NB, int Bits>
__attribute__((noinline)) void q4_tile_called(const PackedQ4& w, int64_t b0, int64_t g, const Q4Rows& x, float* acc) {
  q4_tile_inlined<MR, NB, Bits>(w, b0, g, x, acc);
}

template <int MR, int NB, int Bits = 4>
inline void q4_tile(const PackedQ4& w, int64_t b0, int64_t g, const Q4Rows& x, float* acc) {
  if constexpr (MR * NB <= 2) q4_tile_inlined<MR, NB, Bits>(w, b0, g, x, acc);
  else q4_tile_called<MR, NB, Bits>(w, b0, g, x, acc);
}

// NB blocks from b0 for `rows` rows (<= kMaxTileRows): y[r * y_stride + c] for the tile's 16 * NB columns.
template <int MR, int NB, int Bits = 4>
inline void q4_blocks(const PackedQ4& w, int64_t b0, const Q4Rows& x, int64_t rows, float* y, int64_t y_stride) {
  alignas(64) float acc[kMaxTileRows * NB * kBlockCols];
  std::fill(acc, acc + rows * NB * kBlockCols, 0.f);
  // 6 bits: the tiles sum a_g * T_s into `inner`, which each 256 inputs' d multiplies into acc
  alignas(64) float inner[Bits == 6 ? kMaxTileRows * NB * kBlockCols : 1];
  if constexpr (Bits == 6) std::fill(inner, inner + rows * NB * kBlockCols, 0.f);
  float* sums = Bits == 6 ? inner : acc;
  const int64_t block_stride = w.groups * w.group_bytes;
  // Several rows: one block at a time is one sequential stream, asked for as far ahead as four blocks' worth of
  // requests reach. One row is left to the hardware's prefetchers (kQ4PrefetchGroups).
  constexpr int64_t ahead_groups = kQ4PrefetchGroups * (NB == 1 ? 4 : 1);
  for (int64_t g = 0; g < w.groups; ++g) {
    if (rows > 1) {  // past the end: the next tile's weights, which this thread reads next
      const uint8_t* ahead = w.data + (b0 * w.groups + g + ahead_groups) * w.group_bytes;
      for (int b = 0; b < NB; ++b)
        for (int64_t off = 0; off < w.group_bytes; off += 64) __builtin_prefetch(ahead + b * block_stride + off, 0, 2);
    }
    row_tiles<MR>(rows, [&](auto mr, int64_t r) {
      q4_tile<decltype(mr)::value, NB, Bits>(w, b0, g, x.from(r), sums + r * NB * kBlockCols);
    });
    if constexpr (Bits == 6) {
      if ((g & 7) == 7) {  // acc += d * inner per column, rows in order; inner starts again
        for (int b = 0; b < NB; ++b) {
          const uint8_t* d = w.data + (b0 + b) * block_stride + (g >> 3) * kQ6SuperBytes + 8 * kQ6GroupBytes;
          float dc[kBlockCols];
          for (int c = 0; c < kBlockCols; ++c) {
            half h;
            std::memcpy(&h, d + 2 * c, 2);
            dc[c] = from_half(h);
          }
          for (int64_t r = 0; r < rows; ++r) {
            float* a = acc + (r * NB + b) * kBlockCols;
            float* in = inner + (r * NB + b) * kBlockCols;
            each(kBlockCols,
                 [&](int64_t c, auto z) { st(a + c, mul_add(ld(dc + c, z), ld(in + c, z), ld(a + c, z))); });
            std::fill(in, in + kBlockCols, 0.f);
          }
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    std::copy(acc + r * NB * kBlockCols, acc + (r + 1) * NB * kBlockCols, y + r * y_stride);
}

template <int MR, int NB, int Bits = 4>
inline void q4_range(const PackedQ4& w, const Q4Rows& x, int64_t rows, float* y, int64_t y_stride, int64_t b0,
                     int64_t b1, float* spill) {
  for_blocks<NB>(w.n, rows, y, y_stride, b0, b1, spill, [&](auto nb, int64_t b, float* out, int64_t stride) {
    q4_blocks<MR, decltype(nb)::value, Bits>(w, b, x, rows, out, stride);
  });
}

// Tile shapes: one row streams 4 blocks, more rows take 4 x 4 with AVX-512 (16 sums + 8 nibble vectors), 2 x 2
// blocks on 256-bit code. One row on 8 blocks at once (8 streams, 30-140 KB apart at 1B-8B) read 10-20% slower
// than on 4 with the weights asked for ahead (AMD EPYC Zen 4, a 2-thread microbenchmark of 3B and 8B layers;
// equal at 0.5B, faster at 135M and 1B), and a one-token pass came out slower than a two-token one at 3B and 8B.
// Rows left over after the 4-row tiles are one tile of their height (row_tiles), on SmolLM2-135M's shapes
// with 2 threads: 2 rows took 0.58-0.67x the time of one row after the other, and 3 and 7 rows 0.70-0.87x the
// time of their rest as 2 + 1 (benchmarks/q4_kernel.py prints the kernel's rate per row count). Taller tiles
// were slower: 8 x 2 blocks 1.46x and 6 x 2 1.06x the 4 x 4 at 8 rows. At 4 x 4 the float part of each group (a conversion, a multiply and
// two fused multiply-adds per row and block, beside 8 vpdpbusd) shares the two vector multiply pipes of a Zen 4
// core with vpdpbusd, which bounds this format near 47 multiply-adds a cycle per core; 64 rows ran at ~300 GMAC/s
// on two cores, so a verify pass of 8 rows is compute-bound here, not weight-bound.
//
// One row has two forms, picked per pass-size bucket by the kernel choice at load ("own" and "interleaved"): one
// block after the other, one sequential stream (nothing asked ahead: kQ4PrefetchGroups), or 4 blocks at once.
// Up to kQ4StreamRows rows take the stream too: a verify pass of 2 rows reads as many bytes as one row and, with
// AVX-512 VNNI, is still bound by the read. Forward passes, the stream and the 4 x 4 tiles alternating pass by
// pass in one process, medians of the per-pass ratios (AMD EPYC Zen 4, 2 threads, after 256 tokens): SmolLM2-135M
// T=2 0.91x, T=4 1.01x (61 passes); a synthetic Llama-3.2-1B T=2 0.94x and 0.99x, T=4 1.12x (15-21 passes, two
// runs). 3 rows took the stream too until their tile became the stream's only called one (q4_tile_inlined): then
// the tiles were faster, T=3 0.948x (135M, 61 passes) and 0.898x (1B, 21 passes) the stream's time, with T=2
// still 1.075x / 1.020x on the tiles. 256-bit code keeps its tiles there (unmeasured: without VNNI 2 rows cost
// 1.3x one).
// SmolLM2-135M q4 on an AMD EPYC Zen 4 (T=1 forward, the forms alternating pass by pass, median of 101 per-pass
// ratios, three runs): the stream 0.94-0.97x; a synthetic Llama-3.2-1B (21 passes, two runs): 1.03-1.06x.
#if defined(__AVX512F__)
constexpr int kQ4OneRowBlocks = 4, kQ4StreamRows = 2, kQ4TileRows = 4, kQ4TileBlocks = 4;
#elif defined(__AVX2__)
constexpr int kQ4OneRowBlocks = 2, kQ4StreamRows = 1, kQ4TileRows = 2, kQ4TileBlocks = 2;
#else
constexpr int kQ4OneRowBlocks = 1, kQ4StreamRows = 1, kQ4TileRows = 1, kQ4TileBlocks = 1;
#endif

// Blocks per piece when a pass's column blocks are shared out over threads: what q4_gemm's tile shapes take at once.
inline int64_t q4_tile_blocks() { return std::max(kQ4TileBlocks, kQ4OneRowBlocks); }

// The columns of blocks [b0, b1) for rows [0, rows): y[r * y_stride + col] for col < n (a partial last block
// goes through `spill`, 16 * kMaxTileRows floats).
template <int Bits>
inline void q4_gemm_bits(const PackedQ4& w, const Q4Rows& x, int64_t rows, float* y, int64_t y_stride, int64_t b0,
                         int64_t b1, float* spill, bool interleaved) {
  if (rows == 1 && interleaved) return q4_range<1, kQ4OneRowBlocks, Bits>(w, x, 1, y, y_stride, b0, b1, spill);
  if (rows <= kQ4StreamRows) return q4_range<kQ4StreamRows, 1, Bits>(w, x, rows, y, y_stride, b0, b1, spill);
  for (int64_t first = 0; first < rows; first += kMaxTileRows) {
    const int64_t n_rows = std::min<int64_t>(kMaxTileRows, rows - first);
    q4_range<kQ4TileRows, kQ4TileBlocks, Bits>(w, x.from(first), n_rows, y + first * y_stride, y_stride, b0, b1,
                                               spill);
  }
}

inline void q4_gemm(const PackedQ4& w, const Q4Rows& x, int64_t rows, float* y, int64_t y_stride, int64_t b0,
                    int64_t b1, float* spill, bool interleaved = false) {
  if (w.bits() == 8) return q4_gemm_bits<8>(w, x, rows, y, y_stride, b0, b1, spill, interleaved);
  if (w.bits() == 5) return q4_gemm_bits<5>(w, x, rows, y, y_stride, b0, b1, spill, interleaved);
  if (w.bits() == 6) return q4_gemm_bits<6>(w, x, rows, y, y_stride, b0, b1, spill, interleaved);
  if (w.bits() == kQ4K) return q4_gemm_bits<kQ4K>(w, x, rows, y, y_stride, b0, b1, spill, interleaved);
  q4_gemm_bits<4>(w, x, rows, y, y_stride, b0, b1, spill, interleaved);
}

}  // namespace paradecode
