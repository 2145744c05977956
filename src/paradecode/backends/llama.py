"""The reference backend: a compact Llama-family transformer of our own with a preallocated KV cache.

Reads Hugging Face Llama checkpoints (``config.json`` + ``model.safetensors``, or a loaded
``LlamaForCausalLM``) and reproduces transformers' logits in fp32. Built for small-batch CPU decoding:
q/k/v and gate/up are fused into one matmul each at load time, the residual adds ride on ``addmm``, RoPE
tables are computed once for every position, and attention is ``scaled_dot_product_attention`` with GQA.

Every projection is kept in both layouts, because MKL's best kernel depends on the row count: ``x @ W_t``
(``W_t`` = ``[in, out]``, contiguous) is 25-40% faster than ``F.linear`` for the 1-3 token forwards that
dominate decoding, and ``F.linear`` (``W`` = ``[out, in]``) is ~8% faster from 4 rows on (SmolLM2-135M,
one core). That doubles the weights' memory (about 0.5 GB more for SmolLM2) for speed at every T.

The cache is one tensor ``[layers, 2 * kv_heads, max_length, head_dim]`` (the keys' heads, then the values').
New tokens always take the next slots; ``positions`` only drive RoPE, so tree nodes can share a position.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from paradecode.backends import int8
from paradecode.backends.base import ForwardOutput, causal_mask

DEFAULT_MAX_LENGTH = 4096  # cap on the preallocated cache when the caller does not choose
DTYPES = ("fp32", "int8")  # weight formats: fp32 as in the checkpoint; int8 see paradecode.backends.int8


@dataclass(frozen=True)
class LlamaShape:
    """The numbers a Llama checkpoint's ``config.json`` fixes, in our names."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    rope: Mapping[str, Any]  # rope_type, rope_theta and the type's scaling parameters

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LlamaShape:
        """Parse a transformers Llama config dict (v4 ``rope_scaling`` or v5 ``rope_parameters`` style)."""
        if config.get("model_type") != "llama":
            raise ValueError(f"LlamaBackend reads Llama checkpoints only, got model_type {config.get('model_type')!r}")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"LlamaBackend supports the SiLU MLP only, got hidden_act {config['hidden_act']!r}")
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
        rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
        if rope["rope_type"] not in ("default", "llama3"):
            raise ValueError(f"unsupported rope_type {rope['rope_type']!r}; LlamaBackend knows 'default' and 'llama3'")
        num_heads = config["num_attention_heads"]
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            attention_bias=config.get("attention_bias", False),
            mlp_bias=config.get("mlp_bias", False),
            rope=rope,
        )


def rope_inv_freq(shape: LlamaShape) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies, with Llama-3 wavelength scaling when configured."""
    dim = shape.head_dim
    inv_freq = 1.0 / (shape.rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if shape.rope["rope_type"] == "llama3":
        factor = shape.rope["factor"]
        low, high = shape.rope["low_freq_factor"], shape.rope["high_freq_factor"]
        old_context = shape.rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept; the band between is interpolated.
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


WIDE_ROWS = 12  # up to this many tokens, the LM head computes W @ x.T (see _Linear.wide)
EXACT_ATTENTION_ROWS = 64  # int8: passes of up to this many new tokens compute attention in float64
FEW_ROWS = 3  # up to this many tokens, projections use x @ W_t; beyond, F.linear (see the module docstring)


@dataclass
class _Linear:
    """One projection ``x @ W.T + b``, its weight stored both ways."""

    weight: torch.Tensor  # [out, in]
    weight_t: torch.Tensor  # [in, out] contiguous
    bias: torch.Tensor | None  # [out]

    @classmethod
    def from_parts(cls, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor] | None) -> _Linear:
        """Stack the [out_i, in] matrices (and biases) into one projection."""
        weight = torch.cat(list(weights))
        return cls(weight, weight.t().contiguous(), torch.cat(list(biases)) if biases else None)

    def __call__(self, x: torch.Tensor, few_rows: bool) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        if few_rows:
            return torch.mm(x, self.weight_t) if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        return F.linear(x, self.weight, self.bias)

    def wide(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out] for a very wide projection (the LM head): measured on this CPU's MKL,
        ``W @ x.T`` is 2-3x faster than either other form for 2 <= T <= 12."""
        if not 2 <= x.shape[0] <= WIDE_ROWS:
            return self(x, x.shape[0] <= FEW_ROWS)
        out = torch.mm(self.weight, x.t()).t()  # [T, out]
        return out if self.bias is None else out + self.bias

    def add_to(self, residual: torch.Tensor, x: torch.Tensor, few_rows: bool) -> torch.Tensor:
        """residual [T, out] + projection of x [T, in]."""
        out = torch.addmm(residual, x, self.weight_t if few_rows else self.weight.t())
        return out if self.bias is None else out + self.bias


@dataclass
class _Layer:
    attn_norm: torch.Tensor  # [D]
    qkv: _Linear | int8.Int8Linear  # D -> (Hq + 2 * Hkv) * hd
    o: _Linear | int8.Int8Linear  # Hq * hd -> D
    mlp_norm: torch.Tensor  # [D]
    gate_up: _Linear | int8.Int8Linear  # D -> 2 * I
    down: _Linear | int8.Int8Linear  # I -> D
    keys: torch.Tensor  # [1, Hkv, max_length, hd] view into the cache
    values: torch.Tensor  # [1, Hkv, max_length, hd] view into the cache
    slots: torch.Tensor  # [2 * Hkv, max_length, hd] this layer's cache (key heads, then value heads), for writing


class LlamaBackend:
    """A Llama-family transformer that implements ``paradecode.backends.base.Backend``."""

    supports_tree = True

    def __init__(
        self,
        shape: LlamaShape,
        state: Mapping[str, torch.Tensor],
        max_length: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.shape = shape
        self.vocab_size = shape.vocab_size
        self.num_layers = shape.num_layers
        self.max_length = max_length or min(shape.max_position_embeddings, DEFAULT_MAX_LENGTH)
        self.dtype = "fp32" if dtype == torch.float32 else str(dtype).removeprefix("torch.")
        self._len = 0
        self._hidden_scale: torch.Tensor | None = None  # [D] undoes the LM head's smoothing on returned hidden
        self._native = None  # int8: the compiled forward pass (int8.native_forward), when it could be built
        self._keys_t: torch.Tensor | None = None  # the native pass's transposed keys (int8.native_forward)
        self.kernel_timings: dict[str, float] = {}  # int8: one-token forward time per one-row kernel tried

        def weight(name: str) -> torch.Tensor:
            return state[name].detach().to(dtype)

        def linear(projections: Sequence[str], has_bias: bool) -> _Linear:
            biases = [weight(f"{name}.bias") for name in projections] if has_bias else None
            return _Linear.from_parts([weight(f"{name}.weight") for name in projections], biases)

        hd, hkv = shape.head_dim, shape.num_kv_heads
        # Keys then values for each slot; every layer gets views for writing and for attention.
        self._cache = torch.zeros(shape.num_layers, 2 * hkv, self.max_length, hd, dtype=dtype)
        self._layers = []
        for i in range(shape.num_layers):
            attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            slots = self._cache[i]
            self._layers.append(
                _Layer(
                    attn_norm=weight(f"model.layers.{i}.input_layernorm.weight"),
                    qkv=linear([attn + "q_proj", attn + "k_proj", attn + "v_proj"], shape.attention_bias),
                    o=linear([attn + "o_proj"], shape.attention_bias),
                    mlp_norm=weight(f"model.layers.{i}.post_attention_layernorm.weight"),
                    gate_up=linear([mlp + "gate_proj", mlp + "up_proj"], shape.mlp_bias),
                    down=linear([mlp + "down_proj"], shape.mlp_bias),
                    keys=slots[:hkv].unsqueeze(0),
                    values=slots[hkv:].unsqueeze(0),
                    slots=slots,
                )
            )
        self._embed = weight("model.embed_tokens.weight")  # [V, D]
        self._norm = weight("model.norm.weight")  # [D]
        tied = shape.tie_word_embeddings or "lm_head.weight" not in state
        self._lm_head = _Linear.from_parts([self._embed if tied else weight("lm_head.weight")], None)  # D -> V
        # RoPE tables for every position, in the rotate-half layout: x * cos + roll(x, hd/2) * sin_signed.
        angles = torch.arange(self.max_length).float()[:, None] * rope_inv_freq(shape)[None]  # [P, hd/2]
        self._cos = torch.cat((angles, angles), -1).cos().to(dtype)  # [P, hd]
        self._sin = torch.cat((-angles.sin(), angles.sin()), -1).to(dtype)  # [P, hd]

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, max_length: int | None = None, dtype: str = "fp32",
        calibration: Sequence[Sequence[int]] = (), int8_state: Mapping[str, torch.Tensor] | None = None,
    ) -> LlamaBackend:
        """Load ``config.json`` and ``model.safetensors`` from a Hugging Face style directory; ``dtype`` is one of
        ``DTYPES`` (int8 wants ``calibration`` token sequences or a saved ``int8_state``, see ``quantize_int8``)."""
        from safetensors.torch import load_file

        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; LlamaBackend offers {', '.join(DTYPES)}")
        model_dir = Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        backend = cls(LlamaShape.from_config(config), load_file(model_dir / "model.safetensors"), max_length)
        if dtype == "int8":
            backend.quantize_int8(calibration, int8_state)
        return backend

    @classmethod
    def from_hf(cls, hf_model: Any, max_length: int | None = None) -> LlamaBackend:
        """Copy the weights of a loaded ``transformers.LlamaForCausalLM`` (kept in its dtype)."""
        state = hf_model.state_dict()
        dtype = state["model.embed_tokens.weight"].dtype
        return cls(LlamaShape.from_config(hf_model.config.to_dict()), state, max_length, dtype)

    def quantize_int8(self, calibration: Sequence[Sequence[int]] = (),
                      state: Mapping[str, torch.Tensor] | None = None) -> LlamaBackend:
        """Turn every projection and the LM head into ``int8.Int8Linear``: from fp32 with SmoothQuant factors
        calibrated on ``calibration`` token sequences, or from a ``state`` saved by ``int8.export_state``."""
        if self.dtype != "fp32":
            raise ValueError(f"quantize_int8 needs fp32 weights, this backend holds {self.dtype}")
        if state is not None:
            int8.import_state(self, state)
        else:
            int8.quantize_backend(self, calibration)
        self.dtype = "int8"
        self._cache_in(torch.float32)
        self._native = int8.native_forward(self)  # exact per-row attention in float32 loops
        if self._native is None:
            self._cache_in(torch.float64)  # the PyTorch path's exact attention reads it as it is (_exact_attention)
        self.kernel_timings = int8.choose_one_row_kernel(self)
        return self

    def _cache_in(self, dtype: torch.dtype) -> None:
        """Reallocate the (empty) KV cache in ``dtype`` and point every layer's views at it."""
        hkv = self.shape.num_kv_heads
        self._cache = torch.zeros(self._cache.shape, dtype=dtype)
        self._len = 0
        for layer, slots in zip(self._layers, self._cache):
            layer.slots = slots
            layer.keys, layer.values = slots[:hkv].unsqueeze(0), slots[hkv:].unsqueeze(0)

    @property
    def kernels(self) -> str:
        """Names what the forward runs on, for caches of measured speed (a new kernel measures anew)."""
        if self.dtype != "int8":
            return self.dtype
        from paradecode.backends import native

        return f"int8-v{int8.FORMAT}" + (f"-native-{native.build_key()}" if self._native is not None else "")

    def stage_seconds(self, work: Callable[[], Any]) -> dict[str, float] | None:
        """Run ``work`` (forwards on this backend) with the native pass timing its stages: seconds per stage
        (norm, quantize, gemm, dequantize, rope+kv, attention, silu*up, lm head), or None without it."""
        if self._native is None:
            return None
        self._native.set_profiling(True)
        try:
            work()
            return dict(self._native.stage_seconds())
        finally:
            self._native.set_profiling(False)

    @property
    def cache_len(self) -> int:
        return self._len

    def reset(self) -> None:
        self._len = 0

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot roll back to {length} tokens; the cache holds {self._len}")
        self._len = length

    def commit(self, start: int, keep: Sequence[int]) -> None:
        keep = list(keep)
        if keep and (start + keep[-1] >= self._len or keep[0] < 0):
            raise ValueError(f"commit keeps entries up to {start + keep[-1]}, the cache holds {self._len}")
        if keep != list(range(len(keep))):
            kept = torch.tensor(keep) + start  # [K] slots to move to start, start+1, ...
            self._cache[:, :, start : start + len(keep)] = self._cache[:, :, kept]
            if self._native is not None:
                self._native.refresh_keys(start, len(keep))  # its transposed copy of the keys
        self._len = start + len(keep)

    @staticmethod
    def _exact_attention(q: torch.Tensor, layer: _Layer, end: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of a few new tokens, q [T, Hq, hd], in float64 over the float64 cache -> [T, Hq * hd]
        float32. A row's result then does not depend on how many rows share the pass or how many masked keys
        follow its own: the float64 sums differ in their last bits at most, far below float32's rounding."""
        t = q.shape[0]
        q = q.transpose(0, 1).unsqueeze(0).double()  # [1, Hq, T, hd]
        attn = F.scaled_dot_product_attention(q, layer.keys[:, :, :end], layer.values[:, :, :end], attn_mask=mask,
                                              enable_gqa=True)  # [1, Hq, T, hd] float64
        return attn[0].transpose(0, 1).reshape(t, -1).float()

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor | None = None,  # [T] int64; None: cache_len .. cache_len+T-1
        mask: torch.Tensor | None = None,  # [T, cache_len+T] bool; None: causal
        *,
        return_hidden: bool = False,
        exit_layer: int | None = None,
        layers: Sequence[int] | None = None,
        logits: bool = True,
    ) -> ForwardOutput:
        t, start = token_ids.shape[0], self._len
        end = start + t
        if end > self.max_length:
            raise ValueError(f"{end} tokens do not fit the cache (max_length {self.max_length})")
        if exit_layer is not None and not 0 <= exit_layer <= self.num_layers:
            raise ValueError(f"exit_layer must be in [0, {self.num_layers}], got {exit_layer}")
        if layers is None:
            run_layers = self._layers[:exit_layer]
        elif exit_layer is not None:
            raise ValueError("give exit_layer or layers, not both")
        elif any(b <= a for a, b in zip(layers, layers[1:])) or any(not 0 <= i < self.num_layers for i in layers):
            raise ValueError(f"layers must be ascending indices in [0, {self.num_layers}), got {list(layers)}")
        else:
            run_layers = [self._layers[i] for i in layers]
        if mask is not None and mask.shape != (t, end):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(t, end)}")
        if self._native is not None:  # None stays None: the native pass is causal without a mask
            indices = range(self.num_layers) if layers is None else layers
            hidden, scores = self._native.forward(token_ids, start, positions, mask, list(indices)[:exit_layer],
                                                  logits)
            self._len = end
            return ForwardOutput(logits=scores if logits else None,
                                 hidden=hidden * self._hidden_scale if return_hidden else None)
        if mask is None:
            mask = causal_mask(start, t) if t > 1 else None  # one new token may see everything
        if positions is None:
            cos, sin = self._cos[start:end], self._sin[start:end]  # [T, hd]
        else:
            cos, sin = self._cos[positions], self._sin[positions]  # [T, hd]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, hd]

        s = self.shape
        hq, hkv, hd, d, half = s.num_heads, s.num_kv_heads, s.head_dim, s.hidden_size, s.head_dim // 2
        few_rows = t <= FEW_ROWS
        # int8 turns a last-bit difference in an activation into a whole quantization step, so the few-token
        # passes of decoding and verification must agree to the bit: their attention runs in float64 (see
        # _exact_attention); a long prefill keeps the fast fp32 kernel (its rows are never compared).
        exact_attention = self.dtype == "int8" and t <= EXACT_ATTENTION_ROWS
        x = F.embedding(token_ids, self._embed)  # [T, D]
        for layer in run_layers:
            h = F.rms_norm(x, (d,), layer.attn_norm, s.rms_norm_eps)  # [T, D]
            qkv = layer.qkv(h, few_rows).view(t, hq + 2 * hkv, hd)  # [T, Hq + 2Hkv, hd]
            qk = qkv[:, : hq + hkv]  # [T, Hq + Hkv, hd]
            qk = torch.addcmul(qk * cos, qk.roll(half, -1), sin)  # RoPE on queries and keys together
            layer.slots[:hkv, start:end] = qk[:, hq:].transpose(0, 1)
            layer.slots[hkv:, start:end] = qkv[:, hq + hkv :].transpose(0, 1)
            if exact_attention:
                attn = self._exact_attention(qk[:, :hq], layer, end, mask)  # [T, Hq * hd]
            else:
                q = qk[:, :hq].transpose(0, 1).unsqueeze(0)  # [1, Hq, T, hd]
                keys, values = layer.keys[:, :, :end], layer.values[:, :, :end]  # [1, Hkv, C+T, hd]
                if keys.dtype != q.dtype:  # the int8 backend's float64 cache, in a long prefill
                    keys, values = keys.to(q.dtype), values.to(q.dtype)
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True
                                                      )[0].transpose(0, 1).reshape(t, hq * hd)  # [T, Hq * hd]
            x = layer.o.add_to(x, attn, few_rows)  # [T, D]
            h = F.rms_norm(x, (d,), layer.mlp_norm, s.rms_norm_eps)
            gate, up = layer.gate_up(h, few_rows).chunk(2, dim=-1)  # [T, I] each
            x = layer.down.add_to(x, F.silu(gate) * up, few_rows)  # [T, D]
        self._len = end
        hidden = F.rms_norm(x, (d,), self._norm, s.rms_norm_eps)  # [T, D]
        scores = self._lm_head.wide(hidden).float() if logits else None  # [T, V]
        if return_hidden and self._hidden_scale is not None:
            hidden = hidden * self._hidden_scale  # the final norm's output before smoothing
        return ForwardOutput(logits=scores, hidden=hidden if return_hidden else None)

