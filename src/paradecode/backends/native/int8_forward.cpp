// The int8 Llama forward pass in one native call (see paradecode/backends/native/__init__.py).
//
// The Python forward spends more time dispatching ~75 small tensor ops per layer than multiplying: at one
// token, a SmolLM2-135M forward is ~3 ms of int8 GEMMs and ~7 ms of everything else. Here every step but the
// GEMMs is a plain loop over the rows (RMSNorm fused with the per-token int8 quantization, RoPE, the KV write,
// attention, SiLU-times-up fused with the residual quantization, dequantization fused with the residual add),
// and the GEMMs are the same exact int8 kernels the Python path uses (fbgemm's prepacked GEMM, or
// torch._int_mm for one row), called directly.
//
// Exactness: every loop works on one row at a time, in an order that does not depend on how many rows share
// the pass. Attention gathers the keys a row may see (its mask row) and reduces over them in slot order, so a
// verified draft row computes bit for bit what a one-token forward of the same token computes later. That is
// what keeps speculative decoding on this backend equal to plain decoding.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <map>
#include <string>
#include <vector>

#include "lanes.h"
#include "projection.h"

namespace paradecode {

constexpr int kSlots = 4 * kLanes;  // attention scores computed together (each still sums over its key in order)
constexpr int64_t kParallelWork = 32768;  // multiply-adds per attention task (threads take at least this)

class Int8Forward {
 public:
  Int8Forward(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, at::Tensor embed, at::Tensor norm,
              at::Tensor cos, at::Tensor sin, at::Tensor cache, at::Tensor keys_t)
      : hq_(heads), hkv_(kv_heads), hd_(head_dim), eps_(eps), embed_(embed.contiguous()),
        norm_(norm.contiguous()), cos_(cos.contiguous()), sin_(sin.contiguous()), cache_(cache), keys_t_(keys_t) {
    TORCH_CHECK(cache.is_contiguous() && cache.scalar_type() == at::kFloat, "cache must be contiguous float32");
    TORCH_CHECK(keys_t.is_contiguous() && keys_t.scalar_type() == at::kFloat && keys_t.dim() == 5 &&
                    keys_t.size(2) * kLanes >= cache.size(2) && keys_t.size(3) == head_dim && keys_t.size(4) == kLanes,
                "keys_t must be a contiguous float32 [layers, kv_heads, slots / 16, head_dim, 16]");
    TORCH_CHECK(hq_ % hkv_ == 0, "query heads must be a multiple of kv heads");
  }

  void add_layer(at::Tensor attn_norm, at::Tensor mlp_norm, const py::tuple& qkv, const py::tuple& o,
                 const py::tuple& gate_up, const py::tuple& down) {
    Layer layer{attn_norm.contiguous(), mlp_norm.contiguous(), projection(qkv), projection(o),
                projection(gate_up), projection(down)};
    layers_.push_back(std::move(layer));
  }

  void set_head(const py::tuple& head) { head_ = projection(head); }

  // Rewrite the transposed keys of slots [start, start + count) from the cache (after commit moved slots).
  void refresh_keys(int64_t start, int64_t count) {
    const int64_t layers = cache_.size(0), cap = cache_.size(2);
    TORCH_CHECK(start >= 0 && count >= 0 && start + count <= cap, "slots out of range");
    for (int64_t layer = 0; layer < layers; ++layer) {
      const float* keys = cache_[layer].data_ptr<float>();  // key heads first: [Hkv, P, hd]
      float* kt = keys_t_[layer].data_ptr<float>();
      for (int64_t g = 0; g < hkv_; ++g) {
        for (int64_t j = start; j < start + count; ++j) {
          for (int64_t c = 0; c < hd_; ++c) kt[key_index(g, j, c)] = keys[(g * cap + j) * hd_ + c];
        }
      }
    }
  }

  // Profiling: stage_seconds() sums each stage's wall time over the forwards since set_profiling(true).
  void set_profiling(bool on) {
    clock_ = Clock();
    clock_.on = on;
  }

  std::map<std::string, double> stage_seconds() const {
    std::map<std::string, double> out;
    for (int stage = 0; stage < kStages; ++stage) out[kStageNames[stage]] = clock_.seconds[stage];
    return out;
  }

  void set_packed_one_row(bool value) {
    for (auto& layer : layers_) {
      for (Projection* p : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) p->packed_one_row = value;
    }
    head_.packed_one_row = value;
  }

  // ids [T] int64, rows start.. of the cache; positions [T] (RoPE) or None; mask [T, start+T] bool or None
  // (causal); layers: indices to run. Returns (final-normed hidden [T, D], logits [T, V] or undefined).
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& ids, int64_t start, std::optional<at::Tensor> positions,
                                             std::optional<at::Tensor> mask, const std::vector<int64_t>& layers,
                                             bool want_logits) {
    at::NoGradGuard no_grad;
    const int64_t t = ids.size(0), end = start + t, d = embed_.size(1);
    TORCH_CHECK(end <= cache_.size(2), "the pass does not fit the cache");
    at::Tensor pos = positions ? positions->contiguous() : at::arange(start, end, ids.options());
    at::Tensor x = embed_.index_select(0, ids).contiguous();  // [T, D]
    at::Tensor h = at::empty_like(x);
    at::Tensor mask_c;
    if (mask) mask_c = mask->contiguous();
    clock_.start();
    for (int64_t index : layers) {
      const Layer& layer = layers_.at(index);
      at::Tensor slots = cache_[index];  // [2 Hkv, P, hd]
      at::Tensor keys_t = keys_t_[index];  // [Hkv, P / 16, hd, 16]
      rms_norm(x, layer.attn_norm, h);
      clock_.lap(kNorm);
      at::Tensor qkv = at::empty({t, layer.qkv.out_features()}, x.options());
      layer.qkv.apply(h, qkv, false, clock_);
      rope_and_store(qkv, pos, slots, keys_t, start);
      clock_.lap(kRope);
      at::Tensor attn = attention(qkv, slots, keys_t, start, mask_c);
      clock_.lap(kAttention);
      layer.o.apply(attn, x, true, clock_);
      rms_norm(x, layer.mlp_norm, h);
      clock_.lap(kNorm);
      at::Tensor gate_up = at::empty({t, layer.gate_up.out_features()}, x.options());
      layer.gate_up.apply(h, gate_up, false, clock_);
      at::Tensor act = silu_mul(gate_up);
      clock_.lap(kSilu);
      layer.down.apply(act, x, true, clock_);
    }
    at::Tensor hidden = at::empty_like(x);
    rms_norm(x, norm_, hidden);
    at::Tensor logits;  // undefined (None) when not wanted: a prefill skips the LM head
    if (want_logits) {
      logits = at::empty({t, head_.out_features()}, x.options());
      Clock head_clock;
      head_.apply(hidden, logits, false, head_clock);
    }
    clock_.lap(kHead);
    return {hidden, logits};
  }

 private:
  Projection projection(const py::tuple& parts) {
    auto bias = parts[3].is_none() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(parts[3].cast<at::Tensor>());
    return make_projection(parts[0].cast<at::Tensor>(), parts[1].cast<at::Tensor>(), parts[2], bias,
                           parts[4].cast<bool>());
  }

  void rms_norm(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out) const {
    const int64_t t = x.size(0), d = x.size(1);
    const float* xp = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t r = 0; r < t; ++r) {
      const float* row = xp + r * d;
      const float inv = 1.f / std::sqrt(dot(row, row, d) / static_cast<float>(d) + static_cast<float>(eps_));
      for (int64_t c = 0; c < d; ++c) op[r * d + c] = row[c] * inv * w[c];
    }
  }

  // Offset of key head g, slot j, dimension c in one layer's transposed keys [Hkv, P / 16, hd, 16]: 16 slots
  // side by side per dimension, so 16 scores are one vector multiply-add per dimension.
  int64_t key_index(int64_t g, int64_t j, int64_t c) const {
    return ((g * keys_t_.size(2) + j / kLanes) * hd_ + c) * kLanes + j % kLanes;
  }

  // RoPE (rotate-half layout) on the query and key heads of qkv [T, (Hq + 2 Hkv) hd], in place; keys and
  // values go to cache slots start.. of this layer.
  void rope_and_store(at::Tensor& qkv, const at::Tensor& pos, at::Tensor& slots, at::Tensor& keys_t,
                      int64_t start) const {
    const int64_t t = qkv.size(0), width = qkv.size(1), half = hd_ / 2, cap = slots.size(1);
    float* qp = qkv.data_ptr<float>();
    float* cache = slots.data_ptr<float>();
    float* kt = keys_t.data_ptr<float>();
    const float* cosp = cos_.data_ptr<float>();
    const float* sinp = sin_.data_ptr<float>();
    const int64_t* pp = pos.data_ptr<int64_t>();
    std::vector<float> rotated(hd_);
    for (int64_t r = 0; r < t; ++r) {
      const float* c = cosp + pp[r] * hd_;
      const float* s = sinp + pp[r] * hd_;
      for (int64_t head = 0; head < hq_ + hkv_; ++head) {
        float* v = qp + r * width + head * hd_;
        for (int64_t i = 0; i < half; ++i) rotated[i] = v[i] * c[i] + v[i + half] * s[i];
        for (int64_t i = half; i < hd_; ++i) rotated[i] = v[i] * c[i] + v[i - half] * s[i];
        std::copy(rotated.begin(), rotated.end(), v);
      }
      for (int64_t g = 0; g < 2 * hkv_; ++g) {  // key heads, then value heads
        const float* src = qp + r * width + (hq_ + g) * hd_;
        std::copy(src, src + hd_, cache + (g * cap + start + r) * hd_);
      }
      for (int64_t g = 0; g < hkv_; ++g) {  // and the keys transposed, for attention's slot-vectorized scores
        const float* src = qp + r * width + (hq_ + g) * hd_;
        for (int64_t c = 0; c < hd_; ++c) kt[key_index(g, start + r, c)] = src[c];
      }
    }
  }

  // Row by row: each (row, head) scores every slot before the pass's end against the transposed keys (a
  // vector of slots per head dimension, summed in dimension order), then keeps the slots its mask row allows,
  // in slot order, for the softmax and the weighted sum of values.
  at::Tensor attention(const at::Tensor& qkv, const at::Tensor& slots, const at::Tensor& keys_t, int64_t start,
                       const at::Tensor& mask) const {
    const int64_t t = qkv.size(0), width = qkv.size(1), cap = slots.size(1), end = start + t;
    const int64_t group = hq_ / hkv_;
    at::Tensor out = at::empty({t, hq_ * hd_}, qkv.options());
    const float* qp = qkv.data_ptr<float>();
    const float* kt = keys_t.data_ptr<float>();  // [Hkv, P / 16, hd, 16]
    const float* values = slots.data_ptr<float>() + hkv_ * cap * hd_;  // [Hkv, P, hd]
    const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
    float* op = out.data_ptr<float>();
    const float scale = 1.f / std::sqrt(static_cast<float>(hd_));
    const int64_t units = t * hq_;
    const int64_t grain = std::max<int64_t>(1, kParallelWork / std::max<int64_t>(1, end * hd_));
    at::parallel_for(0, units, grain, [&](int64_t begin, int64_t stop) {
      std::vector<float> scores((end + kLanes - 1) / kLanes * kLanes), probs(end);
      std::vector<int64_t> visible(end);
      for (int64_t unit = begin; unit < stop; ++unit) {
        const int64_t r = unit / hq_, head = unit % hq_, g = head / group;
        const float* q = qp + r * width + head * hd_;
        const float* kg = kt + key_index(g, 0, 0);
        const int64_t seen = mp ? end : start + r + 1;  // slots that may be visible
        float* sp = scores.data();
        // Scores of whole 16-slot blocks (a block's slots past `seen` are scored too and never used): 64 at a
        // time while they last, then 16; each slot's score is the same chain of multiply-adds either way.
        const int64_t padded = (seen + kLanes - 1) / kLanes * kLanes;
        const int64_t next = hd_ * kLanes;  // from one 16-slot block to the next
        int64_t block = 0;
        for (; block + kSlots <= padded; block += kSlots) {
          const float* b0 = kg + key_index(0, block, 0);
          vf a0{}, a1{}, a2{}, a3{};
          for (int64_t c = 0; c < hd_; ++c) {
            const float* kc = b0 + c * kLanes;
            const vf qc = splat(q[c]);
            a0 = mul_add(qc, load(kc), a0);
            a1 = mul_add(qc, load(kc + next), a1);
            a2 = mul_add(qc, load(kc + 2 * next), a2);
            a3 = mul_add(qc, load(kc + 3 * next), a3);
          }
          store(sp + block, a0);
          store(sp + block + kLanes, a1);
          store(sp + block + 2 * kLanes, a2);
          store(sp + block + 3 * kLanes, a3);
        }
        for (; block < padded; block += kLanes) {
          const float* b0 = kg + key_index(0, block, 0);
          vf a0{};
          for (int64_t c = 0; c < hd_; ++c) a0 = mul_add(splat(q[c]), load(b0 + c * kLanes), a0);
          store(sp + block, a0);
        }
        int64_t count = 0;
        if (mp) {
          const bool* row = mp + r * end;
          for (int64_t j = 0; j < end; ++j) if (row[j]) visible[count++] = j;
        } else {
          for (int64_t j = 0; j < seen; ++j) visible[count++] = j;
        }
        float* pp = probs.data();
        for (int64_t i = 0; i < count; ++i) pp[i] = sp[visible[i]] * scale;
        const float top = max_value(pp, count);
        each(count, [&](int64_t i, auto z) { st(pp + i, exp_approx(ld(pp + i, z) - top)); });
        const float inv = 1.f / lane_sum(pp, count);
        float* o = op + r * hq_ * hd_ + head * hd_;
        const float* vg = values + g * cap * hd_;
        int64_t chunk = 0;  // output dims in registers (64, then 16, then one), each summed over the slots in order
        for (; chunk + 4 * kLanes <= hd_; chunk += 4 * kLanes) {
          vf a0{}, a1{}, a2{}, a3{};
          for (int64_t i = 0; i < count; ++i) {
            const float* v = vg + visible[i] * hd_ + chunk;
            const float p = pp[i];
            a0 = mul_add(splat(p), load(v), a0);
            a1 = mul_add(splat(p), load(v + kLanes), a1);
            a2 = mul_add(splat(p), load(v + 2 * kLanes), a2);
            a3 = mul_add(splat(p), load(v + 3 * kLanes), a3);
          }
          store(o + chunk, a0 * inv);
          store(o + chunk + kLanes, a1 * inv);
          store(o + chunk + 2 * kLanes, a2 * inv);
          store(o + chunk + 3 * kLanes, a3 * inv);
        }
        for (; chunk + kLanes <= hd_; chunk += kLanes) {
          vf acc{};
          for (int64_t i = 0; i < count; ++i) acc = mul_add(splat(pp[i]), load(vg + visible[i] * hd_ + chunk), acc);
          store(o + chunk, acc * inv);
        }
        for (; chunk < hd_; ++chunk) {
          float acc = 0.f;
          for (int64_t i = 0; i < count; ++i) acc = mul_add(pp[i], vg[visible[i] * hd_ + chunk], acc);
          o[chunk] = acc * inv;
        }
      }
    });
    return out;
  }

  // gate_up [T, 2I] -> silu(gate) * up [T, I]
  static at::Tensor silu_mul(const at::Tensor& gate_up) {
    const int64_t t = gate_up.size(0), inter = gate_up.size(1) / 2;
    at::Tensor out = at::empty({t, inter}, gate_up.options());
    const float* gp = gate_up.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t r = 0; r < t; ++r) {
      const float* g = gp + r * 2 * inter;
      const float* u = g + inter;
      float* o = op + r * inter;
      each(inter, [&](int64_t c, auto z) {
        const auto gate = ld(g + c, z);
        st(o + c, gate / (1.f + exp_approx(-gate)) * ld(u + c, z));
      });
    }
    return out;
  }

  int64_t hq_, hkv_, hd_;
  double eps_;
  at::Tensor embed_, norm_, cos_, sin_, cache_, keys_t_;
  std::vector<Layer> layers_;
  Projection head_;
  Clock clock_;
};

}  // namespace paradecode

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using paradecode::Int8Forward;
  py::class_<Int8Forward>(m, "Int8Forward")
      .def(py::init<int64_t, int64_t, int64_t, double, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                    at::Tensor>())
      .def("add_layer", &Int8Forward::add_layer)
      .def("set_head", &Int8Forward::set_head)
      .def("refresh_keys", &Int8Forward::refresh_keys)
      .def("set_packed_one_row", &Int8Forward::set_packed_one_row)
      .def("set_profiling", &Int8Forward::set_profiling)
      .def("stage_seconds", &Int8Forward::stage_seconds)
      .def("forward", &Int8Forward::forward, py::call_guard<py::gil_scoped_release>());
}
