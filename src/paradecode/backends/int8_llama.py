"""The int8 Llama backend: our Llama transformer with int8 weights and int8 activations (``backends/int8.py``).

``Int8LlamaBackend`` builds the fp32 model, calibrates SmoothQuant factors on a few token sequences, folds them
into the norms and replaces every projection and the LM head with an ``Int8Linear``. It then runs the whole
forward as one native call (``backends/native``) over a paged KV cache of its own (keys and values stored as
half floats), where the native kernels could be built; otherwise the PyTorch forward of ``LlamaBackend`` over the same projections, with attention in
float64 so that a row's result does not depend on the pass it rides in.

The native forward offers several exact int8 GEMM kernels (paradecode's own, fbgemm's, ``torch._int_mm``) that
give identical bits; which one runs for a pass of T new tokens (one token, a verify width, a prefill) is chosen
by timing them at the first load on a machine and kept in the model cache.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from paradecode.backends.base import ForwardOutput, Logits
from paradecode.backends.int8 import (FORMAT, PRECISE, PROJECTIONS, ChannelRecorder, Int8Linear, _clone, calibrate,
                                      expand_groups, grouped_smoothing, smoothing)
from paradecode.backends.llama import LlamaBackend, LlamaShape, _Layer
from paradecode.backends.native import logits_mode

if TYPE_CHECKING:
    from paradecode.backends.sequences import Batcher

PAGE = 64  # cache slots per page of the native cache (a power of two, a multiple of 16)
BUCKETS = {"one": 1, "verify": 8, "prefill": 64}  # pass sizes whose GEMM kernel is chosen, and the T timed for each


class Int8LlamaBackend(LlamaBackend):
    """A Llama-family transformer with int8 projections; implements ``paradecode.backends.base.Backend``."""

    DTYPE = "int8"  # what ``dtype`` reports, and part of the key of the kernel choice kept per machine

    def __init__(self, shape: LlamaShape, state: Mapping[str, torch.Tensor], max_length: int | None = None,
                 dtype: torch.dtype = torch.float32, *, calibration: Sequence[Sequence[int]] = (),
                 int8_state: Mapping[str, torch.Tensor] | None = None, kernel_cache: Path | None = None,
                 native: bool = True) -> None:
        """``state``: the fp32 checkpoint; then either ``calibration`` token sequences (quantize now) or an
        ``int8_state`` saved by ``export_state``. ``kernel_cache``: a folder for the GEMM kernel choice per
        machine; ``native=False`` keeps the PyTorch forward."""
        if dtype != torch.float32:
            raise ValueError(f"int8 quantizes fp32 weights, got {dtype}")
        super().__init__(shape, state, max_length)
        self._hidden_scale = torch.ones(shape.hidden_size)  # [D] undoes the LM head's smoothing on returned hidden
        if int8_state is not None:
            self._import_state(int8_state)
        else:
            self._quantize(calibration)
        self._start(kernel_cache, native)

    @classmethod
    def from_parts(cls, shape: LlamaShape, layers: Sequence[_Layer], embed: torch.Tensor, norm: torch.Tensor,
                   head: Int8Linear, max_length: int | None = None, *,
                   kernel_cache: Path | None = None) -> Int8LlamaBackend:
        """The native backend over parts already in their final form: each layer's norms and quantized
        projections (``Int8Linear``, or ``q4.Q4Linear`` on the q4 class), the fp32 embedding [V, D], the final norm
        and the int8 LM head. No fp32 model is built, so a model whose fp32 weights would not fit in memory loads
        (``benchmarks/scaling.py``'s synthetic 8B). It needs the native forward."""
        from paradecode.errors import ParadecodeError

        self = cls.__new__(cls)
        self._assemble(shape, list(layers), embed, norm, head, max_length)
        self._hidden_scale = torch.ones(shape.hidden_size)
        self._start(kernel_cache, native=True)
        if self._native is None:
            raise ParadecodeError("this model loads on the native forward only, which could not be built here")
        return self

    def _start(self, kernel_cache: Path | None, native: bool) -> None:
        """The native pass over the quantized weights (or the PyTorch forward's float64 cache) and its kernels."""
        self.dtype = self.DTYPE
        self._native = self._build_native() if native else None
        self.kernel_choice: dict[str, str] = {}  # bucket -> kernel, the native pass's GEMMs
        self.kernel_timings: dict[str, dict[str, float]] = {}  # bucket -> kernel -> seconds, when timed here
        if self._native is None:
            self._allocate_cache(torch.float64)  # _attention reads it in float64
        else:
            self._allocate_cache(torch.float32, 0)  # the native pass keeps its own cache
            self.choose_kernels(kernel_cache)

    # -- quantization --------------------------------------------------------------------------------------
    def _quantize(self, calibration: Sequence[Sequence[int]]) -> None:
        """Replace the fp32 projections and LM head with ``Int8Linear``, SmoothQuant factors (from one pass over
        ``calibration``) folded into the norms and the producing projections."""
        if not calibration:
            raise ValueError("int8 needs calibration text: at least one token sequence")

        def run(ids: Sequence[int]) -> None:
            self.reset()
            LlamaBackend.forward(self, torch.tensor(list(ids)[: self.max_length], dtype=torch.long))

        head = self._lm_head = ChannelRecorder(self._lm_head)
        try:
            stats = calibrate(run, self._layers, calibration)
        finally:
            self._lm_head = head.inner
            self.reset()
        s = self.shape
        hq, hkv, hd, inter = s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size
        v_rows = slice((hq + hkv) * hd, (hq + 2 * hkv) * hd)
        for layer, amax in zip(self._layers, stats):
            qkv_w, qkv_b = layer.qkv.weight.clone(), _clone(layer.qkv.bias)  # [(Hq + 2Hkv) hd, D]
            gate_up_w, gate_up_b = layer.gate_up.weight.clone(), _clone(layer.gate_up.bias)  # [2I, D]
            o_w, down_w = layer.o.weight, layer.down.weight
            m = smoothing(amax["qkv"], qkv_w)  # [D], into the attention norm
            layer.attn_norm, qkv_w = layer.attn_norm / m, qkv_w * m
            m = smoothing(amax["gate_up"], gate_up_w)  # [D], into the MLP norm
            layer.mlp_norm, gate_up_w = layer.mlp_norm / m, gate_up_w * m
            m = smoothing(amax["down"], down_w)  # [I], into the up rows
            gate_up_w[inter:] /= m[:, None]
            if gate_up_b is not None:
                gate_up_b[inter:] /= m
            down_w = down_w * m
            m = grouped_smoothing(amax["o"], o_w, hq, hkv, hd)  # [Hkv hd], into the v rows
            qkv_w[v_rows] /= m[:, None]
            if qkv_b is not None:
                qkv_b[v_rows] /= m
            o_w = o_w * expand_groups(m, hq, hkv, hd)
            weights = dict(qkv=(qkv_w, qkv_b), o=(o_w, layer.o.bias), gate_up=(gate_up_w, gate_up_b),
                           down=(down_w, layer.down.bias))
            for name, (weight, bias) in weights.items():
                setattr(layer, name, Int8Linear.from_float(weight, bias, precise=name in PRECISE))
        m = smoothing(head.amax, self._lm_head.weight)  # [D], into the final norm
        self._norm = self._norm / m
        self._hidden_scale = m
        self._lm_head = Int8Linear.from_float(self._lm_head.weight * m, None, precise=True)

    def export_state(self) -> dict[str, torch.Tensor]:
        """Everything quantization changed, as named tensors (to cache and pass back as ``int8_state``)."""
        state = {"norm": self._norm, "hidden_scale": self._hidden_scale,
                 "head.weight": self._lm_head.weight, "head.step": self._lm_head.step}
        for i, layer in enumerate(self._layers):
            state[f"{i}.attn_norm"], state[f"{i}.mlp_norm"] = layer.attn_norm, layer.mlp_norm
            for name in PROJECTIONS:
                linear = getattr(layer, name)
                state[f"{i}.{name}.weight"], state[f"{i}.{name}.step"] = linear.weight, linear.step
                if linear.bias is not None:
                    state[f"{i}.{name}.bias"] = linear.bias
        return {key: value.contiguous() for key, value in state.items()}

    def _import_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self._import_head(state)
        for i, layer in enumerate(self._layers):
            layer.attn_norm, layer.mlp_norm = state[f"{i}.attn_norm"], state[f"{i}.mlp_norm"]
            for name in PROJECTIONS:
                setattr(layer, name, Int8Linear(state[f"{i}.{name}.weight"], state[f"{i}.{name}.step"],
                                                state.get(f"{i}.{name}.bias"), precise=name in PRECISE))

    def _import_head(self, state: Mapping[str, torch.Tensor]) -> None:
        """The LM head of ``export_state``'s state, with the final norm and hidden scale its smoothing changed."""
        self._norm, self._hidden_scale = state["norm"], state["hidden_scale"]
        self._lm_head = Int8Linear(state["head.weight"], state["head.step"], None, precise=True)

    # -- the native pass ---------------------------------------------------------------------------------
    def _build_native(self):
        """The compiled forward over these weights and a paged cache of its own, or None without the kernels."""
        from paradecode.backends import native

        module = native.load()
        if module is None:
            return None
        slots = -(-self.max_length // PAGE) * PAGE
        stack, self._values, self._keys_t = self._native_stack(module, slots)
        self._pages = torch.arange(slots // PAGE, dtype=torch.int32)  # one sequence owns every page, in order
        return stack

    def _native_stack(self, module, slots: int):
        """A native forward over these weights with a cache of ``slots`` slots (a multiple of PAGE) of its own:
        (forward, values, keys). Half floats: [L, Hkv, slots, hd] values, keys in 16-slot blocks."""
        s = self.shape
        values = torch.zeros(s.num_layers, s.num_kv_heads, slots, s.head_dim, dtype=torch.float16)
        keys_t = torch.zeros(s.num_layers, s.num_kv_heads, slots // 16, s.head_dim, 16, dtype=torch.float16)
        stack = module.Int8Forward(s.num_heads, s.num_kv_heads, s.head_dim, s.rms_norm_eps, self._embed, self._norm,
                                   *self._rope_tables[0], values, keys_t, PAGE, scale=s.attention_scale or 0.0,
                                   gelu=s.activation == "gelu_tanh")
        none = torch.empty(0)  # a layer without per-head q/k norms
        for index, layer in enumerate(self._layers):
            cos, sin = self._rope_tables[self._rope_of[index]] if self._rope_of[index] else (None, None)
            stack.add_layer(layer.attn_norm, layer.mlp_norm, *(getattr(layer, name).parts() for name in PROJECTIONS),
                            none if layer.q_norm is None else layer.q_norm.float(),
                            none if layer.k_norm is None else layer.k_norm.float(),
                            post_attn_norm=layer.post_attn_norm, post_mlp_norm=layer.post_mlp_norm,
                            window=s.window(index) or 0, cos=cos, sin=sin)
        stack.set_head(self._lm_head.parts())
        return stack, values, keys_t

    @property
    def slot_bytes(self) -> int:
        """Bytes of the native cache per token slot (keys and values of every layer, half floats)."""
        s = self.shape
        return s.num_layers * s.num_kv_heads * s.head_dim * 2 * 2

    def batcher(self, cache_bytes: int, **limits) -> "Batcher | None":
        """A multi-sequence cache of about ``cache_bytes`` over these weights and the batcher that packs several
        sequences' passes into one native forward (``backends.sequences``); None without the native pass."""
        if self._native is None:
            return None
        from paradecode.backends import native
        from paradecode.backends.sequences import Batcher

        slots = max(PAGE, cache_bytes // self.slot_bytes // PAGE * PAGE)
        stack, values, keys_t = self._native_stack(native.load(), slots)
        stack.set_kernels(self._chosen_kernels())
        return Batcher(self, stack, (values, keys_t), slots // PAGE, PAGE, **limits)

    @property
    def kernels(self) -> str:
        """Names what the forward runs on, for caches of measured speed (a new kernel measures anew)."""
        if self._native is None:
            return f"int8-v{FORMAT}"
        from paradecode.backends import native

        chosen = "-".join(self.kernel_choice[bucket] for bucket in BUCKETS)
        return f"int8-v{FORMAT}-native-{native.build_key()}-{chosen}"

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights a one-token forward reads: every int8 projection and the LM head."""
        linears = [getattr(layer, name) for layer in self._layers for name in PROJECTIONS] + [self._lm_head]
        return sum(linear.nbytes for linear in linears)

    def kernel_report(self) -> dict:
        """What the forward runs on here: the native build's int8 instruction set, the kernel per bucket and
        the timings that chose it (empty without the native pass)."""
        if self._native is None:
            return {}
        return dict(isa=self._native.isa(), choice=dict(self.kernel_choice), timings=self.kernel_timings)

    def available_kernels(self) -> list[str]:
        """The GEMM kernels the native pass offers on this machine ([] without it)."""
        return list(self._native.kernels()) if self._native is not None else []

    def use_kernels(self, choice: Mapping[str, str]) -> None:
        """Run each bucket's passes (``one``, ``verify``, ``prefill``) on the named kernel."""
        unknown = sorted(set(choice) - set(BUCKETS)) + sorted(set(choice.values()) - set(self.available_kernels()))
        if unknown:
            raise ValueError(f"unknown bucket or unavailable kernel: {', '.join(unknown)}")
        current = self.kernel_choice or dict.fromkeys(BUCKETS, self.available_kernels()[0])
        self.kernel_choice = {bucket: choice.get(bucket, current[bucket]) for bucket in BUCKETS}
        self._native.set_kernels(self._chosen_kernels())

    def _chosen_kernels(self) -> list[str]:
        """The chosen kernel of each bucket, in the order the native pass takes them."""
        return [self.kernel_choice[bucket] for bucket in BUCKETS]

    def choose_kernels(self, cache: Path | None = None, repeats: int = 7) -> dict[str, str]:
        """Time every kernel on each bucket's pass size and keep the fastest per bucket (the results are
        identical; the speed depends on the machine). The kernels take turns, so drift in the machine's speed
        falls on all of them. A choice kept in ``cache`` for this build, machine and model shape is reused."""
        from paradecode.backends import native
        from paradecode.models import keep_whole
        from paradecode.profile import machine_key

        offered = self.available_kernels()
        key = hashlib.sha256(json.dumps([native.build_key(), machine_key(), repr(self.shape), self.dtype,
                                         offered]).encode())
        path = None if cache is None else Path(cache) / f"{key.hexdigest()[:16]}.json"
        if path is not None and path.is_file():
            try:
                saved = json.loads(path.read_text())
                self.use_kernels(saved["choice"])
                self.kernel_timings = saved["timings"]
                return self.kernel_choice
            except (ValueError, KeyError, TypeError, OSError):
                pass  # a stale or damaged file: measure again
        self.use_kernels(dict.fromkeys(BUCKETS, offered[0]))
        steady = True
        if len(offered) > 1:
            self.kernel_timings, steady = self._time_kernels(offered, repeats)
            self.use_kernels({bucket: min(times, key=times.get) for bucket, times in self.kernel_timings.items()})
        if path is not None and steady:  # a choice made while the machine was busy is used now, not kept
            saved = json.dumps(dict(choice=self.kernel_choice, timings=self.kernel_timings))
            keep_whole(path, lambda staging: staging.write_text(saved))  # read-only: the next load measures again
        return self.kernel_choice

    @torch.inference_mode()
    def _time_kernels(self, kernels: Sequence[str], repeats: int) -> tuple[dict[str, dict[str, float]], bool]:
        """Median seconds per bucket and kernel, and whether the timings were steady (every kernel's repeats
        within ``profile.STEADY_SPREAD`` of their median: other work on the machine spreads them)."""
        from paradecode.profile import STEADY_SPREAD, spread

        context = min(32, self.max_length - max(BUCKETS.values()) - 1)
        if context < 1:
            return {}, False
        ids = torch.arange(context + max(BUCKETS.values())) % self.vocab_size
        self.reset()
        self.forward(ids[:context], logits=False)
        timings, steady = {}, True
        for bucket, t in BUCKETS.items():
            # "interleaved" is a form of one-token passes (gemm.h, gemm_q4.h); in longer passes it differs from
            # "own" only in int8's two-row ones, so only the one-token bucket times it: at T=8 the two run the
            # same code, and the coin toss between them would decide how T=2 passes read their weights
            timed = [k for k in kernels if t == 1 or k != "interleaved"] or list(kernels)
            times: dict[str, list[float]] = {kernel: [] for kernel in timed}
            # one-token passes are the cheapest, and their kernels (the own kernel's one-row stream and its
            # interleaved form) may differ by a few percent only: four times the turns there
            rounds = 4 * repeats if t == 1 else repeats if t < 32 else max(2, repeats // 2)
            for i in range(rounds + 1):
                for kernel in times:
                    self._native.set_kernels([kernel] * len(BUCKETS))
                    start = time.perf_counter()
                    self.forward(ids[context : context + t])
                    if i:  # the first round warms every kernel up
                        times[kernel].append(time.perf_counter() - start)
                    self.rollback(context)
            timings[bucket] = {kernel: statistics.median(seconds) for kernel, seconds in times.items()}
            steady &= all(spread(seconds) <= STEADY_SPREAD for seconds in times.values())
        self.reset()
        return timings, steady

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

    # -- Backend -----------------------------------------------------------------------------------------
    def _move(self, kept: torch.Tensor, start: int) -> None:
        if self._native is None:
            return super()._move(kept, start)
        # logical slots are physical ones here: the pages are in order
        self._native.move_slots(kept, torch.arange(start, start + len(kept)))

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                *, return_hidden: bool = False, exit_layer: int | None = None, layers: Sequence[int] | None = None,
                logits: Logits = True, aux_layers: Sequence[int] = ()) -> ForwardOutput:
        # The native pass records nothing for autograd (it runs under its own no-grad guard), so only the torch
        # pass enters inference mode: torch's mode switch was a few Python calls a step, paid right after the
        # last forward had pushed them out of the caches.
        if self._native is None:
            with torch.inference_mode():
                return super().forward(token_ids, positions, mask, return_hidden=return_hidden,
                                       exit_layer=exit_layer, layers=layers, logits=logits, aux_layers=aux_layers)
        t, start = token_ids.shape[0], self._len
        indices = self._check_pass(t, mask, exit_layer, layers, aux_layers)
        hidden, scores, aux = self._native.forward(token_ids, positions, [(self._pages, start, t, mask)], indices,
                                                   logits_mode(logits), list(aux_layers))
        self._len = start + t
        return ForwardOutput(logits=scores if logits else None,
                             hidden=self._returned_hidden(hidden) if return_hidden else None, aux=aux)

    def _attention(self, q: torch.Tensor, layer: _Layer, end: int, mask: torch.Tensor | None) -> torch.Tensor:
        """int8 turns a last-bit difference in an activation into a whole quantization step, so a row's attention
        must not depend on the pass: float64 over the float64 cache, whose sums differ in their last bits at
        most, far below float32's rounding. (The fp32 calibration pass, on the fp32 cache, is plain attention.)"""
        if layer.keys.dtype != torch.float64:
            return super()._attention(q, layer, end, mask)
        t = q.shape[0]
        q = q.transpose(0, 1).unsqueeze(0).double()  # [1, Hq, T, hd]
        attn = F.scaled_dot_product_attention(q, layer.keys[:, :, :end], layer.values[:, :, :end], attn_mask=mask,
                                              scale=self.shape.attention_scale, enable_gqa=True)  # [1, Hq, T, hd]
        return attn[0].transpose(0, 1).reshape(t, -1).float()

    def _returned_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * self._hidden_scale  # the final norm's output before the LM head's smoothing


def int8_state(model_dir: Path, calibration: Sequence[Sequence[int]], cache: Path) -> dict[str, torch.Tensor]:
    """The int8 quantization of a Llama-family checkpoint folder (``Int8LlamaBackend.export_state``), kept in
    ``cache`` after the first load (calibration and the weight clipping search take ~20 s per 100M parameters,
    reading them back well under a second)."""
    from safetensors.torch import load_file

    from paradecode.models import keep_tensors

    weights = model_dir / "model.safetensors"
    key = hashlib.sha256(json.dumps([str(weights.resolve()), weights.stat().st_size, weights.stat().st_mtime_ns,
                                     FORMAT, [list(ids) for ids in calibration]]).encode()).hexdigest()[:16]
    path = cache / "int8" / f"{model_dir.name}-{key}.safetensors"
    if path.is_file():
        return load_file(path)
    print(f"paradecode: quantizing {model_dir.name} to int8 (calibration and weight clipping, once: about 20 s per "
          "100M parameters) ...",
          file=sys.stderr, flush=True)
    longest = max((len(ids) for ids in calibration), default=1)  # the calibration pass's cache, no longer
    state = Int8LlamaBackend.from_pretrained(model_dir, longest, calibration=calibration, native=False).export_state()
    keep_tensors(state, path)  # a read-only cache only costs the next load the same quantization
    return state


def load_int8(model_dir: Path, max_length: int | None, calibration: Sequence[Sequence[int]],
              cache: Path) -> Int8LlamaBackend:
    """The int8 backend of a Llama checkpoint folder (its quantized weights kept in ``cache``: ``int8_state``)."""
    return Int8LlamaBackend.from_pretrained(model_dir, max_length, int8_state=int8_state(model_dir, calibration, cache),
                                            kernel_cache=cache / "kernels")
