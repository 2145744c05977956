// One int8 projection of the native forward (fbgemm's prepacked GEMM or torch._int_mm around per-token
// quantization), and the stage clock of `paradecode profile --stages`.
#pragma once

#include <torch/extension.h>

#include <ATen/native/quantized/PackedParams.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <chrono>
#include <optional>
#include <vector>

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

// One int8 projection: W [N, K] int8 per-channel, y = sum_k q[k] W[n, k] * step[n] / 127 * amax(row).
struct Projection {
  at::Tensor weight_t;  // [K, N] int8, a transposed view (torch._int_mm's one-row path)
  at::Tensor scale;     // [N] float32 step / 127
  c10::intrusive_ptr<LinearPackedParamsBase> packed;  // fbgemm's prepacked weight; null: int_mm only
  std::optional<at::Tensor> bias;  // [N] float32
  bool precise = false;  // activations as int8 + an int8 residual row (for outlier-heavy inputs)
  bool packed_one_row = false;  // fbgemm for a single row too (chosen by timing at load)

  int64_t out_features() const { return scale.size(0); }

  // q [R, K] integer-valued float rows -> [R, N] float32 sums times the weight's step/127 (no row scale yet).
  at::Tensor raw(const at::Tensor& q) const {
    if (packed && (q.size(0) > 1 || packed_one_row)) {
      return packed->apply_with_input_q_dq_qweight_dq_output_fp32(q, 1.0, 128);
    }
    at::Tensor acc = at::_int_mm(q.to(at::kChar), weight_t);  // [R, N] int32
    return acc.to(at::kFloat).mul_(scale);
  }

  // x [T, K] -> out [T, N] (+= when accumulate, else =): quantizes every row (twice when precise), multiplies.
  void apply(const at::Tensor& x, at::Tensor& out, bool accumulate, Clock& clock) const {
    const int64_t t = x.size(0), k = x.size(1), n = out_features();
    const int64_t rows = precise ? 2 * t : t;
    at::Tensor q = at::empty({rows, k}, x.options());
    std::vector<float> amax(rows);
    const float* xp = x.data_ptr<float>();
    float* qp = q.data_ptr<float>();
    std::vector<float> residual(precise ? k : 0);
    for (int64_t r = 0; r < t; ++r) {
      const float* row = xp + r * k;
      amax[r] = quantize_row(row, qp + r * k, k);
      if (precise) {
        const float step = amax[r] / 127.f;
        for (int64_t c = 0; c < k; ++c) residual[c] = row[c] - qp[r * k + c] * step;
        amax[t + r] = quantize_row(residual.data(), qp + (t + r) * k, k);
      }
    }
    clock.lap(kQuantize);
    at::Tensor y = raw(q);  // [rows, N]
    clock.lap(kGemm);
    const float* yp = y.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float* bp = bias ? bias->data_ptr<float>() : nullptr;
    for (int64_t r = 0; r < t; ++r) {
      float* o = op + r * n;
      const float* y0 = yp + r * n;
      const float a0 = amax[r];
      if (precise) {
        const float* y1 = yp + (t + r) * n;
        const float a1 = amax[t + r];
        for (int64_t c = 0; c < n; ++c) {
          float v = y0[c] * a0 + y1[c] * a1;
          if (bp) v += bp[c];
          o[c] = accumulate ? o[c] + v : v;
        }
      } else {
        for (int64_t c = 0; c < n; ++c) {
          float v = y0[c] * a0;
          if (bp) v += bp[c];
          o[c] = accumulate ? o[c] + v : v;
        }
      }
    }
    clock.lap(kDequantize);
  }
};

struct Layer {
  at::Tensor attn_norm, mlp_norm;  // [D]
  Projection qkv, o, gate_up, down;
};

c10::intrusive_ptr<LinearPackedParamsBase> unwrap_packed(const py::object& packed) {
  if (packed.is_none()) return {};
  c10::IValue value = torch::jit::toIValue(packed, c10::getCustomClassType<c10::intrusive_ptr<LinearPackedParamsBase>>());
  return value.toCustomClass<LinearPackedParamsBase>();
}

Projection make_projection(at::Tensor weight, at::Tensor step, const py::object& packed,
                           std::optional<at::Tensor> bias, bool precise) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2, "weight must be [N, K] int8");
  Projection p;
  p.weight_t = weight.t();
  p.scale = (step / 127.0).contiguous();
  p.packed = unwrap_packed(packed);
  if (bias) p.bias = bias->contiguous();
  p.precise = precise;
  return p;
}

}  // namespace paradecode
