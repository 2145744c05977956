// One int8 projection of the native forward: per-token quantization, an exact int8 GEMM (paradecode's own, its
// AMX tile form, fbgemm's prepacked or torch._int_mm: the kernel is chosen per pass-size bucket by timing at load,
// and all of them give the same bits), dequantization into the output; and the stage clock of `paradecode profile
// --stages`.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/native/quantized/PackedParams.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gemm.h"
#include "gemm_amx.h"
#include "gemm_q4.h"
#include "gemm_q4_amx.h"
#include "lanes.h"

namespace paradecode {

// Where a forward's time goes, when asked (``set_profiling``): seconds per stage, summed over calls.
enum Stage { kNorm, kQuantize, kGemm, kDequantize, kRope, kAttention, kSilu, kHead, kStages };
const char* const kStageNames[kStages] = {"norm", "quantize", "gemm", "dequantize", "rope+kv", "attention",
                                          "silu*up", "lm head"};

struct Clock {
  bool on = false;
  double seconds[kStages] = {0};
  std::chrono::steady_clock::time_point last;
  void start() {
    if (on) last = std::chrono::steady_clock::now();
  }
  void lap(Stage stage) {  // the time since the last lap (or start) goes to `stage`
    if (!on) return;
    const auto now = std::chrono::steady_clock::now();
    seconds[stage] += std::chrono::duration<double>(now - last).count();
    last = now;
  }
};

// The GEMM kernels; a pass of T new tokens uses the one chosen for its bucket (one token, a verify width up to
// kVerifyRows, a longer pass such as a prefill).
// "interleaved" is the own kernel with a one- (and, for int8, two-) row pass reading several column blocks at once
// instead of one sequential stream (gemm.h, gemm_q4.h): which reads faster depends on the machine and the shapes.
enum Kernel { kOwn, kFbgemm, kIntMm, kAmx, kInterleaved, kKernelCount };
const char* const kKernelNames[kKernelCount] = {"own", "fbgemm", "int_mm", "amx", "interleaved"};
constexpr int64_t kVerifyRows = 16;
constexpr int64_t kDequantizeGrain = 1 << 15;  // outputs per thread's share of a dequantization, at least
// Rows per thread's share of the per-row stages (quantization, norms, RoPE, the MLP's gate): a verify pass of 8 rows
// runs them on both threads of a 2-core machine. SmolLM2-135M q4, AMD EPYC Zen 4, 2 threads, T=8: those four
// stages 0.89 -> 0.74 ms with 4 rather than 16 (which kept every pass of up to 16 rows on one thread; one run each).
constexpr int64_t kRowGrain = 4;
constexpr int kBuckets = 3;
inline int bucket_of(int64_t t) { return t == 1 ? 0 : t <= kVerifyRows ? 1 : 2; }

// Column blocks [0, n) over every thread, in pieces of `tile` blocks: each thread streams its own contiguous share
// from the front, claiming half of what is left of it at a time, and a thread whose share is done takes pieces
// from the back of the others' (half of what is left there), so a thread the OS pauses (on 2 cores: the server's
// own Python threads, or any other process) leaves its blocks to the others instead of holding the whole pass up
// at the end of each projection. Whichever thread computes a block computes all of it with the same code, so the
// bits do not change. Pieces taken in turn from one shared counter instead (each thread's reads scattered over
// the matrix, a fresh stream per piece) took 1.036x / 1.024x / 1.005x the time of a pass at T=1/2/4 on
// SmolLM2-135M q4 (61 passes) and 1.037x / 1.030x / 1.003x on a synthetic Llama-3.2-1B q4 (21 passes): AMD EPYC
// Zen 4, 2 threads, greedy after 256 tokens, the two alternating pass by pass in one process, medians of the
// per-pass ratios.
template <typename F>
inline void parallel_blocks(int64_t n, int64_t tile, const F& body) {
  const int64_t pieces = (n + tile - 1) / tile;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), pieces);
  if (threads <= 1 || at::in_parallel_region()) return body(0, n);
  // share s: pieces [front, back) in one word (front in the low 32 bits), so that a claim is one exchange
  const auto pack = [](int64_t front, int64_t back) { return static_cast<uint64_t>(back) << 32 | front; };
  std::vector<std::atomic<uint64_t>> shares(threads);
  for (int64_t s = 0; s < threads; ++s) shares[s].store(pack(pieces * s / threads, pieces * (s + 1) / threads));
  // half of what is left of `share`, at least one piece: from its front (its own thread) or its back (another)
  const auto claim = [&](std::atomic<uint64_t>& share, bool own, int64_t& p0, int64_t& p1) {
    uint64_t word = share.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(word & 0xffffffffu), back = static_cast<int64_t>(word >> 32);
      if (front >= back) return false;
      const int64_t take = std::max<int64_t>(1, (back - front) / 2);
      p0 = own ? front : back - take;
      p1 = p0 + take;
      if (share.compare_exchange_weak(word, own ? pack(p1, back) : pack(front, p0), std::memory_order_relaxed))
        return true;
    }
  };
  at::parallel_for(0, threads, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      int64_t p0, p1;
      while (claim(shares[s], true, p0, p1)) body(p0 * tile, std::min(n, p1 * tile));
      for (int64_t other = 1; other < threads; ++other)
        while (claim(shares[(s + other) % threads], false, p0, p1)) body(p0 * tile, std::min(n, p1 * tile));
    }
  });
}

// Reusable buffers of one forward (one backend runs one forward at a time).
struct Workspace {
  std::vector<int8_t> q;         // [rows, kq * 4] quantized activations, zero-padded
  std::vector<float> amax;       // [rows] max |x| of each quantized row
  std::vector<int32_t> rowsum;   // [rows] sum of each quantized row
  std::vector<float> y;          // [rows, N] the GEMM's float output before the row scales
  std::vector<float> residual;   // [K] precise rows: what int8 missed
  std::vector<float> group_scale;  // [rows, K / 32] 4-bit projections: each group's activation scale
  std::vector<float> group_sum;    // [rows, K / 32] and each group's sum of quantized activations (exact)
  std::vector<int32_t> group_half;  // [rows, K / 32, 2] 6-bit projections: the sums over each half of a group
};

// Columns [first, first + n) of a projection on a checkpoint's blocks, all of one format, packed from byte `offset`
// of its blocks (gemm_q4.h's layout). A fused projection whose parts the file stores in different formats (a
// Q4_K q and k beside a Q6_K v, as in Q4_K_M files) has one per part; each computes its own columns, so the bits of a
// column do not depend on the others.
struct Q4Part {
  int64_t offset = 0, first = 0, n = 0;
  int bits = 4;    // 4 (Q4_0 / Q4_1), 5 (Q5_0), 6 (Q6_K), 8 (Q8_0) or kQ4K (Q4_K)
  bool m = false;  // 4 bits: whether m is stored
};

// One projection: W [N, K] int8 per-channel, y = sum_k q[k] W[n, k] * step[n] / 127 * amax(row); or a GGUF
// checkpoint's 4-bit blocks (gemm_q4.h) against activations quantized per group of 32.
struct Projection {
  at::Tensor q4;        // the packed blocks (gemm_q4.h), uint8; undefined for an int8 projection
  std::vector<Q4Part> q4_parts;  // their formats by column range (one, unless the parts' formats differ)
  at::Tensor weight_t;  // [K, N] int8, a transposed view (torch._int_mm)
  at::Tensor scale;     // [N] float32 step / 127
  at::Tensor own;       // paradecode's packed weight (gemm.h), uint8
  at::Tensor own_scale; // [blocks * 16] the scale padded to whole blocks
  c10::intrusive_ptr<LinearPackedParamsBase> packed;  // fbgemm's prepacked weight; null: no fbgemm here
  std::optional<at::Tensor> bias;  // [N] float32
  bool precise = false;  // activations as int8 + an int8 residual row (for outlier-heavy inputs)
  at::Tensor column_bound;  // [N] float, precise only: scale[n] * ||W[n]||_2, rounded up (apply_argmax's bound)
  int64_t n = 0, k = 0;

  int64_t out_features() const { return n; }
  bool is_q4() const { return q4.defined(); }
  int64_t row_bytes() const { return is_q4() ? k : packed_quads(k) * 4; }
  PackedQ4 q4_weights(const Q4Part& part) const {
    return {q4.data_ptr<uint8_t>() + part.offset, part.n, k, k / kQ4Group, (part.n + kBlockCols - 1) / kBlockCols,
            q4_group_bytes(part.m, part.bits)};
  }
  bool q4_halves() const {  // whether a 6-bit part needs the activations' sums over each half of a group
    return std::any_of(q4_parts.begin(), q4_parts.end(), [](const Q4Part& part) { return part.bits == 6; });
  }
  PackedInt8 own_weights() const {
    return {own.data_ptr<uint8_t>(), own_scale.data_ptr<float>(), n, k, packed_quads(k), own_scale.size(0) / kBlockCols};
  }

  // Quantize every row of x [T, K] (twice when precise: the row, then what it missed) into ws.q / amax / rowsum.
  int64_t quantize(const float* x, int64_t t, Workspace& ws) const {
    if (is_q4()) {  // per group of 32; the row scales are 1 (the GEMM's output is already scaled)
      const int64_t groups = k / kQ4Group;
      ws.q.resize(t * k);
      ws.amax.assign(t, 1.f);
      ws.group_scale.resize(t * groups);
      ws.group_sum.resize(t * groups);
      const bool halves = q4_halves();
      if (halves) ws.group_half.resize(2 * t * groups);
      at::parallel_for(0, t, kRowGrain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t g = 0; g < groups; ++g) {  // each group of 32 inputs as the int8 rows are: p, a = amax / 127
            const int64_t at = r * k + g * kQ4Group, group = r * groups + g;
            q4_quantize_group(x + at, ws.q.data() + at, ws.group_scale[group], ws.group_sum[group],
                              halves ? ws.group_half.data() + 2 * group : nullptr);
          }
      });
      return t;
    }
    const int64_t rows = precise ? 2 * t : t, stride = row_bytes();
    ws.q.resize(rows * stride);
    ws.amax.resize(rows);
    ws.rowsum.resize(rows);
    at::parallel_for(0, t, kRowGrain, [&](int64_t r0, int64_t r1) {
      std::vector<float> qf(k), residual(precise ? k : 0);
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = x + r * k;
        ws.amax[r] = quantize_row(row, qf.data(), k);
        ws.rowsum[r] = to_int8(qf.data(), ws.q.data() + r * stride, k, stride);
        if (precise) {
          const float step = ws.amax[r] / 127.f;
          for (int64_t c = 0; c < k; ++c) residual[c] = row[c] - qf[c] * step;
          ws.amax[t + r] = quantize_row(residual.data(), qf.data(), k);
          ws.rowsum[t + r] = to_int8(qf.data(), ws.q.data() + (t + r) * stride, k, stride);
        }
      }
    });
    return rows;
  }

  // Integer-valued floats -> int8, zero-padded to `stride` bytes; returns their sum.
  static int32_t to_int8(const float* qf, int8_t* q, int64_t k, int64_t stride) {
    const int32_t sum = paradecode::to_int8(qf, q, k);
    std::fill(q + k, q + stride, 0);
    return sum;
  }

  // ws.q rows -> ws.y [rows, N]: float(sum) * scale per column, by `kernel`; a 4-bit projection may write its
  // rows to `into` instead ([rows, N], see apply).
  void multiply(Kernel kernel, int64_t rows, Workspace& ws, float* into = nullptr) const {
    TORCH_CHECK(into == nullptr || is_q4(), "only a 4-bit projection writes its output in place");
    if (into == nullptr) ws.y.resize(rows * n);
    if (is_q4()) {  // the vector kernel for block weights, or its AMX tile form where the bucket's kernel is amx
      const bool amx = kernel == kAmx;
      const int64_t readable = amx ? q4_amx_padded_rows(rows) * k : 0;  // the tiles load whole tiles of rows
      if (static_cast<int64_t>(ws.q.size()) < readable) ws.q.resize(readable);
      const Q4Rows x{ws.q.data(), ws.group_scale.data(), ws.group_sum.data(), k, k / kQ4Group,
                     q4_halves() ? ws.group_half.data() : nullptr};
      const bool interleaved = kernel == kInterleaved;
      for (const Q4Part& part : q4_parts) {
        const PackedQ4 w = q4_weights(part);
        float* y = (into != nullptr ? into : ws.y.data()) + part.first;
        parallel_blocks(w.blocks, amx ? q4_amx_tile_blocks(rows) : q4_tile_blocks(), [&](int64_t b0, int64_t b1) {
          float spill[kMaxTileRows * kBlockCols];
          if (amx) q4_amx_gemm(w, x, rows, y, n, b0, b1, spill);
          else q4_gemm(w, x, rows, y, n, b0, b1, spill, interleaved);
        });
      }
    } else if (kernel == kFbgemm && packed) {
      at::Tensor qf = at::empty({rows, k}, at::kFloat);
      float* dst = qf.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c) dst[r * k + c] = ws.q[r * row_bytes() + c];
      at::Tensor out = at::from_blob(ws.y.data(), {rows, n}, at::kFloat);
      out.copy_(packed->apply_with_input_q_dq_qweight_dq_output_fp32(qf, 1.0, 128));
    } else if (kernel == kIntMm) {
      at::Tensor q8 = at::empty({rows, k}, at::kChar);
      int8_t* dst = q8.data_ptr<int8_t>();
      for (int64_t r = 0; r < rows; ++r) std::copy(&ws.q[r * row_bytes()], &ws.q[r * row_bytes()] + k, dst + r * k);
      at::Tensor out = at::from_blob(ws.y.data(), {rows, n}, at::kFloat);
      out.copy_(at::_int_mm(q8, weight_t).to(at::kFloat).mul_(scale));
    } else {  // paradecode's own kernel, or its AMX tile form over the same packed weights
      const bool amx = kernel == kAmx;
      const int64_t stride = row_bytes();
      const int64_t readable = amx ? amx_padded_rows(rows) * stride : 0;  // the tiles load whole groups of rows
      if (static_cast<int64_t>(ws.q.size()) < readable) ws.q.resize(readable);
      const PackedInt8 w = own_weights();
      const int8_t* q = ws.q.data();
      const int32_t* rowsum = ws.rowsum.data();
      float* y = ws.y.data();
      const bool interleaved = kernel == kInterleaved;
      parallel_blocks(w.blocks, amx ? amx_tile_blocks(rows) : own_tile_blocks(), [&](int64_t b0, int64_t b1) {
        float spill[kMaxTileRows * kBlockCols];
        if (amx) amx_gemm(w, q, stride, rowsum, rows, y, n, b0, b1, spill);
        else int8_gemm(w, q, stride, rowsum, rows, y, n, b0, b1, spill, interleaved);
      });
    }
  }

  // x [T, K] -> out [T, N] (+= when accumulate, else =).
  void apply(Kernel kernel, const float* x, int64_t t, float* out, bool accumulate, Clock& clock,
             Workspace& ws) const {
    const int64_t rows = quantize(x, t, ws);
    clock.lap(kQuantize);
    // A 4-bit projection's sums are already scaled (its row scales are 1): with no bias to add and nothing to add
    // to, the loop below would copy them (y * 1 is y), so the GEMM writes them in place: same bits. SmolLM2-135M
    // q4, Intel Xeon with AMX, 2 threads: a 1,000-token prefill's dequantize stage 61-67 -> 10-12 ms (qkv and
    // gate_up now skip it; o and down add to the residual), T=8 0.35-0.39 -> 0.08-0.09 ms, T=32 1.24-1.34 -> 0.44.
    const bool in_place = is_q4() && !accumulate && !bias;
    multiply(kernel, rows, ws, in_place ? out : nullptr);
    clock.lap(kGemm);
    if (in_place) return;
    dequantize(t, out, accumulate, ws);
    clock.lap(kDequantize);
  }

  // ws.y's rows (and a precise projection's residual rows after them) -> out [T, N], times each row's scale, plus
  // the bias (+= when accumulate).
  void dequantize(int64_t t, float* out, bool accumulate, const Workspace& ws) const {
    const float* yp = ws.y.data();
    const float* bp = bias ? bias->data_ptr<float>() : nullptr;
    // Each output is its own few float operations, so any split gives the same bits: split by elements, in
    // pieces big enough (the LM head's 49,152 columns of a verify pass) to be worth a second thread.
    at::parallel_for(0, t * n, kDequantizeGrain, [&](int64_t e0, int64_t e1) {
      for (int64_t r = e0 / n; r * n < e1; ++r) {
        const int64_t c0 = std::max(e0, r * n) - r * n, c1 = std::min(e1, (r + 1) * n) - r * n;
        float* o = out + r * n;
        const float* y0 = yp + r * n;
        const float a0 = ws.amax[r];
        if (precise) {
          const float* y1 = yp + (t + r) * n;
          const float a1 = ws.amax[t + r];
          for (int64_t c = c0; c < c1; ++c) {
            float v = precise_value(y0[c], a0, y1[c], a1);
            if (bp) v += bp[c];
            o[c] = accumulate ? o[c] + v : v;
          }
        } else {
          for (int64_t c = c0; c < c1; ++c) {
            float v = y0[c] * a0;
            if (bp) v += bp[c];
            o[c] = accumulate ? o[c] + v : v;
          }
        }
      }
    });
  }

  // A precise projection's output (before any bias) from its two parts, the row's int8 sums times their scale and
  // the residual row's, in the one order every path uses, so the same inputs give the same bits.
  static float precise_value(float y0, float a0, float y1, float a1) { return y0 * a0 + y1 * a1; }

  // apply (not accumulating) for a reader that needs only each row's argmax, such as greedy verification: a
  // precise projection's residual rows are the second half of its GEMM's rows, and an LM head's argmax rarely
  // depends on them. Every row's largest output, its index and its bits, are apply's; every other output is the
  // main int8 row's part alone (apply's without the residual), within the bound below of apply's. How: the
  // residual's part of output c is float(s) * scale[c] * a1 with s = sum_k q1[k] W[c][k], and by Cauchy-Schwarz
  // |s| <= ||q1||_2 ||W[c]||_2, so with room for the roundings it is at most b_c = reach * column_bound[c] +
  // 1e-6 |L_c| (reach = a1 ||q1||_2, L_c the main part). The row's true maximum is at least lower = max_c (L_c -
  // b_c); only the columns with L_c + b_c >= lower can hold it, and those (a few to a few dozen of SmolLM2's
  // 49,152) get apply's own value from their residual sums, computed exactly. Every other column's written value
  // is below lower, so the row's argmax, ties and NaN included, is apply's. Not precise, 4-bit or with a bias (which
  // the bound leaves out): apply itself.
  void apply_argmax(Kernel kernel, const float* x, int64_t t, float* out, Clock& clock, Workspace& ws) const {
    if (!precise || is_q4() || bias) return apply(kernel, x, t, out, false, clock, ws);
    quantize(x, t, ws);  // rows [0, t) the activations, [t, 2t) what they missed
    clock.lap(kQuantize);
    multiply(kernel, t, ws);  // the main rows only: the same bits as their rows in a pass of all 2t
    clock.lap(kGemm);
    const float* yp = ws.y.data();
    const float* cb = column_bound.data_ptr<float>();
    const int64_t stride = row_bytes();
    std::vector<float> reach(t), lower(t, -std::numeric_limits<float>::infinity());
    auto bound = [&](int64_t r, int64_t c, auto v) {  // b_c of row r for main part v (a float, or 16 lanes from c)
      return ld(cb + c, v) * reach[r] + abs_of(v) * 1e-6f;
    };
    bool finite = true;
    for (int64_t r = 0; r < t; ++r) {
      const int8_t* q1 = ws.q.data() + (t + r) * stride;
      int64_t squares = 0;
      for (int64_t c = 0; c < k; ++c) squares += int64_t{q1[c]} * q1[c];
      reach[r] = static_cast<float>(ws.amax[t + r] * std::sqrt(static_cast<double>(squares)) * (1 + 1e-5));
      finite = finite && std::isfinite(reach[r]);
    }
    std::mutex lower_mutex;
    // The main parts, and each row's lower (max over columns of L_c - b_c) from every thread's share of it.
    at::parallel_for(0, t * n, kDequantizeGrain, [&](int64_t e0, int64_t e1) {
      for (int64_t r = e0 / n; r * n < e1; ++r) {
        const int64_t c0 = std::max(e0, r * n) - r * n, c1 = std::min(e1, (r + 1) * n) - r * n;
        const float* y0 = yp + r * n;
        const float a0 = ws.amax[r];
        float* o = out + r * n;
        vf low_v = splat(-std::numeric_limits<float>::infinity()), probe_v{};  // probe: NaN where a value is not finite
        float low = -std::numeric_limits<float>::infinity(), probe = 0.f;
        each(c1 - c0, [&](int64_t i, auto z) {
          const int64_t c = c0 + i;
          const auto v = ld(y0 + c, z) * a0;
          st(o + c, v);
          const auto low_c = v - bound(r, c, v);
          if constexpr (std::is_same_v<decltype(z), vf>) {
            low_v = max_of(low_v, low_c);
            probe_v = probe_v + v * 0.f;
          } else {
            low = max_of(low, low_c);
            probe = probe + v * 0.f;
          }
        });
        float lanes[kLanes];
        std::memcpy(lanes, &low_v, sizeof(lanes));
        for (float l : lanes) low = max_of(low, l);
        std::lock_guard<std::mutex> lock(lower_mutex);
        lower[r] = max_of(lower[r], low);
        finite = finite && std::isfinite(probe + fold(probe_v));
      }
    });
    if (!finite) {  // a NaN or an infinity: the bound says nothing, so apply's way
      multiply(kernel, 2 * t, ws);
      dequantize(t, out, false, ws);
      return clock.lap(kDequantize);
    }
    const int8_t* w = weight_t.data_ptr<int8_t>();  // weight_t is [K, N] over the [N, K] weight: W[c] is contiguous
    const float* sp = scale.data_ptr<float>();
    at::parallel_for(0, t * n, kDequantizeGrain, [&](int64_t e0, int64_t e1) {
      for (int64_t r = e0 / n; r * n < e1; ++r) {
        const int64_t c0 = std::max(e0, r * n) - r * n, c1 = std::min(e1, (r + 1) * n) - r * n;
        const int8_t* q1 = ws.q.data() + (t + r) * stride;
        const float a0 = ws.amax[r], a1 = ws.amax[t + r], lower_r = lower[r];
        float* o = out + r * n;
        std::vector<int64_t> hits;  // L_c + b_c >= lower: the columns that may win
        for_each_at_least(c1 - c0, lower_r, [&](int64_t i, auto z) {
          const auto v = ld(o + c0 + i, z);
          return v + bound(r, c0 + i, v);
        }, [&](int64_t i) { hits.push_back(c0 + i); });
        // A flat row (a prompt of unrelated tokens) has hundreds: their weight rows are asked for a few ahead, so
        // their reads from memory overlap instead of waiting one after the other.
        constexpr size_t kAhead = 4;
        auto fetch = [&](int64_t c) {
          for (int64_t off = 0; off < k; off += 64) __builtin_prefetch(w + c * k + off, 0, 0);
        };
        for (size_t h = 0; h < std::min(kAhead, hits.size()); ++h) fetch(hits[h]);
        for (size_t h = 0; h < hits.size(); ++h) {
          if (h + kAhead < hits.size()) fetch(hits[h + kAhead]);
          const int64_t c = hits[h];
          const int8_t* wc = w + c * k;
          int32_t sum = 0;
          for (int64_t j = 0; j < k; ++j) sum += int32_t{q1[j]} * wc[j];
          o[c] = precise_value(yp[r * n + c], a0, static_cast<float>(sum) * sp[c], a1);
        }
      }
    });
    clock.lap(kDequantize);
  }
};

struct Layer {
  at::Tensor attn_norm, mlp_norm;  // [D]
  Projection qkv, o, gate_up, down;
  at::Tensor q_norm, k_norm;  // [head_dim] RMSNorm weights of each query / key head before RoPE (Qwen3), or empty
  at::Tensor post_attn_norm, post_mlp_norm;  // [D] norms of the attention's and the MLP's outputs (Gemma-3), or empty
  int64_t window;             // a row at position p sees logical slots > p - window; 0: every slot
  at::Tensor cos, sin;        // [positions, head_dim] this layer's RoPE tables, or empty: the forward's own
};

// Packed weights on 2 MiB pages (backends/hugepages.py does the same for the 4-bit weights, which Python
// packs): every weight is read once per forward, and on 4 KiB pages each page is a TLB miss and a page walk.
// Weights are carved, 64-byte aligned, from 32 MiB private anonymous mappings that start on a 2 MiB boundary and
// are advised MADV_HUGEPAGE before anything touches them; a mapping is unmapped when the last tensor in it is
// freed. Where the kernel gives no huge pages the memory is ordinary; where mmap fails, at::empty.
struct HugeChunk {
  uint8_t* base;
  size_t size;
  size_t used = 0;
  HugeChunk(uint8_t* b, size_t s) : base(b), size(s) {}
  ~HugeChunk() { munmap(base, size); }
};

inline at::Tensor huge_page_bytes(int64_t n) {
  constexpr size_t kHuge = size_t(2) << 20, kChunk = size_t(32) << 20, kAlign = 64;
  static std::mutex mutex;
  static std::shared_ptr<HugeChunk> current;  // the mapping new weights go to while they fit
  const size_t need = (size_t(n) + kAlign - 1) / kAlign * kAlign;
  std::shared_ptr<HugeChunk> chunk;
  uint8_t* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!current || current->used + need > current->size) {
      const size_t size = std::max(kChunk, (need + kHuge - 1) / kHuge * kHuge);
      void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw == MAP_FAILED) return at::empty({n}, at::kByte);
      const uintptr_t start = reinterpret_cast<uintptr_t>(raw), aligned = (start + kHuge - 1) & ~(kHuge - 1);
      if (aligned > start) munmap(raw, aligned - start);  // keep [aligned, aligned + size)
      if (start + size + kHuge > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), start + kHuge - aligned);
      madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);  // a refusal leaves ordinary pages
      current = std::make_shared<HugeChunk>(reinterpret_cast<uint8_t*>(aligned), size);
    }
    chunk = current;
    data = chunk->base + chunk->used;
    chunk->used += need;
  }
  return at::from_blob(data, {n}, [chunk](void*) mutable { chunk.reset(); }, at::TensorOptions().dtype(at::kByte));
}

inline c10::intrusive_ptr<LinearPackedParamsBase> unwrap_packed(const py::object& packed) {
  if (packed.is_none()) return {};
  c10::IValue value = torch::jit::toIValue(packed, c10::getCustomClassType<c10::intrusive_ptr<LinearPackedParamsBase>>());
  return value.toCustomClass<LinearPackedParamsBase>();
}

inline Projection make_projection(at::Tensor weight, at::Tensor step, const py::object& packed,
                                  std::optional<at::Tensor> bias, bool precise) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2 && weight.is_contiguous(),
              "weight must be a contiguous [N, K] int8 tensor");
  Projection p;
  p.n = weight.size(0);
  p.k = weight.size(1);
  p.weight_t = weight.t();
  p.scale = (step / 127.0).to(at::kFloat).contiguous();
  p.own = huge_page_bytes(packed_bytes(p.n, p.k));
  pack_int8(weight.data_ptr<int8_t>(), p.n, p.k, p.own.data_ptr<uint8_t>());
  const int64_t blocks = (p.n + kBlockCols - 1) / kBlockCols;
  p.own_scale = at::zeros({blocks * kBlockCols}, at::kFloat);
  p.own_scale.narrow(0, 0, p.n).copy_(p.scale);
  p.packed = unwrap_packed(packed);
  if (bias) p.bias = bias->to(at::kFloat).contiguous();
  p.precise = precise;
  if (precise) {  // scale[n] * ||W[n]||_2, in double, rounded up a little so that float roundings stay inside it
    const at::Tensor norms = weight.to(at::kDouble).pow(2).sum(1).sqrt();
    p.column_bound = (norms * p.scale.to(at::kDouble) * (1 + 1e-6)).to(at::kFloat).contiguous();
  }
  return p;
}

// A projection on a checkpoint's blocks: `packed` in gemm_q4.h's layout for an [n, k] weight (k a multiple of 32;
// of 256 for 6 bits and Q4_K), its columns in parts of (columns, bits, m stored) one after the other (bits 4: Q4_0 /
// Q4_1; 5: Q5_0; 6: Q6_K; 8: Q8_0; kQ4K: Q4_K), each part packed after the one before.
inline Projection make_q4_projection(at::Tensor packed, int64_t n, int64_t k, std::optional<at::Tensor> bias,
                                     const std::vector<std::tuple<int64_t, int, bool>>& parts) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "block weights must be contiguous uint8");
  Projection p;
  p.n = n;
  p.k = k;
  p.q4 = packed;
  int64_t offset = 0, first = 0;
  for (const auto& [columns, bits, with_m] : parts) {
    TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8 || bits == kQ4K,
                "block weights have 4, 5, 6 or 8 bits or are Q4_K (", kQ4K, "), not ", bits);
    TORCH_CHECK(k % (bits == 6 || bits == kQ4K ? 256 : kQ4Group) == 0 && (bits == 4 || !with_m),
                "k must be a multiple of 32 (256 for 6 bits and Q4_K), and only 4-bit blocks store m");
    p.q4_parts.push_back({offset, first, columns, bits, with_m});
    offset += q4_packed_bytes(columns, k, with_m, bits);
    first += columns;
  }
  TORCH_CHECK(first == n && packed.numel() == offset,
              "the parts must cover the n columns and the packed bytes (q4_packed_bytes of each part)");
  if (bias) p.bias = bias->to(at::kFloat).contiguous();
  return p;
}

}  // namespace paradecode
