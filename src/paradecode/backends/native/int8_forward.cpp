// The int8 Llama forward pass in one native call (see paradecode/backends/native/__init__.py).
//
// Every step is a loop over raw rows: RMSNorm, per-token int8 quantization (projection.h), the exact int8 GEMMs
// (gemm.h, or fbgemm / torch._int_mm where timing at load says they are faster), RoPE and the KV write,
// attention over a paged cache (attention.h), SiLU-times-up, dequantization with the residual add.
//
// Exactness: every row is computed on its own, in an order that does not depend on how many rows share the
// pass or which sequences they come from: integer sums are exact in any kernel, and the float loops reduce in a
// fixed order per row. A verified draft row therefore computes bit for bit what a one-token forward of the same
// token computes later, whatever else is in the batch. That is what keeps speculative decoding on this backend
// equal to plain decoding, and a request's answer the same alone or batched.
//
// The cache, in half floats: values [layers, Hkv, slots, hd] and keys transposed in 16-slot blocks [layers, Hkv,
// slots / 16, hd, 16], both addressed by physical slot; each sequence maps its logical slots to physical pages of
// `page` slots through its page table (a single sequence may simply own all pages in order).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attention.h"
#include "lanes.h"
#include "projection.h"

namespace paradecode {

// What a forward computes of the LM head (paradecode.backends.native.logits_mode gives Python's side of it).
constexpr int64_t kNoLogits = 0, kFullLogits = 1, kArgmaxLogits = 2;

class Int8Forward {
 public:
  // scale: what scores are multiplied by (0: 1 / sqrt(head_dim)); gelu: the MLP gates with tanh-approximated GELU
  // (Gemma) instead of SiLU.
  Int8Forward(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, at::Tensor embed, at::Tensor norm,
              at::Tensor cos, at::Tensor sin, at::Tensor values, at::Tensor keys_t, int64_t page, double scale,
              bool gelu)
      : hq_(heads), hkv_(kv_heads), hd_(head_dim), eps_(eps), embed_(embed.contiguous()), norm_(norm.contiguous()),
        cos_(cos.contiguous()), sin_(sin.contiguous()), values_(values), keys_t_(keys_t),
        scale_(scale > 0 ? static_cast<float>(scale) : 1.f / std::sqrt(static_cast<float>(head_dim))), gelu_(gelu) {
    TORCH_CHECK(page >= kLanes && (page & (page - 1)) == 0, "the page size must be a power of two of at least 16");
    TORCH_CHECK(hq_ % hkv_ == 0, "query heads must be a multiple of kv heads");
    page_shift_ = 0;
    while ((int64_t{1} << page_shift_) < page) ++page_shift_;
    check_cache();
    kernels_.fill(kOwn);
  }

  // The same weights (shared, not packed again) over another cache and RoPE tables: a second sequence's forward.
  Int8Forward with_cache(at::Tensor values, at::Tensor keys_t, at::Tensor cos, at::Tensor sin) const {
    Int8Forward other(*this);
    other.values_ = values;
    other.keys_t_ = keys_t;
    other.cos_ = cos.contiguous();
    other.sin_ = sin.contiguous();
    other.check_cache();
    other.clock_ = Clock();
    return other;
  }

  // q_norm, k_norm: [head_dim] float32 weights of a per-head RMSNorm before RoPE (Qwen3), or empty tensors;
  // post_attn_norm, post_mlp_norm: [D] norms of the attention's and the MLP's outputs before the residual add
  // (Gemma-3), or empty; window: rows see the logical slots past their position - window (0: all); cos, sin: this
  // layer's RoPE tables [positions, head_dim], or empty for the forward's own.
  void add_layer(at::Tensor attn_norm, at::Tensor mlp_norm, const py::tuple& qkv, const py::tuple& o,
                 const py::tuple& gate_up, const py::tuple& down, at::Tensor q_norm, at::Tensor k_norm,
                 std::optional<at::Tensor> post_attn, std::optional<at::Tensor> post_mlp, int64_t window,
                 std::optional<at::Tensor> layer_cos, std::optional<at::Tensor> layer_sin) {
    const auto given = [](const std::optional<at::Tensor>& t) { return t ? t->contiguous() : at::empty({0}); };
    const at::Tensor post_attn_norm = given(post_attn), post_mlp_norm = given(post_mlp);
    const at::Tensor cos = given(layer_cos), sin = given(layer_sin);
    TORCH_CHECK(q_norm.numel() == k_norm.numel() && (q_norm.numel() == 0 || q_norm.numel() == hd_),
                "q_norm and k_norm must both be empty or both [head_dim]");
    const int64_t d = embed_.size(1);
    TORCH_CHECK(post_attn_norm.numel() == post_mlp_norm.numel() &&
                    (post_attn_norm.numel() == 0 || post_attn_norm.numel() == d),
                "post_attn_norm and post_mlp_norm must both be empty or both [hidden]");
    TORCH_CHECK(attn_norm.numel() == 0 || attn_norm.numel() == d || attn_norm.numel() == 2 * d,
                "attn_norm must be empty, [hidden] or [2 * hidden] (EAGLE-3: the embedding's and the feature's)");
    TORCH_CHECK(window >= 0, "a window is a count of slots, or 0 for none");
    TORCH_CHECK(cos.numel() == sin.numel() && (cos.numel() == 0 || (cos.dim() == 2 && cos.size(1) == hd_ &&
                                                                    cos.size(0) == cos_.size(0))),
                "a layer's cos and sin must both be empty or both [positions, head_dim] like the forward's");
    layers_.push_back(Layer{attn_norm.contiguous(), mlp_norm.contiguous(), projection(qkv), projection(o),
                            projection(gate_up), projection(down), q_norm.contiguous(), k_norm.contiguous(),
                            post_attn_norm, post_mlp_norm, window, cos, sin});
  }

  void set_head(const py::tuple& head) { head_ = projection(head); }

  // forward's first output: the residual stream after the layers (an EAGLE-3 head's feature for its next draft),
  // with the LM head still on the final-normed rows; by default the final-normed rows themselves.
  void set_output_residual(bool on) { output_residual_ = on; }

  // A projection applied to the rows given as `inputs` to forward, making them the [T, D] residual stream (EAGLE's
  // fc over [embedding ; feature]); without one, such rows enter as they are.
  void set_input(const py::tuple& input) { input_ = projection(input); }

  // The kernels this build and these weights offer (fbgemm only where PyTorch could prepack every weight).
  std::vector<std::string> kernels() const {
    std::vector<std::string> out = {kKernelNames[kOwn], kKernelNames[kInterleaved]};
    bool fbgemm = static_cast<bool>(head_.packed), int8 = !head_.is_q4(), amx = amx_ready() && amx_fits(head_.k);
    std::vector<const Projection*> all;
    if (input_) all.push_back(&*input_);
    for (const auto& layer : layers_)
      for (const Projection* p : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) all.push_back(p);
    for (const Projection* p : all) {
      fbgemm &= static_cast<bool>(p->packed);
      int8 &= !p->is_q4();
      amx &= p->is_q4() || amx_fits(p->k);
    }
    if (fbgemm) out.push_back(kKernelNames[kFbgemm]);
    if (int8) out.push_back(kKernelNames[kIntMm]);  // torch._int_mm has no 4-bit form
    // AMX tiles: int8 weights whose k fits whole tile steps (4-bit weights always do: a step is one group)
    if (amx) out.push_back(kKernelNames[kAmx]);
    return out;
  }

  // One kernel name per bucket (one token, verify widths, longer passes).
  void set_kernels(const std::vector<std::string>& names) {
    TORCH_CHECK(static_cast<int>(names.size()) == kBuckets, "give one kernel per bucket");
    const auto offered = kernels();
    for (int b = 0; b < kBuckets; ++b) {
      TORCH_CHECK(std::find(offered.begin(), offered.end(), names[b]) != offered.end(), "kernel ", names[b],
                  " is not available here");
      for (int k = 0; k < kKernelCount; ++k)
        if (names[b] == kKernelNames[k]) kernels_[b] = static_cast<Kernel>(k);
    }
  }

  static std::string isa() { return gemm_isa(); }

  // Copy the cache entries of physical slots src[i] to dst[i], in order (commit moves kept slots down).
  void move_slots(const at::Tensor& src, const at::Tensor& dst) {
    TORCH_CHECK(src.numel() == dst.numel(), "src and dst differ in length");
    const int64_t* sp = src.data_ptr<int64_t>();
    const int64_t* dp = dst.data_ptr<int64_t>();
    const int64_t layers = values_.size(0);
    for (int64_t layer = 0; layer < layers; ++layer) {
      const LayerCache cache = layer_cache(layer);
      for (int64_t g = 0; g < hkv_; ++g) {
        for (int64_t i = 0; i < src.numel(); ++i) {
          if (sp[i] == dp[i]) continue;
          std::copy(cache.value(g, sp[i]), cache.value(g, sp[i]) + hd_, cache.value(g, dp[i]));
          const half* from = cache.key_block(g, sp[i]) + sp[i] % kLanes;
          half* to = cache.key_block(g, dp[i]) + dp[i] % kLanes;
          for (int64_t c = 0; c < hd_; ++c) to[c * kLanes] = from[c * kLanes];
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

  // ids [T] int64 and positions [T] int64 (RoPE), or None: each row at its logical slot (a chain or prompt that
  // follows its sequence's cache; a torch call less a step for the caller); segments: (page table int32 [pages],
  // start, count, mask [count, start + count] bool or None) whose counts add up to T, rows in segment order;
  // layers: indices to run; capture: layer indices (ascending, among those run) whose input, the residual stream
  // entering the layer, is copied out (EAGLE-3's features); inputs: float32 [T, K] rows that replace the
  // embeddings of `ids` (which is then ignored), through the input projection where one is set; without one, rows
  // [T, D] are the residual stream, and rows [T, 2D] are [embedding ; feature] pairs whose feature half is (EAGLE-3's
  // layer). A layer with an empty attention norm feeds its input to q/k/v as it is, one with a [2D] norm feeds
  // [norm(embedding) ; norm(residual)] (its two halves' weights), and an empty final norm returns the residual
  // stream. logits_mode: kNoLogits (a prefill skips the LM head), kFullLogits, or kArgmaxLogits (each row's argmax
  // and its value exact, the rest within the precise head's residual of it: Projection::apply_argmax);
  // logits_from: the LM head runs on rows [logits_from, T) only, each with the bits it has in a pass of all T (a
  // head's catch-up feed reads its last pair's draft distribution only, so its other pairs skip the LM head in the
  // same pass). Returns (final-normed hidden [T, D], logits [T - logits_from, V] or undefined, captured
  // [T, capture.size() * D] or undefined).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& ids,
                                                         const std::optional<at::Tensor>& positions,
                                                         const py::list& segment_list,
                                                         const std::vector<int64_t>& layers, int64_t logits_mode,
                                                         const std::vector<int64_t>& capture, bool hold_gil,
                                                         const std::optional<at::Tensor>& inputs,
                                                         int64_t logits_from) {
    at::NoGradGuard no_grad;
    TORCH_CHECK(logits_mode == kNoLogits || logits_mode == kFullLogits || logits_mode == kArgmaxLogits,
                "logits_mode must be 0 (none), 1 (full) or 2 (argmax)");
    const int64_t t = inputs ? inputs->size(0) : ids.size(0), d = embed_.size(1);
    TORCH_CHECK(!inputs || (inputs->dim() == 2 && inputs->scalar_type() == at::kFloat &&
                            (inputs->size(1) == (input_ ? input_->k : d) || (!input_ && inputs->size(1) == 2 * d))),
                "inputs must be float32 [T, ", input_ ? input_->k : d, "]", input_ ? "" : " or [T, 2 * hidden]");
    TORCH_CHECK(logits_from >= 0 && (logits_from < t || logits_mode == kNoLogits),
                "logits_from must be a row of the pass (0 .. T - 1), got ", logits_from, " of ", t);
    TORCH_CHECK(!positions || (positions->numel() == t && positions->scalar_type() == at::kLong),
                "positions must be [T] int64 or None");
    std::vector<at::Tensor> keep_alive;
    std::vector<Segment> segments = parse_segments(segment_list, t, keep_alive);
    at::Tensor pos;
    if (positions) {
      pos = positions->contiguous();
    } else {
      pos = at::empty({t}, at::kLong);
      int64_t* at_slot = pos.data_ptr<int64_t>();
      for (const Segment& segment : segments)
        for (int64_t i = 0; i < segment.count; ++i) at_slot[segment.first_row + i] = segment.start + i;
    }
    const int64_t* pp = pos.data_ptr<int64_t>();
    for (int64_t r = 0; r < t; ++r)
      TORCH_CHECK(pp[r] >= 0 && pp[r] < cos_.size(0), "position ", pp[r], " is outside the RoPE table");
    // The segments are read: the rest runs without Python, and lets other threads run Python meanwhile unless
    // the caller holds on (`hold_gil`: see backends/sequences.py, Batcher.hold_gil).
    std::optional<py::gil_scoped_release> no_gil;
    if (!hold_gil) no_gil.emplace();
    const Kernel kernel = kernels_[bucket_of(t)];
    at::Tensor x;  // [T, D] the residual stream
    at::Tensor pairs;  // [T, 2D] [embedding ; feature] rows for a layer that norms both (EAGLE-3), or undefined
    if (!inputs) {
      x = embed_.index_select(0, ids).contiguous();
    } else if (!input_ && inputs->size(1) == 2 * d) {
      pairs = inputs->contiguous();
      x = pairs.narrow(1, d, d).clone(at::MemoryFormat::Contiguous);  // the residual stream starts at the
      // feature (a copy: of one row, contiguous() would be the caller's tensor, and the pass writes the stream)
    } else if (input_) {
      const at::Tensor in = inputs->contiguous();
      x = at::empty({t, d}, in.options());
      Clock input_clock;
      input_->apply(kernel, in.data_ptr<float>(), t, x.data_ptr<float>(), false, input_clock, ws_);
    } else {
      x = inputs->clone(at::MemoryFormat::Contiguous);
    }
    h_.resize(t * d);
    const int64_t captures = static_cast<int64_t>(capture.size());
    at::Tensor captured;  // undefined (None) when nothing is captured
    if (captures > 0) captured = at::empty({t, captures * d}, x.options());
    int64_t next_capture = 0;
    clock_.start();
    for (int64_t index : layers) {
      TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(layers_.size()), "layer index out of range");
      const Layer& layer = layers_[index];
      const LayerCache cache = layer_cache(index);
      float* xp = x.data_ptr<float>();
      if (next_capture < captures && capture[next_capture] == index) {
        float* to = captured.data_ptr<float>() + next_capture * d;
        for (int64_t r = 0; r < t; ++r) std::copy(xp + r * d, xp + (r + 1) * d, to + r * captures * d);
        ++next_capture;
      }
      if (layer.attn_norm.numel() == 2 * d) {  // q/k/v read [norm(embedding) ; norm(residual)], 2D wide
        TORCH_CHECK(pairs.defined(), "a layer with a [2 * hidden] attention norm reads [embedding ; feature] rows: "
                                     "give them as inputs [T, 2 * hidden]");
        h_.resize(t * 2 * d);
        rms_norm(pairs.data_ptr<float>(), t, layer.attn_norm.narrow(0, 0, d), h_.data(), false, 2 * d, 2 * d);
        rms_norm(xp, t, layer.attn_norm.narrow(0, d, d), h_.data() + d, false, d, 2 * d);
      } else if (layer.attn_norm.numel() > 0) {
        rms_norm(xp, t, layer.attn_norm, h_.data());
      } else {
        std::copy(xp, xp + t * d, h_.data());
      }
      clock_.lap(kNorm);
      qkv_.resize(t * layer.qkv.out_features());
      layer.qkv.apply(kernel, h_.data(), t, qkv_.data(), false, clock_, ws_);
      rope_and_store(qkv_.data(), t, layer, pos.data_ptr<int64_t>(), segments, cache);
      clock_.lap(kRope);
      attn_.resize(t * hq_ * hd_);
      attention(qkv_.data(), layer, segments, cache, t, pos.data_ptr<int64_t>());
      clock_.lap(kAttention);
      add_output(layer.o, layer.post_attn_norm, kernel, attn_.data(), t, xp);
      rms_norm(xp, t, layer.mlp_norm, h_.data());
      clock_.lap(kNorm);
      gate_up_.resize(t * layer.gate_up.out_features());
      layer.gate_up.apply(kernel, h_.data(), t, gate_up_.data(), false, clock_, ws_);
      gate_mul(t, layer.gate_up.out_features() / 2);
      clock_.lap(kSilu);
      add_output(layer.down, layer.post_mlp_norm, kernel, act_.data(), t, xp);
    }
    TORCH_CHECK(next_capture == captures, "capture must list ascending indices of layers the pass runs");
    at::Tensor hidden = norm_.numel() > 0 ? at::empty_like(x) : x;
    if (norm_.numel() > 0) rms_norm(x.data_ptr<float>(), t, norm_, hidden.data_ptr<float>());
    at::Tensor logits;  // undefined (None) when not wanted: a prefill skips the LM head
    if (logits_mode != kNoLogits) {
      const int64_t rows = t - logits_from;
      const float* from = hidden.data_ptr<float>() + logits_from * d;
      logits = at::empty({rows, head_.out_features()}, x.options());
      Clock head_clock;
      if (logits_mode == kArgmaxLogits)
        head_.apply_argmax(kernel, from, rows, logits.data_ptr<float>(), head_clock, ws_);
      else
        head_.apply(kernel, from, rows, logits.data_ptr<float>(), false, head_clock, ws_);
    }
    clock_.lap(kHead);
    return {output_residual_ ? x : hidden, logits, captured};
  }

 private:
  // (weight, step, fbgemm packed or None, bias or None, precise), or ("blocks", packed, n, k, bias or None, parts):
  // a checkpoint's blocks, `parts` a list of (columns, bits, m stored) (make_q4_projection).
  Projection projection(const py::tuple& parts) {
    if (py::isinstance<py::str>(parts[0])) {
      TORCH_CHECK(parts[0].cast<std::string>() == "blocks" && parts.size() == 6, "unknown projection format ",
                  parts[0].cast<std::string>());
      auto bias = parts[4].is_none() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(parts[4].cast<at::Tensor>());
      return make_q4_projection(parts[1].cast<at::Tensor>(), parts[2].cast<int64_t>(), parts[3].cast<int64_t>(), bias,
                                parts[5].cast<std::vector<std::tuple<int64_t, int, bool>>>());
    }
    auto bias = parts[3].is_none() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(parts[3].cast<at::Tensor>());
    return make_projection(parts[0].cast<at::Tensor>(), parts[1].cast<at::Tensor>(), parts[2], bias,
                           parts[4].cast<bool>());
  }

  void check_cache() const {
    TORCH_CHECK(values_.is_contiguous() && values_.scalar_type() == at::kHalf && values_.dim() == 4 &&
                    values_.size(1) == hkv_ && values_.size(3) == hd_,
                "values must be a contiguous float16 [layers, kv_heads, slots, head_dim]");
    TORCH_CHECK(keys_t_.is_contiguous() && keys_t_.scalar_type() == at::kHalf && keys_t_.dim() == 5 &&
                    keys_t_.size(2) * kLanes == values_.size(2) && keys_t_.size(3) == hd_ && keys_t_.size(4) == kLanes,
                "keys_t must be a contiguous float16 [layers, kv_heads, slots / 16, head_dim, 16]");
    TORCH_CHECK(values_.size(2) % (int64_t{1} << page_shift_) == 0, "the page size must divide the cache");
    TORCH_CHECK(layers_.empty() || values_.size(0) >= static_cast<int64_t>(layers_.size()),
                "the cache must hold every layer");
    TORCH_CHECK(cos_.dim() == 2 && cos_.size(1) == hd_ && sin_.sizes() == cos_.sizes(),
                "cos and sin must be [positions, head_dim]");
    for (const Layer& layer : layers_)
      TORCH_CHECK(layer.cos.numel() == 0 || layer.cos.size(0) == cos_.size(0),
                  "a layer's own RoPE tables must cover the forward's positions");
  }

  LayerCache layer_cache(int64_t layer) const {
    return {reinterpret_cast<half*>(keys_t_[layer].data_ptr<at::Half>()),
            reinterpret_cast<half*>(values_[layer].data_ptr<at::Half>()), values_.size(2), page_shift_, hd_};
  }

  std::vector<Segment> parse_segments(const py::list& list, int64_t t, std::vector<at::Tensor>& keep_alive) const {
    std::vector<Segment> segments;
    int64_t row = 0;
    const int64_t page = int64_t{1} << page_shift_, physical_pages = values_.size(2) / page;
    for (const auto& item : list) {
      const py::tuple parts = item.cast<py::tuple>();
      at::Tensor pages = parts[0].cast<at::Tensor>().contiguous();
      TORCH_CHECK(pages.scalar_type() == at::kInt, "a page table must be int32");
      const int64_t start = parts[1].cast<int64_t>(), count = parts[2].cast<int64_t>();
      TORCH_CHECK(start >= 0 && count >= 1 && start + count <= pages.numel() * page,
                  "a segment's slots must fit its page table");
      const int32_t* pp = pages.data_ptr<int32_t>();
      for (int64_t i = 0; i < (start + count + page - 1) / page; ++i)
        TORCH_CHECK(pp[i] >= 0 && pp[i] < physical_pages, "a page table names a page outside the cache");
      const bool* mask = nullptr;
      if (!parts[3].is_none()) {
        at::Tensor m = parts[3].cast<at::Tensor>().contiguous();
        TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 2 && m.size(0) == count && m.size(1) == start + count,
                    "a segment's mask must be bool [count, start + count]");
        mask = m.data_ptr<bool>();
        keep_alive.push_back(m);
      }
      keep_alive.push_back(pages);
      at::Tensor physical = at::empty({start + count}, at::kLong);  // every layer reads slots through it
      int64_t* phys = physical.data_ptr<int64_t>();
      for (int64_t j = 0; j < start + count; ++j)
        phys[j] = (static_cast<int64_t>(pp[j >> page_shift_]) << page_shift_) | (j & (page - 1));
      keep_alive.push_back(physical);
      segments.push_back(Segment{pp, start, count, mask, row, phys});
      row += count;
    }
    TORCH_CHECK(row == t, "the segments' rows do not add up to the pass");
    return segments;
  }

  // out = RMSNorm(x) * weight, or with add, out += that (a sandwich norm's residual add).
  // Rows of x (x_stride apart; 0: the weight's length) normed into out (out_stride apart; 0: the same).
  void rms_norm(const float* x, int64_t t, const at::Tensor& weight, float* out, bool add = false,
                int64_t x_stride = 0, int64_t out_stride = 0) const {
    const int64_t d = weight.size(0);
    if (x_stride == 0) x_stride = d;
    if (out_stride == 0) out_stride = d;
    const float* w = weight.data_ptr<float>();
    at::parallel_for(0, t, kRowGrain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = x + r * x_stride;
        const float inv = 1.f / std::sqrt(dot(row, row, d) / static_cast<float>(d) + static_cast<float>(eps_));
        float* o = out + r * out_stride;
        if (add) {
          each(d, [&](int64_t c, auto z) { st(o + c, ld(o + c, z) + ld(row + c, z) * inv * ld(w + c, z)); });
        } else {
          each(d, [&](int64_t c, auto z) { st(o + c, ld(row + c, z) * inv * ld(w + c, z)); });
        }
      }
    });
  }

  // x [T, D] += the projection of in, or with a post norm (Gemma-3), += RMSNorm(projection) * post_norm.
  void add_output(const Projection& projection, const at::Tensor& post_norm, Kernel kernel, const float* in, int64_t t,
                  float* x) {
    if (post_norm.numel() == 0) return projection.apply(kernel, in, t, x, true, clock_, ws_);
    out_.resize(t * projection.out_features());
    projection.apply(kernel, in, t, out_.data(), false, clock_, ws_);
    rms_norm(out_.data(), t, post_norm, x, true);
    clock_.lap(kNorm);
  }

  // RoPE (rotate-half layout) on the query and key heads of qkv [T, width], in place, after the layer's per-head
  // RMSNorm where it has one; keys (transposed) and values go to each row's physical slot.
  void rope_and_store(float* qkv, int64_t t, const Layer& layer, const int64_t* pos,
                      const std::vector<Segment>& segments, const LayerCache& cache) const {
    const int64_t half_dim = hd_ / 2, width = layer.qkv.out_features();
    const float* cosp = (layer.cos.numel() ? layer.cos : cos_).data_ptr<float>();
    const float* sinp = (layer.sin.numel() ? layer.sin : sin_).data_ptr<float>();
    const bool normed = layer.q_norm.numel() > 0;
    const float* q_norm = normed ? layer.q_norm.data_ptr<float>() : nullptr;
    const float* k_norm = normed ? layer.k_norm.data_ptr<float>() : nullptr;
    for (const Segment& segment : segments) {
      at::parallel_for(0, segment.count, kRowGrain, [&](int64_t i0, int64_t i1) {
        std::vector<float> rotated(hd_);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t r = segment.first_row + i;
          const float* c = cosp + pos[r] * hd_;
          const float* s = sinp + pos[r] * hd_;
          for (int64_t head = 0; head < hq_ + hkv_; ++head) {
            float* x = qkv + r * width + head * hd_;
            if (normed) {
              const float* w = head < hq_ ? q_norm : k_norm;
              const float inv = 1.f / std::sqrt(dot(x, x, hd_) / static_cast<float>(hd_) + static_cast<float>(eps_));
              for (int64_t j = 0; j < hd_; ++j) x[j] = x[j] * inv * w[j];
            }
            for (int64_t j = 0; j < half_dim; ++j) rotated[j] = x[j] * c[j] + x[j + half_dim] * s[j];
            for (int64_t j = half_dim; j < hd_; ++j) rotated[j] = x[j] * c[j] + x[j - half_dim] * s[j];
            std::copy(rotated.begin(), rotated.end(), x);
          }
          const int64_t slot = cache.physical(segment.pages, segment.start + i);
          for (int64_t g = 0; g < hkv_; ++g) {
            const float* key = qkv + r * width + (hq_ + g) * hd_;
            const float* value = qkv + r * width + (hq_ + hkv_ + g) * hd_;
            half* v = cache.value(g, slot);
            for (int64_t j = 0; j < hd_; ++j) v[j] = to_half(value[j]);
            half* kb = cache.key_block(g, slot) + slot % kLanes;
            for (int64_t j = 0; j < hd_; ++j) kb[j * kLanes] = to_half(key[j]);
          }
        }
      });
    }
  }

  // Work units of attention: (segment, kv head, rows, query heads), small enough to share key loads among
  // at most kMaxQueries queries, and numerous enough for every thread.
  struct Unit {
    int64_t segment, g, r0, r1, h0, h1;
  };

  void attention(const float* qkv, const Layer& layer, const std::vector<Segment>& segments, const LayerCache& cache,
                 int64_t t, const int64_t* positions) {
    const int64_t group = hq_ / hkv_;
    const AttentionShape shape{hq_, hkv_, hd_, layer.qkv.out_features(), scale_, layer.window, positions};
    // The query heads of a kv head score against its keys loaded once, unless that leaves a thread idle: then
    // each query head is a unit of its own. One token of SmolLM2-135M (3 kv heads of 3 query heads each) on 2
    // threads, 30 layers of attention alone after 256 cached tokens: 3 units of 3 heads 0.21-0.27 ms, 9 units of
    // one head 0.27-0.31 ms (three pairs, AMD EPYC Zen 4), though one thread gets two units and the other one;
    // after 1,024 the two were within the noise (1.1-1.7 ms: the cache read dominates there).
    int64_t heads_per_unit = std::min<int64_t>(group, kMaxQueries);
    int64_t rows_per_unit = kMaxQueries / heads_per_unit;
    int64_t grouped_units = 0;
    for (const Segment& segment : segments) grouped_units += hkv_ * ((segment.count + rows_per_unit - 1) / rows_per_unit);
    if (grouped_units < at::get_num_threads()) {
      heads_per_unit = 1;
      rows_per_unit = kMaxQueries;
    }
    units_.clear();
    for (int64_t s = 0; s < static_cast<int64_t>(segments.size()); ++s)
      for (int64_t g = 0; g < hkv_; ++g)
        for (int64_t r0 = 0; r0 < segments[s].count; r0 += rows_per_unit)
          for (int64_t h0 = 0; h0 < group; h0 += heads_per_unit)
            units_.push_back(Unit{s, g, r0, std::min(segments[s].count, r0 + rows_per_unit), h0,
                                  std::min(group, h0 + heads_per_unit)});
    // Costliest first (a unit's queries times the slots its last row sees), taken one at a time from a shared
    // counter: the later rows of a causal pass see more slots, so equal halves of the units in order left one
    // thread the cheap first rows and the other the dear last ones. Whichever thread runs a unit, its bits are
    // the same.
    auto cost = [&](const Unit& u) { return (u.r1 - u.r0) * (u.h1 - u.h0) * (segments[u.segment].start + u.r1); };
    std::sort(units_.begin(), units_.end(), [&](const Unit& a, const Unit& b) { return cost(a) > cost(b); });
    float* out = attn_.data();
    const int64_t n = static_cast<int64_t>(units_.size());
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n), 1, [&](int64_t, int64_t) {
      AttentionScratch scratch;
      for (int64_t u = next.fetch_add(1, std::memory_order_relaxed); u < n;
           u = next.fetch_add(1, std::memory_order_relaxed)) {
        const Unit& unit = units_[u];
        attend(shape, cache, segments[unit.segment], unit.g, unit.r0, unit.r1, unit.h0, unit.h1, qkv, out, scratch);
      }
    });
  }

  // gate_up [T, 2I] -> act [T, I] = silu(gate) * up, or with gelu_ gelu_tanh(gate) * up, where
  // gelu_tanh(x) = x (1 + tanh(u)) / 2 = x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3).
  void gate_mul(int64_t t, int64_t inter) {
    act_.resize(t * inter);
    const float* gp = gate_up_.data();
    float* op = act_.data();
    const bool gelu = gelu_;
    at::parallel_for(0, t, kRowGrain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* g = gp + r * 2 * inter;
        const float* u = g + inter;
        float* o = op + r * inter;
        if (gelu) {
          each(inter, [&](int64_t c, auto z) {
            const auto gate = ld(g + c, z);
            const auto two_u = gate * (1.5957691216057308f + gate * gate * 0.07135481627159981f);
            st(o + c, gate / (1.f + exp_approx(-two_u)) * ld(u + c, z));
          });
        } else {
          each(inter, [&](int64_t c, auto z) {
            const auto gate = ld(g + c, z);
            st(o + c, gate / (1.f + exp_approx(-gate)) * ld(u + c, z));
          });
        }
      }
    });
  }

  int64_t hq_, hkv_, hd_, page_shift_;
  double eps_;
  at::Tensor embed_, norm_, cos_, sin_, values_, keys_t_;
  float scale_;
  bool gelu_;
  bool output_residual_ = false;  // set_output_residual
  std::vector<Layer> layers_;
  Projection head_;
  std::optional<Projection> input_;
  std::array<Kernel, kBuckets> kernels_;
  Clock clock_;
  Workspace ws_;
  std::vector<float> h_, qkv_, attn_, gate_up_, act_, out_;
  std::vector<Unit> units_;
};

// Each row's argmax of a float32 [T, V] tensor (torch.argmax's answer, NaN and ties included), without Python:
// greedy verification needs only these, and torch's reduction took ~40 us a row of 49,152 logits. On the calling
// thread only (a request's thread in the server must not start an OpenMP team of its own).
std::vector<int64_t> row_argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0,
              "row_argmax takes a contiguous float32 [T, V] tensor with V > 0");
  const int64_t t = logits.size(0), v = logits.size(1);
  const float* p = logits.data_ptr<float>();
  std::vector<int64_t> out(t);
  py::gil_scoped_release no_gil;
  for (int64_t r = 0; r < t; ++r) out[r] = argmax(p + r * v, v);
  return out;
}

// Memory read bandwidth in GB/s: the best of `repeats` passes summing a buffer of `megabytes` (choose one several
// times the last-level cache) over every thread, the rate a weight-bound forward can at best read its weights.
double read_bandwidth(int64_t megabytes, int64_t repeats) {
  const int64_t words = megabytes * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(int64_t));
  std::vector<int64_t> buffer(words, 1);
  double best = 0;
  for (int64_t rep = 0; rep < repeats; ++rep) {
    std::atomic<int64_t> total{0};
    const auto start = std::chrono::steady_clock::now();
    at::parallel_for(0, words, 1 << 16, [&](int64_t w0, int64_t w1) {
      int64_t a = 0, b = 0, c = 0, d = 0;
      int64_t w = w0;
      for (; w + 4 <= w1; w += 4) {
        a += buffer[w];
        b += buffer[w + 1];
        c += buffer[w + 2];
        d += buffer[w + 3];
      }
      for (; w < w1; ++w) a += buffer[w];
      total += a + b + c + d;
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    TORCH_CHECK(total.load() == words, "the bandwidth probe miscounted");
    best = std::max(best, static_cast<double>(words) * sizeof(int64_t) / seconds / 1e9);
  }
  return best;
}

}  // namespace paradecode

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("read_bandwidth", &paradecode::read_bandwidth, py::call_guard<py::gil_scoped_release>());
  m.def("row_argmax", &paradecode::row_argmax);
  using paradecode::Int8Forward;
  py::class_<Int8Forward>(m, "Int8Forward")
      .def(py::init<int64_t, int64_t, int64_t, double, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                    at::Tensor, int64_t, double, bool>(),
           py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("eps"), py::arg("embed"),
           py::arg("norm"), py::arg("cos"), py::arg("sin"), py::arg("values"), py::arg("keys_t"), py::arg("page"),
           py::arg("scale") = 0.0, py::arg("gelu") = false)
      .def("add_layer", &Int8Forward::add_layer, py::arg("attn_norm"), py::arg("mlp_norm"), py::arg("qkv"),
           py::arg("o"), py::arg("gate_up"), py::arg("down"), py::arg("q_norm"), py::arg("k_norm"),
           py::arg("post_attn_norm") = py::none(), py::arg("post_mlp_norm") = py::none(), py::arg("window") = 0,
           py::arg("cos") = py::none(), py::arg("sin") = py::none())
      .def("set_head", &Int8Forward::set_head)
      .def("set_input", &Int8Forward::set_input)
      .def("set_output_residual", &Int8Forward::set_output_residual)
      .def("with_cache", &Int8Forward::with_cache, py::arg("values"), py::arg("keys_t"), py::arg("cos"), py::arg("sin"))
      .def("kernels", &Int8Forward::kernels)
      .def("set_kernels", &Int8Forward::set_kernels)
      .def_static("isa", &Int8Forward::isa)
      .def("move_slots", &Int8Forward::move_slots)
      .def("set_profiling", &Int8Forward::set_profiling)
      .def("stage_seconds", &Int8Forward::stage_seconds)
      .def("forward", &Int8Forward::forward, py::arg("ids"), py::arg("positions"), py::arg("segments"),
           py::arg("layers"), py::arg("logits_mode"), py::arg("capture") = std::vector<int64_t>(),
           py::arg("hold_gil") = false, py::arg("inputs") = py::none(), py::arg("logits_from") = 0);
}
