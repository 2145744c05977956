"""int8 projections for the Llama backend: int8 weights per output channel, int8 activations per token.

    y[t, n] = sum_k x[t, k] W[n, k]
            ~ a[t] s[n] sum_k round(127 x[t, k] / a[t]) round(127 W[n, k] / s[n]) / 127^2   (int8 x int8 -> int32)

``a[t] = max_k |x[t, k]|`` is taken per token at run time, ``s[n]`` per output channel at load (the clipping
that minimises the row's squared rounding error, searched over a few ratios of its max). The integer sum is
exact and every row is quantized on its own, so a token's output does not depend on the other tokens of the
forward pass: verifying 8 draft tokens gives each row the logits a one-token forward gives it, which keeps
speculative decoding on this backend equal to plain decoding. (A per-tensor activation scale, as PyTorch's
dynamic quantized linear uses, would tie the rows together.)

A few input channels carry values 10-100x the rest for every token (after the MLP's ``silu(gate) * up`` most),
and would flatten the other channels to a handful of levels. SmoothQuant moves that range into the weights:
input channel k is divided by ``m[k] = amax_x[k]^alpha / amax_W[k]^(1 - alpha)`` and the weight's column k
multiplied by it. The product is unchanged and the division is folded into what produces x — the RMSNorm
weights before q/k/v, gate/up and the LM head, the ``up`` rows before ``down``, the ``v`` rows before ``o`` —
so it costs nothing at run time. ``amax_x`` comes from one fp32 pass over calibration text at load.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

FORMAT = 3  # bump when the quantized state changes meaning (invalidates cached int8 weights)
CLIP_RATIOS = (1.0, 0.97, 0.94, 0.91, 0.88, 0.85, 0.8, 0.75)  # weight scale candidates, as fractions of the max
SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength; 0.5 measured best of 0.4 / 0.5 / 0.6 / 0.7 on SmolLM2


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> ([N, K] int8, [N] float32 scale s[n] / 127), per output channel, clipped for least error."""
    weight = weight.float()
    amax = weight.abs().amax(dim=1).clamp_min(1e-12)  # [N]
    best_scale, best_error = None, None
    for ratio in CLIP_RATIOS:
        scale = amax * (ratio / 127.0)  # [N]
        error = (((weight / scale[:, None]).round().clamp(-127, 127) * scale[:, None] - weight) ** 2).sum(1)
        if best_error is None:
            best_scale, best_error = scale, error
        else:
            better = error < best_error
            best_scale, best_error = torch.where(better, scale, best_scale), torch.minimum(error, best_error)
    q = (weight / best_scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, best_scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] float -> ([T, K] integers in [-127, 127], still float32; [T, 1] a[t] = max |x[t]|): symmetric,
    one scale per row; the row is q * a / 127."""
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-12)  # [T, 1] (linalg's inf-norm is 10x slower here)
    return torch.mul(x, 127.0 / amax).round_(), amax  # |x * 127 / amax| <= 127: no clamp needed


def prepack(weight: torch.Tensor, step: torch.Tensor):
    """fbgemm's packed form of a [N, K] int8 weight with per-channel scales ``step``, or None where PyTorch's quantized
    engine cannot pack it or its sums are not exact on this CPU (then every product runs through our own kernels
    or ``torch._int_mm``)."""
    return _prepack(weight, step) if fbgemm_is_exact() else None


@functools.cache
def fbgemm_is_exact() -> bool:
    """Whether fbgemm's int8 GEMM returns exact integer sums on this CPU, tried on sums that need the full range.
    Its activations are unsigned bytes (our rows offset by 128, so up to 255) against signed weights. With VNNI
    (vpdpbusd) each product goes straight into int32; fbgemm's kernels without it (AVX2, AVX-512 without VNNI) add
    pairs of products in saturating int16 first (vpmaddubsw), and 255 * 127 * 2 = 64,770 clips at 32,767: on an
    AMD EPYC Zen 3 (AVX2 only) rows came out wrong, and differently from the one-row kernels. So the answer comes
    from trying it, not from the CPU's name."""
    k = 64
    weight = torch.full((8, k), 127, dtype=torch.int8)
    weight[1::2] = -127
    weight[4:, 1::2] *= -1  # alternating signs
    rows = torch.full((4, k), 127.0)
    rows[1] = -127.0
    rows[2, 1::2] = -127.0
    rows[3] = torch.arange(k, dtype=torch.float32) % 255 - 127
    try:
        return fbgemm_sums_are_exact(weight, rows) is True
    except (RuntimeError, AttributeError):
        return False


def fbgemm_sums_are_exact(weight: torch.Tensor, rows: torch.Tensor) -> bool | None:
    """Whether fbgemm's sums of integer-valued ``rows`` [T, K] against the int8 ``weight`` [N, K] equal the exact
    ones; None where PyTorch's quantized engine cannot pack the weight."""
    packed = _prepack(weight, torch.ones(weight.shape[0]))
    if packed is None:
        return None
    return bool(torch.equal(fbgemm_products(rows, packed), (rows.double() @ weight.double().t()).float()))


def fbgemm_products(q: torch.Tensor, packed) -> torch.Tensor:
    """Integer-valued rows q [T, K] (float) against fbgemm's ``packed`` weight: [T, N] float32 sums times its
    per-channel steps. The rows go in with scale 1 and zero point 128, so fbgemm's own quantization of them is
    exact."""
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(q, 1.0, 128, packed)


def _prepack(weight: torch.Tensor, step: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor constructors warn of a future deprecation
        try:
            zero = torch.zeros(weight.shape[0], dtype=torch.long)
            q = torch._make_per_channel_quantized_tensor(weight, step.double(), zero, 0)
            return torch.ops.quantized.linear_prepack(q, None)
        except (RuntimeError, AttributeError):
            return None


@dataclass
class Int8Linear:
    """``x @ W.T + b`` with int8 weights and per-token int8 activations; the call signature of ``_Linear``.

    Two exact kernels compute the same integer sums: ``torch._int_mm`` on the transposed view of the weight
    (its matrix-vector path is the fastest for a single row of a small matrix), and fbgemm's prepacked int8
    GEMM, which costs about the same for 1 to 8 rows (``int_mm`` costs 1.5-4x more from 2 rows on) and returns
    ``sum * step`` in fp32 directly. fbgemm is handed the integer-valued rows with scale 1 and zero point 128,
    so its own quantization of them is exact."""

    weight: torch.Tensor  # [N, K] int8 contiguous
    step: torch.Tensor  # [N] float32 per-output-channel quantization step
    bias: torch.Tensor | None  # [N] float32
    precise: bool = False  # activations as int8 + int8 residual (about 15 bits), for outlier-heavy inputs

    def __post_init__(self) -> None:
        self._view = self.weight.t()  # [K, N] view for torch._int_mm
        self._scale = self.step / 127.0  # [N] per-channel step times the activations' 1/127
        self._packed = prepack(self.weight, self._scale)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, precise: bool = False) -> Int8Linear:
        q, step = quantize_weight(weight)
        return cls(q, step, None if bias is None else bias.float(), precise)

    def _products(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T', N] float32 sum_k q[t, k] W[n, k] a[t] / 127, T' = 2T when precise (the residual rows)."""
        q, row_scale = quantize_rows(x)  # [T, K] integer-valued, [T, 1]
        if self.precise:  # x = q a / 127 + residual; the residual's own int8 rows ride in the same product
            q_res, res_scale = quantize_rows(torch.addcmul(x, q, row_scale, value=-1.0 / 127))
            q, row_scale = torch.cat((q, q_res)), torch.cat((row_scale, res_scale))  # [2T, K], [2T, 1]
        if self._packed is not None and q.shape[0] > 1:  # int_mm's matrix-vector path is faster for one row
            out = fbgemm_products(q, self._packed)
            return out.mul_(row_scale)  # [T', N]: fbgemm already applied the per-channel scale
        acc = torch._int_mm(q.to(torch.int8), self._view)  # [T', N] int32
        return torch.mul(acc, self._scale).mul_(row_scale)

    def __call__(self, x: torch.Tensor, few_rows: bool = True) -> torch.Tensor:
        """x [T, K] -> [T, N] float32."""
        out = self._products(x)
        if self.precise:
            out = out[: x.shape[0]].add_(out[x.shape[0] :])
        return out if self.bias is None else out.add_(self.bias)

    def wide(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)

    @property
    def nbytes(self) -> int:
        """Weight bytes a one-token product reads."""
        return self.weight.numel()

    def parts(self) -> tuple:
        """What the native forward takes of a projection: (weight, step, fbgemm's packed weight, bias, precise)."""
        return self.weight, self.step, self._packed, self.bias, self.precise

    def add_to(self, residual: torch.Tensor, x: torch.Tensor, few_rows: bool = True) -> torch.Tensor:
        """residual [T, N] + projection of x [T, K]."""
        return self(x).add_(residual)


class ChannelRecorder:
    """Wraps a projection during calibration: records each input channel's largest magnitude."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.amax: torch.Tensor | None = None  # [K]

    def _see(self, x: torch.Tensor) -> None:
        seen = x.detach().abs().amax(dim=0).float()
        self.amax = seen if self.amax is None else torch.maximum(self.amax, seen)

    def __call__(self, x: torch.Tensor, few_rows: bool = True) -> torch.Tensor:
        self._see(x)
        return self.inner(x, few_rows)

    def wide(self, x: torch.Tensor) -> torch.Tensor:
        self._see(x)
        return self.inner.wide(x)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor, few_rows: bool = True) -> torch.Tensor:
        self._see(x)
        return self.inner.add_to(residual, x, few_rows)


def smoothing(act_amax: torch.Tensor, weight: torch.Tensor, alpha: float = SMOOTH_ALPHA) -> torch.Tensor:
    """[K] SmoothQuant factors m for a projection with [N, K] ``weight`` whose inputs reach ``act_amax`` [K]."""
    weight_amax = weight.abs().amax(dim=0).float().clamp_min(1e-5)  # [K]
    return (act_amax.clamp_min(1e-5) ** alpha / weight_amax ** (1 - alpha)).clamp(1e-3, 1e3)


def grouped_smoothing(act_amax: torch.Tensor, weight: torch.Tensor, heads: int, kv_heads: int,
                      head_dim: int) -> torch.Tensor:
    """Factors for ``o``, folded into ``v``: query heads that share a kv head must share their factors, so the
    statistics are pooled over each group first. Returns [kv_heads * head_dim]."""
    group = heads // kv_heads
    pooled_act = act_amax.view(kv_heads, group, head_dim).amax(1)  # [Hkv, hd]
    pooled_w = weight.abs().amax(dim=0).float().view(kv_heads, group, head_dim).amax(1)  # [Hkv, hd]
    m = pooled_act.clamp_min(1e-5) ** SMOOTH_ALPHA / pooled_w.clamp_min(1e-5) ** (1 - SMOOTH_ALPHA)
    return m.clamp(1e-3, 1e3).reshape(-1)


def expand_groups(m: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """[Hkv * hd] per-kv-head factors -> [Hq * hd], each query head taking its kv head's."""
    return m.view(kv_heads, 1, head_dim).expand(kv_heads, heads // kv_heads, head_dim).reshape(-1)


def calibrate(forward, layers: Sequence, token_ids: Sequence[Sequence[int]]) -> list[dict[str, torch.Tensor]]:
    """Run ``forward`` on each token sequence with recorders on every layer's projections; returns each
    layer's input channel amax for qkv, o, gate_up and down."""
    names = ("qkv", "o", "gate_up", "down")
    recorders = [{name: ChannelRecorder(getattr(layer, name)) for name in names} for layer in layers]
    for layer, recs in zip(layers, recorders):
        for name, rec in recs.items():
            setattr(layer, name, rec)
    try:
        for ids in token_ids:
            forward(ids)
    finally:
        for layer, recs in zip(layers, recorders):
            for name, rec in recs.items():
                setattr(layer, name, rec.inner)
    return [{name: rec.amax for name, rec in recs.items()} for recs in recorders]


PROJECTIONS = ("qkv", "o", "gate_up", "down")
PRECISE = ("down",)  # projections whose activations get the int8 + residual treatment (and the LM head)


def _clone(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.clone()
