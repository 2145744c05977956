"""An EAGLE or EAGLE-3 head's draft step on the native int8 forward (``backends/native``), without PyTorch's per-op
costs.

The EAGLE head (``heads/eagle.py``) is ``fc`` over [embed(token) ; feature], one Llama decoder layer without an
input norm, and the draft LM head (the target's rows of the draft vocabulary), with no final norm. The native
``Int8Forward`` runs exactly that when built so: ``fc`` as its input projection, the layer with an empty input
norm, the draft rows as its LM head and an empty final norm. ``fc`` and ``down`` take their activations as int8
plus an int8 residual row (``precise``, as the target's ``down`` and LM head do): ``fc`` reads the target's
features, whose outlier channels leave one int8 scale per row too coarse for the rest.

The EAGLE-3 head (``heads/eagle3.py``; the parallel head is the same layer) takes the same [embed(token) ; feature]
rows with the feature already fused (its ``fc`` runs on the target's features before, in PyTorch, as the
drafters call it): its layer's q/k/v read [input_layernorm(embedding) ; hidden_norm(feature)], 2D wide (the
forward's [2D] attention norm), its residual stream starts at the feature, and its own LM head reads the
final-normed output while the step returns the output before that norm (``set_output_residual``), the feature
the next draft position reads.

``NativeEagleHead`` packs a head's weights once; each request gets a ``NativeEagleLayer`` over them with a paged
KV cache of its own (one sequence owning every page in order, so a pair's slot is its logical slot), whose
``length`` counts the slots in use, as ``EagleCache.length`` does.

Drafts may differ slightly from the PyTorch head's (int8 activations, half-float keys and values); outputs do
not: verification is the target's.
"""

from __future__ import annotations

import torch

from paradecode.backends.int8 import Int8Linear
from paradecode.backends.int8_llama import PAGE
from paradecode.heads.eagle import EagleHead
from paradecode.heads.eagle3 import Eagle3Head


def _weight(norm: torch.Tensor) -> torch.Tensor:
    return norm.detach().float().contiguous()


class NativeEagleHead:
    """``head`` (an fp32 ``EagleHead``, ``Eagle3Head`` or ``ParallelHead``) and its draft LM head rows ``lm_rows``
    [Vd, D], quantized per output channel and packed for ``module`` (the loaded native module,
    ``backends.native.load()``) once."""

    def __init__(self, module, head: EagleHead | Eagle3Head, lm_rows: torch.Tensor) -> None:
        self.shape = s = head.shape
        self.inv_freq = head.inv_freq.float()  # [hd / 2]

        def linear(*weights: torch.Tensor, precise: bool = False) -> tuple:
            return Int8Linear.from_float(torch.cat([w.detach().float() for w in weights]), precise=precise).parts()

        no_norm = torch.empty(0)
        fused = not head.predicts_features  # EAGLE-3: fed fused features, its own norms and LM head
        values, keys_t, cos, sin = self._cache(PAGE)  # a placeholder: each layer brings its own (``layer``)
        self.stack = module.Int8Forward(s.num_heads, s.num_kv_heads, s.head_dim, s.rms_norm_eps,
                                        torch.empty(0, s.hidden_size), _weight(head.norm) if fused else no_norm,
                                        cos, sin, values, keys_t, PAGE)
        if fused:
            attn_norm = torch.cat((_weight(head.input_layernorm), _weight(head.hidden_norm)))  # [2D]
            self.stack.set_output_residual(True)
        else:
            attn_norm = no_norm
            self.stack.set_input(linear(head.fc.weight, precise=True))
        self.stack.add_layer(attn_norm, _weight(head.post_attention_layernorm),
                             linear(head.q_proj.weight, head.k_proj.weight, head.v_proj.weight),
                             linear(head.o_proj.weight), linear(head.gate_proj.weight, head.up_proj.weight),
                             linear(head.down_proj.weight, precise=True), no_norm, no_norm)
        self.stack.set_head(linear(lm_rows))

    def _cache(self, slots: int) -> tuple[torch.Tensor, ...]:
        """(values, keys_t, cos, sin) for ``slots`` pairs: the half-float cache in the forward's layout and the
        rotate-half RoPE tables as the target's (backends/llama.py: cos [slots, hd], sin with its sign)."""
        s = self.shape
        values = torch.zeros(1, s.num_kv_heads, slots, s.head_dim, dtype=torch.float16)
        keys_t = torch.zeros(1, s.num_kv_heads, slots // 16, s.head_dim, 16, dtype=torch.float16)
        angles = torch.arange(slots, dtype=torch.float32)[:, None] * self.inv_freq[None]  # [slots, hd/2]
        return values, keys_t, torch.cat((angles, angles), -1).cos(), torch.cat((-angles.sin(), angles.sin()), -1)

    def layer(self, max_len: int) -> "NativeEagleLayer":
        """The head's forward over a cache of ``max_len`` pairs of its own (the packed weights shared)."""
        slots = -(-max_len // PAGE) * PAGE
        values, keys_t, cos, sin = self._cache(slots)
        return NativeEagleLayer(self.stack.with_cache(values, keys_t, cos, sin), (values, keys_t), slots)


class NativeEagleLayer:
    """One request's head forward (``NativeEagleHead.layer``): ``stack`` over ``cache`` (values, keys_t) of
    ``slots`` pairs."""

    def __init__(self, stack, cache: tuple[torch.Tensor, torch.Tensor], slots: int) -> None:
        self.stack, self.cache, self.slots = stack, cache, slots  # (the cache tensors kept alive with the stack)
        self.pages = torch.arange(slots // PAGE, dtype=torch.int32)
        self.length = 0  # slots in use: the pairs fed so far

    def __call__(self, pairs: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None,
                 skip: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pairs [T, 2D] ([embedding ; feature] rows) at the next T slots -> (output features [T, D], draft
        logits [T - skip, Vd] of the rows from ``skip`` on: T - 1 for the last pair's only; the skipped rows
        skip the LM head in the same pass). ``positions`` [T] (RoPE) and ``mask`` [T, length + T] bool (True: may
        attend), or None for both: each pair at its slot, causally."""
        start, t = self.length, pairs.shape[0]
        if self.length + t > self.slots:
            raise ValueError(f"the head's cache holds {self.slots} pairs; {self.length + t} asked")
        if not 0 <= skip < t:
            raise ValueError(f"skip must leave at least one of the {t} rows for the draft logits, got {skip}")
        out, logits, _ = self.stack.forward(torch.empty(0, dtype=torch.long), positions,
                                            [(self.pages, start, t, mask)], [0], True, inputs=pairs.float(),
                                            logits_from=skip)
        self.length = start + t
        return out, logits
