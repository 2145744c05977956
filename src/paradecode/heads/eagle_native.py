"""An EAGLE head's draft step on the native int8 forward (``backends/native``), without PyTorch's per-op costs.

The head (``heads/eagle.py``) is ``fc`` over [embed(token) ; feature], one Llama decoder layer without an input
norm, and the draft LM head (the target's rows of the draft vocabulary), with no final norm. The native
``Int8Forward`` runs exactly that when built so: ``fc`` as its input projection, the layer with an empty input
norm, the draft rows as its LM head and an empty final norm. ``fc`` and ``down`` take their activations as int8
plus an int8 residual row (``precise``, as the target's ``down`` and LM head do): ``fc`` reads the target's
features, whose outlier channels leave one int8 scale per row too coarse for the rest. Keys and values live in
a paged cache of the forward's own, one sequence owning every page in order, so a pair's slot is its logical
slot; ``length`` counts the slots in use, as ``EagleCache.length`` does.

Drafts may differ slightly from the PyTorch head's (int8 activations, half-float keys and values); outputs do
not: verification is the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradecode.backends.int8 import Int8Linear
from paradecode.backends.int8_llama import PAGE
from paradecode.heads.eagle import EagleHead, HeadShape


@dataclass(frozen=True)
class NativeEagleWeights:
    """An EAGLE head's weights as the native forward takes them (``Int8Linear.parts()`` of each projection)."""

    shape: HeadShape
    inv_freq: torch.Tensor  # [hd / 2] the head's RoPE frequencies
    fc: tuple
    qkv: tuple
    o: tuple
    gate_up: tuple
    down: tuple
    mlp_norm: torch.Tensor  # [D] the post-attention RMSNorm
    lm: tuple  # the draft LM head: the target's rows of the draft vocabulary

    @classmethod
    def from_head(cls, head: EagleHead, lm_rows: torch.Tensor) -> "NativeEagleWeights":
        """``head`` (fp32) and its draft LM head rows ``lm_rows`` [Vd, D], quantized per output channel."""

        def linear(*weights: torch.Tensor, precise: bool = False) -> tuple:
            return Int8Linear.from_float(torch.cat([w.detach().float() for w in weights]), precise=precise).parts()

        return cls(head.shape, head.inv_freq.float(), linear(head.fc.weight, precise=True),
                   linear(head.q_proj.weight, head.k_proj.weight, head.v_proj.weight), linear(head.o_proj.weight),
                   linear(head.gate_proj.weight, head.up_proj.weight), linear(head.down_proj.weight, precise=True),
                   head.post_attention_layernorm.detach().float().contiguous(), linear(lm_rows))


class NativeEagleLayer:
    """A head's ``NativeEagleWeights`` as one native forward over a cache of ``max_len`` pairs of its own;
    ``module``: the loaded native module (``backends.native.load()``)."""

    def __init__(self, module, weights: NativeEagleWeights, max_len: int) -> None:
        s = weights.shape
        slots = -(-max_len // PAGE) * PAGE
        self.values = torch.zeros(1, s.num_kv_heads, slots, s.head_dim, dtype=torch.float16)
        self.keys_t = torch.zeros(1, s.num_kv_heads, slots // 16, s.head_dim, 16, dtype=torch.float16)
        self.pages = torch.arange(slots // PAGE, dtype=torch.int32)
        angles = torch.arange(slots, dtype=torch.float32)[:, None] * weights.inv_freq[None]  # [slots, hd/2]
        # rotate-half RoPE as the target's tables give it (backends/llama.py): cos [slots, hd], sin with its sign
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((-angles.sin(), angles.sin()), -1)
        no_norm = torch.empty(0)
        self.stack = module.Int8Forward(s.num_heads, s.num_kv_heads, s.head_dim, s.rms_norm_eps,
                                        torch.empty(0, s.hidden_size), no_norm, cos, sin, self.values, self.keys_t,
                                        PAGE)
        self.stack.set_input(weights.fc)
        self.stack.add_layer(no_norm, weights.mlp_norm, weights.qkv, weights.o, weights.gate_up, weights.down,
                             no_norm, no_norm)
        self.stack.set_head(weights.lm)
        self.slots = slots
        self.length = 0  # slots in use: the pairs fed so far

    def __call__(self, pairs: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None,
                 last_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pairs [T, 2D] ([embedding ; feature] rows) at the next T slots -> (output features [T, D], draft
        logits [T, Vd], or [1, Vd] of the last pair with ``last_logits``). ``positions`` [T] (RoPE) and ``mask``
        [T, length + T] bool (True: may attend), or None for both: each pair at its slot, causally."""
        t = pairs.shape[0]
        if self.length + t > self.slots:
            raise ValueError(f"the head's cache holds {self.slots} pairs; {self.length + t} asked")
        pairs = pairs.float()
        if last_logits and t > 1 and mask is None:  # a prompt's pairs: the LM head for the last one only
            first, _ = self._pass(pairs[:-1], None, None, want_logits=False)
            last, logits = self._pass(pairs[-1:], None, None, want_logits=True)
            return torch.cat((first, last)), logits
        out, logits = self._pass(pairs, positions, mask, want_logits=True)
        return out, logits[-1:] if last_logits else logits

    def _pass(self, pairs: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor | None,
              want_logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        start, t = self.length, pairs.shape[0]
        out, logits, _ = self.stack.forward(torch.empty(0, dtype=torch.long), positions,
                                            [(self.pages, start, t, mask)], [0], want_logits, inputs=pairs)
        self.length = start + t
        return out, logits
