"""The reference backend: a compact Llama-family transformer of our own with a preallocated KV cache.

Reads Hugging Face checkpoints of the Llama family (``ARCHITECTURES``: Llama, Mistral, Qwen2, Qwen3, Gemma-3;
``config.json`` + ``model.safetensors``, or a loaded transformers model) and reproduces transformers' logits in
fp32. Built for small-batch CPU decoding:
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
from functools import cached_property, partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from paradecode.backends.base import ForwardOutput, SlotCache, causal_mask, check_aux_layers

DEFAULT_MAX_LENGTH = 4096  # cap on the preallocated cache when the caller does not choose


# The architectures the Llama forward runs, as transformers' config.json names them (model_type), and what each
# changes: Mistral is Llama's layout with a sliding window on every layer; Qwen2 adds biases to q, k and v (not o)
# and, with use_sliding_window, windows on the layers from max_window_layers on;
# Qwen3 normalizes each query and key head (RMSNorm over head_dim) before RoPE; Gemma-3 (its text model) adds to
# Qwen3's norms a norm after the attention and after the MLP, scales the embeddings by sqrt(hidden size), multiplies
# by (1 + w) in every norm, gates its MLP with tanh-approximated GELU, scales scores by query_pre_attn_scalar^-0.5,
# and has sliding-window layers with a RoPE base of their own among full-attention ones.
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # config name -> ours


@dataclass(frozen=True)
class LlamaShape:
    """The numbers a Llama-family checkpoint's ``config.json`` fixes, in our names."""

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
    attention_bias: bool  # biases on q, k and v
    mlp_bias: bool
    rope: Mapping[str, Any]  # rope_type, rope_theta and the type's scaling parameters
    o_bias: bool = False  # a bias on the attention's output projection (Llama's attention_bias has both)
    qk_norm: bool = False  # RMSNorm of each query and key head before RoPE (Qwen3, Gemma-3)
    # Per layer: a row at position p sees cache slots > p - window (Mistral, Gemma-3's sliding layers); () or None: all
    windows: tuple[int | None, ...] = ()
    local_rope: Mapping[str, Any] | None = None  # the RoPE of the windowed layers where it differs (Gemma-3)
    activation: str = "silu"  # the MLP's gate: "silu" or "gelu_tanh"
    sandwich_norms: bool = False  # RMSNorm of the attention's and the MLP's outputs before the residual add
    unit_offset_norms: bool = False  # every norm multiplies by (1 + weight) (Gemma)
    embed_scale: float = 1.0  # the embeddings are multiplied by this (Gemma: sqrt(hidden_size))
    attention_scale: float | None = None  # scores are multiplied by this; None: head_dim ** -0.5
    architecture: str = "llama"

    def window(self, layer: int) -> int | None:
        """How far back layer ``layer`` attends (None: the whole cache)."""
        return self.windows[layer] if self.windows else None

    def layer_rope(self, layer: int) -> Mapping[str, Any]:
        """The RoPE parameters of layer ``layer``."""
        return self.local_rope if self.local_rope is not None and self.window(layer) is not None else self.rope

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LlamaShape:
        """Parse a transformers config dict of one of ARCHITECTURES (v4 ``rope_scaling`` or v5 ``rope_parameters``
        style); anything else is a ValueError naming what is supported."""
        architecture = config.get("model_type")
        if architecture not in ARCHITECTURES:
            raise ValueError(f"the Llama forward runs {', '.join(ARCHITECTURES)} checkpoints, not model_type "
                             f"{architecture!r}")
        gemma = architecture == "gemma3_text"
        act = config.get("hidden_activation" if gemma else "hidden_act", "gelu_pytorch_tanh" if gemma else "silu")
        if act not in ACTIVATIONS:
            raise ValueError(f"the Llama forward supports the SiLU MLP and Gemma's tanh-GELU MLP only, got "
                             f"hidden_act {act!r}")
        for key in ("final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention"):
            if config.get(key):
                raise ValueError(f"{architecture} with {key}={config[key]!r} is not supported")
        parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
        local_rope = None
        if gemma:  # one RoPE per layer type
            local_rope = _rope(parameters.get("sliding_attention") or {}, config.get("rope_local_base_freq", 10000.0))
            parameters = parameters.get("full_attention") or config.get("rope_scaling") or {}
        rope = _rope(parameters, config.get("rope_theta", 10000.0))
        bias = bool(config.get("attention_bias", False))
        num_heads, num_layers = config["num_attention_heads"], config["num_hidden_layers"]
        window = config.get("sliding_window")
        windows: tuple[int | None, ...] = ()
        if architecture == "mistral" and window:
            windows = (window,) * num_layers
        elif gemma or config.get("use_sliding_window"):
            windows = tuple(window if kind == "sliding_attention" else None for kind in _layer_types(config))
        head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            tie_word_embeddings=config.get("tie_word_embeddings", gemma),
            attention_bias=True if architecture == "qwen2" else bias,
            mlp_bias=config.get("mlp_bias", False),
            rope=rope,
            o_bias=False if architecture == "qwen2" else bias,
            qk_norm=architecture in ("qwen3", "gemma3_text"),
            windows=windows,
            local_rope=local_rope,
            activation=ACTIVATIONS[act],
            sandwich_norms=gemma,
            unit_offset_norms=gemma,
            embed_scale=config["hidden_size"] ** 0.5 if gemma else 1.0,
            attention_scale=config.get("query_pre_attn_scalar", 256) ** -0.5 if gemma else None,
            architecture=architecture,
        )


def _layer_types(config: Mapping[str, Any]) -> list[str]:
    """Each layer's attention, "sliding_attention" or "full_attention": as ``layer_types`` says (transformers v5),
    else as older configs imply it (Gemma-3: every ``sliding_window_pattern``-th layer full; Qwen2/3 with
    use_sliding_window: the layers from ``max_window_layers`` on sliding)."""
    layers = config["num_hidden_layers"]
    if config.get("layer_types"):
        return list(config["layer_types"])
    if config.get("model_type") == "gemma3_text":
        pattern = config.get("sliding_window_pattern", 6)
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    first = config.get("max_window_layers", layers)
    return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]


def _rope(parameters: Mapping[str, Any], theta: float) -> dict[str, Any]:
    """One layer type's RoPE parameters, checked: rope_type, rope_theta and the type's scaling parameters."""
    rope = dict(parameters)
    rope.setdefault("rope_theta", theta)
    rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    if rope["rope_type"] not in ("default", "llama3"):
        raise ValueError(f"unsupported rope_type {rope['rope_type']!r}; the Llama forward knows 'default' and "
                         "'llama3'")
    return rope


def rope_inv_freq(shape: LlamaShape, rope: Mapping[str, Any] | None = None) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies of ``rope`` (default: the shape's), with Llama-3 wavelength
    scaling when configured."""
    dim, rope = shape.head_dim, shape.rope if rope is None else rope
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope["rope_type"] == "llama3":
        factor = rope["factor"]
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        old_context = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept; the band between is interpolated.
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


WIDE_ROWS = 12  # up to this many tokens, the LM head computes W @ x.T (see _Linear.wide)
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
    qkv: _Linear  # D -> (Hq + 2 * Hkv) * hd (or any projection with _Linear's call signature, e.g. int8's)
    o: _Linear  # Hq * hd -> D
    mlp_norm: torch.Tensor  # [D]
    gate_up: _Linear  # D -> 2 * I
    down: _Linear  # I -> D
    q_norm: torch.Tensor | None = None  # [hd] RMSNorm weight of every query head (Qwen3, Gemma-3), else None
    k_norm: torch.Tensor | None = None  # [hd] of every key head
    post_attn_norm: torch.Tensor | None = None  # [D] norm of the attention's output (Gemma-3's sandwich), else None
    post_mlp_norm: torch.Tensor | None = None  # [D] norm of the MLP's output
    keys: torch.Tensor | None = None  # [1, Hkv, max_length, hd] view into the cache
    values: torch.Tensor | None = None  # [1, Hkv, max_length, hd] view into the cache
    slots: torch.Tensor | None = None  # [2 * Hkv, max_length, hd] this layer's cache (keys, then values), for writing


class LlamaBackend(SlotCache):
    """A Llama-family transformer that implements ``paradecode.backends.base.Backend``."""

    supports_tree = True

    def __init__(
        self,
        shape: LlamaShape,
        state: Mapping[str, torch.Tensor],
        max_length: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        def weight(name: str) -> torch.Tensor:
            return state[name].detach().to(dtype)

        def norm(name: str) -> torch.Tensor:  # Gemma's norms multiply by (1 + w): that factor, once
            return (state[name].detach().float() + 1).to(dtype) if shape.unit_offset_norms else weight(name)

        def linear(projections: Sequence[str], has_bias: bool) -> _Linear:
            biases = [weight(f"{name}.bias") for name in projections] if has_bias else None
            return _Linear.from_parts([weight(f"{name}.weight") for name in projections], biases)

        layers = []
        for i in range(shape.num_layers):
            attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            # Llama's post_attention_layernorm is its pre-MLP norm; Gemma-3 names that one pre_feedforward_layernorm
            mlp_norm = "pre_feedforward_layernorm" if shape.sandwich_norms else "post_attention_layernorm"
            layers.append(
                _Layer(
                    attn_norm=norm(f"model.layers.{i}.input_layernorm.weight"),
                    qkv=linear([attn + "q_proj", attn + "k_proj", attn + "v_proj"], shape.attention_bias),
                    o=linear([attn + "o_proj"], shape.o_bias),
                    mlp_norm=norm(f"model.layers.{i}.{mlp_norm}.weight"),
                    gate_up=linear([mlp + "gate_proj", mlp + "up_proj"], shape.mlp_bias),
                    down=linear([mlp + "down_proj"], shape.mlp_bias),
                    q_norm=norm(attn + "q_norm.weight") if shape.qk_norm else None,
                    k_norm=norm(attn + "k_norm.weight") if shape.qk_norm else None,
                    post_attn_norm=norm(f"model.layers.{i}.post_attention_layernorm.weight")
                    if shape.sandwich_norms else None,
                    post_mlp_norm=norm(f"model.layers.{i}.post_feedforward_layernorm.weight")
                    if shape.sandwich_norms else None,
                )
            )
        embed = weight("model.embed_tokens.weight")  # [V, D]
        tied = shape.tie_word_embeddings or "lm_head.weight" not in state
        head = _Linear.from_parts([embed if tied else weight("lm_head.weight")], None)  # D -> V
        self._assemble(shape, layers, embed, norm("model.norm.weight"), head, max_length, dtype)
        self._allocate_cache(dtype)

    def _assemble(self, shape: LlamaShape, layers: list[_Layer], embed: torch.Tensor, norm: torch.Tensor, head: Any,
                  max_length: int | None, dtype: torch.dtype = torch.float32) -> None:
        """Take the model's parts as they are (the projections may be any with ``_Linear``'s call signature) and
        compute the RoPE tables; no cache yet."""
        self.shape = shape
        self.vocab_size = shape.vocab_size
        self.num_layers = shape.num_layers
        self.max_length = max_length or min(shape.max_position_embeddings, DEFAULT_MAX_LENGTH)
        self.dtype = "fp32" if dtype == torch.float32 else str(dtype).removeprefix("torch.")
        self._len = 0
        if shape.embed_scale != 1.0:  # [V, D] scaled once, as transformers scales each lookup (in the weights' dtype)
            embed = embed * torch.tensor(shape.embed_scale, dtype=embed.dtype)
        self._layers, self._embed, self._norm, self._lm_head = layers, embed, norm, head  # [V, D], [D], D -> V
        # RoPE tables for every position, in the rotate-half layout: x * cos + roll(x, hd/2) * sin_signed; a second
        # pair where the windowed layers have a RoPE of their own (Gemma-3), and each layer's index into them.
        self._rope_tables = [self._rope_table(shape, rope, dtype) for rope in (shape.rope, shape.local_rope) if rope]
        self._rope_of = [int(shape.layer_rope(i) is not shape.rope) for i in range(shape.num_layers)]

    def _rope_table(self, shape: LlamaShape, rope: Mapping[str, Any], dtype: torch.dtype):
        """(cos [P, hd], sin [P, hd]) of ``rope`` for every position of the cache."""
        angles = torch.arange(self.max_length).float()[:, None] * rope_inv_freq(shape, rope)[None]  # [P, hd/2]
        return (torch.cat((angles, angles), -1).cos().to(dtype),
                torch.cat((-angles.sin(), angles.sin()), -1).to(dtype))

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, max_length: int | None = None, **kwargs: Any) -> LlamaBackend:
        """Load ``config.json`` and ``model.safetensors`` from a Hugging Face style directory (extra keyword
        arguments go to the class's constructor, e.g. the int8 backend's calibration)."""
        from safetensors.torch import load_file

        model_dir = Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        return cls(LlamaShape.from_config(config), load_file(model_dir / "model.safetensors"), max_length, **kwargs)

    @classmethod
    def from_hf(cls, hf_model: Any, max_length: int | None = None, **kwargs: Any) -> LlamaBackend:
        """Copy the weights of a loaded ``transformers.LlamaForCausalLM`` (kept in its dtype)."""
        state = hf_model.state_dict()
        dtype = state["model.embed_tokens.weight"].dtype
        return cls(LlamaShape.from_config(hf_model.config.to_dict()), state, max_length, dtype, **kwargs)

    def _allocate_cache(self, dtype: torch.dtype, length: int | None = None) -> None:
        """A new, empty KV cache of ``length`` slots (default max_length) in ``dtype``; every layer's views."""
        hkv = self.shape.num_kv_heads
        length = self.max_length if length is None else length
        # Keys then values for each slot; every layer gets views for writing and for attention.
        self._cache = torch.zeros(self.num_layers, 2 * hkv, length, self.shape.head_dim, dtype=dtype)
        self._len = 0
        for layer, slots in zip(self._layers, self._cache):
            layer.slots = slots
            layer.keys, layer.values = slots[:hkv].unsqueeze(0), slots[hkv:].unsqueeze(0)

    @property
    def kernels(self) -> str:
        """Names what the forward runs on, for caches of measured speed (a new kernel measures anew)."""
        return self.dtype

    def stage_seconds(self, work: Callable[[], Any]) -> dict[str, float] | None:
        """Seconds per stage of the forwards ``work`` runs, where the backend has a stage clock (else None)."""
        return None

    def _move(self, kept: torch.Tensor, start: int) -> None:
        self._cache[:, :, start : start + len(kept)] = self._cache[:, :, kept]

    def _attention(self, q: torch.Tensor, layer: _Layer, end: int, mask: torch.Tensor | None) -> torch.Tensor:
        """q [T, Hq, hd] (RoPE applied) against the cache's first ``end`` slots -> [T, Hq * hd]."""
        t = q.shape[0]
        q = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, T, hd]
        attn = F.scaled_dot_product_attention(q, layer.keys[:, :, :end], layer.values[:, :, :end], attn_mask=mask,
                                              scale=self.shape.attention_scale, enable_gqa=True)  # [1, Hq, T, hd]
        return attn[0].transpose(0, 1).reshape(t, -1)

    def _returned_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm's output as callers see it (a quantized variant undoes what it folded into it)."""
        return hidden

    def _check_pass(self, t: int, mask: torch.Tensor | None, exit_layer: int | None,
                    layers: Sequence[int] | None, aux_layers: Sequence[int] = ()) -> tuple[int, ...]:
        """Check a forward's arguments against the cache; returns the indices of the layers to run."""
        end = self._len + t
        if end > self.max_length:
            raise ValueError(f"{end} tokens do not fit the cache (max_length {self.max_length})")
        if mask is not None and mask.shape != (t, end):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(t, end)}")
        return self.pass_layers(exit_layer, layers, aux_layers)

    def pass_layers(self, exit_layer: int | None, layers: Sequence[int] | None,
                    aux_layers: Sequence[int] = ()) -> tuple[int, ...]:
        """The layers a pass runs (``layer_indices``), its ``aux_layers`` checked against them; a plain pass's
        (every layer, no aux) is worked out once: it is every decode step's, and this runs between forwards."""
        if exit_layer is None and layers is None and not aux_layers:
            return self._every_layer
        indices = tuple(self.layer_indices(exit_layer, layers))
        check_aux_layers(aux_layers, indices)
        return indices

    @cached_property
    def _every_layer(self) -> tuple[int, ...]:
        return tuple(self.layer_indices(None, None))

    def layer_indices(self, exit_layer: int | None, layers: Sequence[int] | None) -> list[int]:
        """The layers a forward runs: all, the first ``exit_layer``, or ``layers`` (checked)."""
        if exit_layer is not None and not 0 <= exit_layer <= self.num_layers:
            raise ValueError(f"exit_layer must be in [0, {self.num_layers}], got {exit_layer}")
        if layers is None:
            return list(range(self.num_layers))[:exit_layer]
        if exit_layer is not None:
            raise ValueError("give exit_layer or layers, not both")
        if any(b <= a for a, b in zip(layers, layers[1:])) or any(not 0 <= i < self.num_layers for i in layers):
            raise ValueError(f"layers must be ascending indices in [0, {self.num_layers}), got {list(layers)}")
        return list(layers)

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
        aux_layers: Sequence[int] = (),
    ) -> ForwardOutput:
        t, start = token_ids.shape[0], self._len
        end = start + t
        indices = self._check_pass(t, mask, exit_layer, layers, aux_layers)
        run_layers = [self._layers[i] for i in indices]
        if positions is None:
            positions = torch.arange(start, end)
        ropes = [(cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)) for cos, sin in self._rope_tables]
        masks = {None: mask if mask is not None or t == 1 else causal_mask(start, t)}  # one new token sees all
        for window in {w for w in self.shape.windows if w is not None}:  # a row sees the slots > its position - window
            near = torch.arange(end)[None, :] > positions[:, None] - window  # [T, end]
            masks[window] = near if masks[None] is None else masks[None] & near

        s = self.shape
        hq, hkv, hd, d, half = s.num_heads, s.num_kv_heads, s.head_dim, s.hidden_size, s.head_dim // 2
        few_rows = t <= FEW_ROWS
        act = F.silu if s.activation == "silu" else partial(F.gelu, approximate="tanh")
        x = F.embedding(token_ids, self._embed)  # [T, D]
        aux = []
        for index, layer in zip(indices, run_layers):
            if index in aux_layers:
                aux.append(x)
            h = F.rms_norm(x, (d,), layer.attn_norm, s.rms_norm_eps)  # [T, D]
            qkv = layer.qkv(h, few_rows).view(t, hq + 2 * hkv, hd)  # [T, Hq + 2Hkv, hd]
            qk = qkv[:, : hq + hkv]  # [T, Hq + Hkv, hd]
            if layer.q_norm is not None:
                qk = torch.cat((F.rms_norm(qk[:, :hq], (hd,), layer.q_norm, s.rms_norm_eps),
                                F.rms_norm(qk[:, hq:], (hd,), layer.k_norm, s.rms_norm_eps)), 1)
            cos, sin = ropes[self._rope_of[index]]  # [T, 1, hd]
            qk = torch.addcmul(qk * cos, qk.roll(half, -1), sin)  # RoPE on queries and keys together
            layer.slots[:hkv, start:end] = qk[:, hq:].transpose(0, 1)
            layer.slots[hkv:, start:end] = qkv[:, hq + hkv :].transpose(0, 1)
            attn = self._attention(qk[:, :hq], layer, end, masks[s.window(index)])  # [T, Hq * hd]
            if layer.post_attn_norm is None:
                x = layer.o.add_to(x, attn, few_rows)  # [T, D]
            else:
                x = x + F.rms_norm(layer.o(attn, few_rows), (d,), layer.post_attn_norm, s.rms_norm_eps)
            h = F.rms_norm(x, (d,), layer.mlp_norm, s.rms_norm_eps)
            gate, up = layer.gate_up(h, few_rows).chunk(2, dim=-1)  # [T, I] each
            if layer.post_mlp_norm is None:
                x = layer.down.add_to(x, act(gate) * up, few_rows)  # [T, D]
            else:
                x = x + F.rms_norm(layer.down(act(gate) * up, few_rows), (d,), layer.post_mlp_norm, s.rms_norm_eps)
        self._len = end
        hidden = F.rms_norm(x, (d,), self._norm, s.rms_norm_eps)  # [T, D]
        scores = self._lm_head.wide(hidden).float() if logits else None  # [T, V]
        return ForwardOutput(logits=scores, hidden=self._returned_hidden(hidden) if return_hidden else None,
                             aux=torch.cat(aux, dim=-1) if aux else None)

