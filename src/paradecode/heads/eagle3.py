"""The EAGLE-3 draft head (Li et al. 2025): one decoder layer over the target's low, middle and high features.

EAGLE-1 (``heads/eagle.py``) reads the target's last hidden state and predicts the next one, whose image under
the target's LM head is the draft. EAGLE-3 drops the feature target and predicts tokens directly:

* Its input feature at position i is ``fc`` of the target's residual stream entering ``aux_layers`` (by
  default layers 2, L/2 and L-3, side by side: ``ForwardOutput.aux``) - the fused low/mid/high features.
* Pair i is (g_i, t_{i+1}) as in EAGLE-1. The layer's input is ``[input_layernorm(embed(t_{i+1})) ;
  hidden_norm(g_i)]`` (2D wide, hence q/k/v over 2D); the residual stream starts at g_i itself.
* Its output (before the final norm) is the feature the next draft position reads (no ``fc`` then: callers
  fuse the target's features with ``fuse`` and feed the head's own outputs as they are); ``lm_head(norm(output))`` gives logits over the head's own draft vocabulary (``draft_ids``, the
  most frequent answer tokens; vLLM and SGLang call the offsets ``d2t``).
* Training unrolls the draft chain on the head's own outputs (the "training-time test",
  ``training.losses.eagle_passes``), and the loss is on tokens only.

The weights follow the EAGLE-3 checkpoint layout vLLM and SGLang load (``training.export``): ``fc`` [D, A*D],
``midlayer.*``, ``norm``, ``lm_head`` [Vd, D].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paradecode.heads.eagle import EagleCache, HeadShape, attend


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers (vLLM's and SGLang's default): the inputs of 2, L // 2 and L - 3."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3)}))


class Eagle3Head(nn.Module):
    kind = "eagle3"
    predicts_features = False  # the loss is on tokens only (EAGLE-1 also regresses its feature)

    def __init__(self, shape: HeadShape, aux_layers: tuple[int, ...], draft_vocab: int) -> None:
        super().__init__()
        d, hd = shape.hidden_size, shape.head_dim
        self.shape, self.aux_layers = shape, tuple(aux_layers)
        self.fc = nn.Linear(len(self.aux_layers) * d, d, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(d))
        self.hidden_norm = nn.Parameter(torch.ones(d))
        self.q_proj = nn.Linear(2 * d, shape.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * d, shape.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * d, shape.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * hd, d, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(d))
        self.gate_proj = nn.Linear(d, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, d, bias=False)
        self.norm = nn.Parameter(torch.ones(d))
        self.lm_head = nn.Linear(d, draft_vocab, bias=False)
        with torch.no_grad():  # start as "the fused feature is the last one" (o and down add nothing yet)
            self.fc.weight.zero_()
            self.fc.weight[:, -d:] = torch.eye(d)
            self.o_proj.weight.zero_()
            self.down_proj.weight.zero_()
        self.register_buffer("inv_freq", 1.0 / shape.rope_theta ** (torch.arange(0, hd, 2).float() / hd),
                             persistent=False)

    def init_lm_head(self, rows: torch.Tensor) -> None:
        """Start the draft LM head from the target's rows of the draft vocabulary [Vd, D]."""
        with torch.no_grad():
            self.lm_head.weight.copy_(rows)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's aux features [..., A*D] -> the head's input feature [..., D]."""
        return self.fc(aux)

    def draft_logits(self, out: torch.Tensor, lm_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Output features [..., D] -> logits over the draft vocabulary [..., Vd] (``lm_rows`` unused: the
        head has its own LM head)."""
        s = self.shape
        return self.lm_head(F.rms_norm(out, (s.hidden_size,), self.norm.to(out.dtype), s.rms_norm_eps))

    def forward(
        self,
        embeds: torch.Tensor,  # [B, T, D] target embeddings of the pairs' tokens
        features: torch.Tensor,  # [B, T, D] fused target features (``fuse``) or the head's own outputs
        positions: torch.Tensor,  # [B, T] RoPE positions
        mask: torch.Tensor | None,  # [B or 1, T, S] bool, True = may attend
        cache: EagleCache | None = None,
        extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Output features [B, T, D] (before the final norm) and this call's keys/values, as ``EagleHead``."""
        s = self.shape
        d = embeds.shape[-1]
        g = features  # [B, T, D]
        x = torch.cat((F.rms_norm(embeds, (d,), self.input_layernorm.to(embeds.dtype), s.rms_norm_eps),
                       F.rms_norm(g, (d,), self.hidden_norm.to(g.dtype), s.rms_norm_eps)), dim=-1)  # [B, T, 2D]
        attn, new_kv = attend(self, x, positions, mask, cache, extra_kv)  # [B, T, H * hd]
        h = g + self.o_proj(attn)
        n = F.rms_norm(h, (d,), self.post_attention_layernorm.to(h.dtype), s.rms_norm_eps)
        return h + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n)), new_kv
