// Vector arithmetic for the native forward: 16-lane values and the row primitives built on them.
//
// Every helper computes the same bits whether a loop runs in its 16-lane body or its scalar tail, so a row's
// result never depends on where the row starts in memory or how many rows share a pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace paradecode {

// 16 floats in one value. Lane-wise + - * / are the same IEEE operations as on scalars, and -ffp-contract=off
// keeps the compiler from fusing them, so a vector body and its scalar tail compute identical bits.
//
// With AVX-512 (or no AVX at all) a vf is one GCC vector of 64 bytes. On AVX/AVX2 it is a pair of 8-lane vectors
// (lo: lanes 0-7, hi: 8-15; the same 64 bytes in the same order): GCC 12 keeps a 64-byte vector that the target
// has no register for in memory between uses, so on an AVX2-only CPU every loop-carried sum went through the stack
// and general registers (a movq/vpinsrq shuffle per lane pair around each packed FMA; attention on an AMD EPYC
// Zen 3 ran ~10x slower than its multiply-adds allow). A pair of 32-byte vectors stays in two ymm registers.
// tests/test_native_isa.py checks the hot loops' code for such stack traffic.
#if defined(__AVX__) && !defined(__AVX512F__)
#define PARADECODE_LANE_PAIRS 1
typedef float v8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t v8i __attribute__((vector_size(32), aligned(4), may_alias));
struct vf {
  v8 lo, hi;
};
struct vi {
  v8i lo, hi;
};
inline vf operator+(vf a, vf b) { return {a.lo + b.lo, a.hi + b.hi}; }
inline vf operator-(vf a, vf b) { return {a.lo - b.lo, a.hi - b.hi}; }
inline vf operator*(vf a, vf b) { return {a.lo * b.lo, a.hi * b.hi}; }
inline vf operator/(vf a, vf b) { return {a.lo / b.lo, a.hi / b.hi}; }
inline vf operator+(vf a, float b) { return {a.lo + b, a.hi + b}; }
inline vf operator-(vf a, float b) { return {a.lo - b, a.hi - b}; }
inline vf operator*(vf a, float b) { return {a.lo * b, a.hi * b}; }
inline vf operator/(vf a, float b) { return {a.lo / b, a.hi / b}; }
inline vf operator+(float a, vf b) { return {a + b.lo, a + b.hi}; }
inline vf operator-(float a, vf b) { return {a - b.lo, a - b.hi}; }
inline vf operator*(float a, vf b) { return {a * b.lo, a * b.hi}; }
inline vf operator/(float a, vf b) { return {a / b.lo, a / b.hi}; }
inline vf operator-(vf a) { return {-a.lo, -a.hi}; }
inline vf& operator+=(vf& a, vf b) { return a = a + b; }
inline vi operator+(vi a, vi b) { return {a.lo + b.lo, a.hi + b.hi}; }
inline vi operator+(vi a, int32_t b) { return {a.lo + b, a.hi + b}; }
inline vi operator&(vi a, int32_t b) { return {a.lo & b, a.hi & b}; }
inline vi operator<<(vi a, int b) { return {a.lo << b, a.hi << b}; }
inline vi& operator+=(vi& a, vi b) { return a = a + b; }
inline vi bits_of(vf a) { return {(v8i)a.lo, (v8i)a.hi}; }
inline vf from_bits(vi a) { return {(v8)a.lo, (v8)a.hi}; }
inline vi to_int(vf a) {  // toward zero, as a C cast
  return {__builtin_convertvector(a.lo, v8i), __builtin_convertvector(a.hi, v8i)};
}
#else
typedef float vf __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(64), aligned(4), may_alias));
inline vi bits_of(vf a) { return (vi)a; }
inline vf from_bits(vi a) { return (vf)a; }
inline vi to_int(vf a) { return __builtin_convertvector(a, vi); }  // toward zero, as a C cast
#endif
constexpr int kLanes = 16;
static_assert(sizeof(vf) == kLanes * sizeof(float) && sizeof(vi) == kLanes * sizeof(int32_t), "16 lanes in order");

#if defined(PARADECODE_LANE_PAIRS)
inline vf load(const float* p) { return {*reinterpret_cast<const v8*>(p), *reinterpret_cast<const v8*>(p + 8)}; }
inline void store(float* p, vf v) {
  *reinterpret_cast<v8*>(p) = v.lo;
  *reinterpret_cast<v8*>(p + 8) = v.hi;
}
#else
inline vf load(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }
#endif
inline vf splat(float x) {  // x in every lane (a broadcast, where `vf{} + x` would add 0 first)
#if defined(__AVX512F__)
  return (vf)_mm512_set1_ps(x);
#elif defined(PARADECODE_LANE_PAIRS)
  const v8 s = (v8)_mm256_set1_ps(x);
  return {s, s};
#else
  return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#endif
}
inline vf ld(const float* p, vf) { return load(p); }  // ld/st pick the width from their second argument's type
inline float ld(const float* p, float) { return *p; }
inline void st(float* p, vf v) { store(p, v); }
inline void st(float* p, float v) { *p = v; }

inline float fold(vf v) {  // the 16 lanes summed pairwise, in a fixed order
  float a[kLanes];
  std::memcpy(a, &v, sizeof(a));
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) a[l] += a[l + width];
  }
  return a[0];
}

// The same formulas on a float or on 16 lanes.
// max_of(a, b) = a < b ? b : a and min_of(a, b) = b < a ? b : a, lane by lane (a NaN in b is never taken, of
// equal values a is kept). The vector forms name the packed instruction: a `?:` over 16-lane vectors became 16
// scalar compares on AVX2-only targets (tests/test_native_isa.py checks the code). maxps(x, y) is x > y ? x : y
// and minps(x, y) is x < y ? x : y, so with the operands swapped they are exactly the formulas above.
inline float max_of(float a, float b) { return a < b ? b : a; }
inline float min_of(float a, float b) { return b < a ? b : a; }
#if defined(__AVX512F__)
inline vf max_of(vf a, vf b) { return (vf)_mm512_max_ps((__m512)b, (__m512)a); }
inline vf min_of(vf a, vf b) { return (vf)_mm512_min_ps((__m512)b, (__m512)a); }
#elif defined(PARADECODE_LANE_PAIRS)
inline vf max_of(vf a, vf b) {
  return {(v8)_mm256_max_ps((__m256)b.lo, (__m256)a.lo), (v8)_mm256_max_ps((__m256)b.hi, (__m256)a.hi)};
}
inline vf min_of(vf a, vf b) {
  return {(v8)_mm256_min_ps((__m256)b.lo, (__m256)a.lo), (v8)_mm256_min_ps((__m256)b.hi, (__m256)a.hi)};
}
#else
inline vf max_of(vf a, vf b) { return a < b ? b : a; }
inline vf min_of(vf a, vf b) { return b < a ? b : a; }
#endif
inline float abs_of(float a) { return std::fabs(a); }
inline vf abs_of(vf a) { return from_bits(bits_of(a) & 0x7fffffff); }
inline float pow2(float n) {  // 2^n for an integral n in [-126, 127]
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline vf pow2(vf n) { return from_bits((to_int(n) + 127) << 23); }

// a * b + c with one rounding where the CPU has fused multiply-add, on a float and on every lane alike (IEEE
// fma is exact then rounded, whatever the vector width); two roundings everywhere without it. The vector form
// names the packed instruction explicitly: a loop of scalar fmaf calls is left to the compiler's cost model,
// which turns it into 16 scalar vfmadd231ss on some -march targets (tests/test_native_isa.py checks the code).
inline float mul_add(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
inline vf mul_add(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(PARADECODE_LANE_PAIRS) && defined(__FMA__)
  return {(v8)_mm256_fmadd_ps((__m256)a.lo, (__m256)b.lo, (__m256)c.lo),
          (v8)_mm256_fmadd_ps((__m256)a.hi, (__m256)b.hi, (__m256)c.hi)};
#elif defined(PARADECODE_LANE_PAIRS)
  return a * b + c;
#elif defined(__FMA__)
  vf r;
  for (int l = 0; l < kLanes; ++l) r[l] = __builtin_fmaf(a[l], b[l], c[l]);  // no vector FMA on this target
  return r;
#else
  return a * b + c;
#endif
}

// The KV cache holds IEEE half floats (16 bits: half the bytes a decode step reads from it). Every value is
// rounded once when stored (to nearest, ties to even) and widened exactly when read, so a row's attention reads
// the same numbers whichever pass wrote or reads them.
typedef uint16_t half;

inline half to_half(float x) {
#if defined(__F16C__)
  return static_cast<half>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return static_cast<half>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  if (magnitude >= 0x477ff000u) return static_cast<half>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (magnitude < 0x38800000u) {  // a subnormal half (or zero): round the shifted mantissa to nearest even
    const uint32_t shift = 126u - (magnitude >> 23), mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    if (shift > 24u) return static_cast<half>(sign);
    const uint32_t value = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    return static_cast<half>(sign | (value + (rest > halfway || (rest == halfway && (value & 1u)))));
  }
  magnitude -= 0x38000000u;  // rebias the exponent from 127 to 15
  const uint32_t value = magnitude >> 13, rest = magnitude & 0x1fffu;
  return static_cast<half>(sign | (value + (rest > 0x1000u || (rest == 0x1000u && (value & 1u)))));
#endif
}

inline float from_half(half h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int shift = 0;
    uint32_t m = mantissa;
    while (!(m & 0x400u)) { m <<= 1; ++shift; }
    bits = sign | ((113u - shift) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

inline vf load(const half* p) {  // 16 halves, widened
#if defined(__AVX512F__)
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(PARADECODE_LANE_PAIRS) && defined(__F16C__)
  return {(v8)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          (v8)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
#else
  float r[kLanes];
  for (int l = 0; l < kLanes; ++l) r[l] = from_half(p[l]);
  return load(r);
#endif
}

constexpr float kRound = 12582912.f;  // 1.5 * 2^23: (v + kRound) - kRound rounds v (|v| < 2^22) half to even

// e^x from plain arithmetic (Cephes' expf: x = n ln2 + r, a degree-6 polynomial for e^r, times 2^n; relative
// error ~1e-7), so that it vectorizes and rounds alike in the vector body and the scalar tail.
template <typename T>
inline T exp_approx(T x) {
  x = min_of(max_of(x, T{} + -87.0f), T{} + 88.0f);
  const T n = (x * 1.44269504088896341f + kRound) - kRound;
  T r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  T p = T{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * pow2(n);
}

// Apply f(offset, lanes) over [0, n): 16 at a time with f(k, vf), then the tail one at a time with f(k, float).
template <typename F>
inline void each(int64_t n, F&& f) {
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) f(k, vf{});
  for (; k < n; ++k) f(k, 0.f);
}

// dot(a, b): 16 partial sums by index, then the fixed fold.
inline float dot(const float* a, const float* b, int64_t n) {
  vf acc{};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) acc += load(a + k) * load(b + k);
  float tail[kLanes] = {0};
  for (int l = 0; k < n; ++k, ++l) tail[l] = a[k] * b[k];
  return fold(acc + load(tail));
}

inline float lane_sum(const float* a, int64_t n) {
  vf acc{};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) acc += load(a + k);
  float tail[kLanes] = {0};
  for (int l = 0; k < n; ++k, ++l) tail[l] = a[k];
  return fold(acc + load(tail));
}

inline float abs_max(const float* a, int64_t n) {  // exact in any order
  vf acc{};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) acc = max_of(acc, abs_of(load(a + k)));
  float top = 0.f;
  for (; k < n; ++k) top = max_of(top, abs_of(a[k]));
  float lanes[kLanes];
  std::memcpy(lanes, &acc, sizeof(lanes));
  for (float v : lanes) top = max_of(top, v);
  return top;
}

inline float max_value(const float* a, int64_t n) {  // exact in any order
  vf acc = splat(-INFINITY);
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) acc = max_of(acc, load(a + k));
  float top = -INFINITY;
  for (; k < n; ++k) top = max_of(top, a[k]);
  float lanes[kLanes];
  std::memcpy(lanes, &acc, sizeof(lanes));
  for (float v : lanes) top = max_of(top, v);
  return top;
}

// Integer-valued floats in [-127, 127] -> int8 (each conversion exact), and their sum (integers: exact in any
// order). Written 16 lanes at a time rather than left to the loop vectorizer (which did vectorize the plain loop
// for the Zen 4: 0.066 against 0.058 us per 1,536 values; this form does not depend on it).
typedef int8_t vb __attribute__((vector_size(16), aligned(1), may_alias));
inline vb narrow(vi v) {  // each lane's low byte (the values fit: no saturation or wrap-around happens)
#if defined(PARADECODE_LANE_PAIRS) && defined(__AVX2__)
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32((__m256i)v.lo, (__m256i)v.hi), 0xd8);
  return (vb)_mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
#elif defined(PARADECODE_LANE_PAIRS)
  int32_t lanes[kLanes];
  std::memcpy(lanes, &v, sizeof(lanes));
  vb r;
  for (int l = 0; l < kLanes; ++l) r[l] = static_cast<int8_t>(lanes[l]);
  return r;
#else
  return __builtin_convertvector(v, vb);
#endif
}
inline int32_t to_int8(const float* qf, int8_t* q, int64_t n) {
  vi acc{};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    const vi v = to_int(load(qf + k));
    acc += v;
    *reinterpret_cast<vb*>(q + k) = narrow(v);
  }
#if defined(__AVX512F__)
  int32_t sum = _mm512_reduce_add_epi32((__m512i)acc);
#else
  int32_t lanes[kLanes];
  std::memcpy(lanes, &acc, sizeof(lanes));
  int32_t sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
#endif
  for (; k < n; ++k) {
    const int32_t v = static_cast<int32_t>(qf[k]);
    q[k] = static_cast<int8_t>(v);
    sum += v;
  }
  return sum;
}

// The first k in [0, n) where x[k] == value, or with nan, where x[k] is a NaN; -1 if none. Compares 16 (AVX-512)
// or 8 (AVX) lanes at once and takes the lowest set bit of the mask.
inline int64_t first_index(const float* x, int64_t n, float value, bool nan) {
  int64_t k = 0;
#if defined(__AVX512F__)
  const __m512 target = _mm512_set1_ps(value);
  for (; k + 16 <= n; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    const __mmask16 hit = nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) : _mm512_cmp_ps_mask(v, target, _CMP_EQ_OQ);
    if (hit) return k + __builtin_ctz(hit);
  }
#elif defined(__AVX__)
  const __m256 target = _mm256_set1_ps(value);
  for (; k + 8 <= n; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    const int hit = _mm256_movemask_ps(nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q) : _mm256_cmp_ps(v, target, _CMP_EQ_OQ));
    if (hit) return k + __builtin_ctz(hit);
  }
#endif
  for (; k < n; ++k)
    if (nan ? x[k] != x[k] : x[k] == value) return k;
  return -1;
}

// The index of the largest of n > 0 floats: the first one where several are equal, the first NaN where there is
// one (torch.argmax's answer in every case). Two passes (the largest value, then where it first is), each a
// packed compare.
inline int64_t argmax(const float* x, int64_t n) {
  const int64_t nan = first_index(x, n, 0.f, true);
  return nan >= 0 ? nan : first_index(x, n, max_value(x, n), false);
}

// hit(k) for every k in [0, n) where value(k, z) >= limit, in order: value computes 16 lanes at once (z a vf) or
// one (z a float); the 16-lane compare is one packed instruction and a mask (NaN is never >= limit).
template <typename Value, typename Hit>
inline void for_each_at_least(int64_t n, float limit, Value&& value, Hit&& hit) {
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    const vf v = value(k, vf{});
#if defined(__AVX512F__)
    uint32_t mask = _mm512_cmp_ps_mask((__m512)v, _mm512_set1_ps(limit), _CMP_GE_OQ);
#elif defined(PARADECODE_LANE_PAIRS)
    const __m256 at = _mm256_set1_ps(limit);
    uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps((__m256)v.lo, at, _CMP_GE_OQ))) |
                    static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps((__m256)v.hi, at, _CMP_GE_OQ))) << 8;
#else
    uint32_t mask = 0;
    for (int l = 0; l < kLanes; ++l) mask |= static_cast<uint32_t>(v[l] >= limit) << l;
#endif
    for (; mask != 0; mask &= mask - 1) hit(k + __builtin_ctz(mask));
  }
  for (; k < n; ++k)
    if (value(k, 0.f) >= limit) hit(k);
}

// Quantize one row to integer values in [-127, 127] (kept as float for fbgemm); returns max |x| (the scale).
inline float quantize_row(const float* x, float* q, int64_t n) {
  const float amax = max_of(abs_max(x, n), 1e-12f);
  const float inv = 127.f / amax;
  each(n, [&](int64_t k, auto z) { st(q + k, (ld(x + k, z) * inv + kRound) - kRound); });
  return amax;
}

}  // namespace paradecode
