"""The EAGLE draft head (Li et al. 2024): one Llama decoder layer over fc([embed(token) ; target feature]).

EAGLE autoregresses on features. Pair i is (f_i, t_{i+1}): the target's last hidden state at position i and
the token that followed it. The head maps the pairs 0..i to a prediction of f_{i+1}, whose image under the
target's (frozen, shared) LM head is the draft distribution of t_{i+2}. Drafting feeds its own predicted
features back in: (f^_{i+1}, drafted t_{i+2}) -> f^_{i+2} -> ...

The layer follows EAGLE-1 and vLLM's ``llama_eagle`` layout: ``fc`` (2D -> D, no bias), no input norm before
attention (the fc output goes straight in), post-attention RMSNorm, SwiGLU MLP, no final norm. Pair i sits at
RoPE position i. The same module trains on batches (``forward`` with ``cache=None``) and drafts with a small
KV cache of its own (``EagleCache``), written at explicit slots under an explicit mask, like our backends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HeadShape:
    """Sizes a head shares with its target (read from the target's config.json)."""

    hidden_size: int
    vocab_size: int
    num_heads: int = 0  # attention heads (EAGLE)
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @classmethod
    def from_target_config(cls, config: dict) -> "HeadShape":
        heads = config["num_attention_heads"]
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        return cls(hidden_size=config["hidden_size"], vocab_size=config["vocab_size"], num_heads=heads,
                   num_kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   intermediate_size=config["intermediate_size"], rms_norm_eps=config.get("rms_norm_eps", 1e-5),
                   rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))


class EagleCache:
    """Keys and values of the pairs fed so far: ``[max_len, Hkv, hd]`` each, the first ``length`` slots used."""

    def __init__(self, shape: HeadShape, max_len: int, dtype: torch.dtype = torch.float32) -> None:
        self.keys = torch.zeros(max_len, shape.num_kv_heads, shape.head_dim, dtype=dtype)
        self.values = torch.zeros_like(self.keys)
        self.length = 0

    def keep(self, start: int, kept: list[int]) -> None:
        """Keep slots ``start + i`` for i in ``kept`` (ascending) at ``start, start + 1, ...``; drop the rest."""
        if kept and kept != list(range(len(kept))):
            index = torch.tensor(kept) + start
            self.keys[start : start + len(kept)] = self.keys[index]
            self.values[start : start + len(kept)] = self.values[index]
        self.length = start + len(kept)


class EagleHead(nn.Module):
    kind = "eagle"
    predicts_features = True  # trained to predict the next feature too (the smooth-L1 term of the loss)
    aux_layers: tuple[int, ...] = ()  # reads the target's last hidden state (EAGLE-3 reads these layers' inputs)

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        d, hd = shape.hidden_size, shape.head_dim
        self.shape = shape
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.q_proj = nn.Linear(d, shape.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, shape.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, shape.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * hd, d, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(d))
        self.gate_proj = nn.Linear(d, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, d, bias=False)
        with torch.no_grad():  # start as "the next feature is this one": finite, target-scaled logits from step 0
            self.fc.weight.zero_()
            self.fc.weight[:, d:] = torch.eye(d)
            self.o_proj.weight.zero_()
            self.down_proj.weight.zero_()
        self.register_buffer("inv_freq", 1.0 / shape.rope_theta ** (torch.arange(0, hd, 2).float() / hd),
                             persistent=False)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features as the head reads them: as they are (EAGLE-3 fuses several layers')."""
        return features

    def draft_logits(self, out: torch.Tensor, lm_rows: torch.Tensor) -> torch.Tensor:
        """Predicted features [..., D] -> draft logits [..., Vd]: the target's LM head rows of the draft vocabulary."""
        return out @ lm_rows.t()

    def forward(
        self,
        embeds: torch.Tensor,  # [B, T, D] target embeddings of the pairs' tokens
        features: torch.Tensor,  # [B, T, D] the pairs' features (target hidden states or the head's own)
        positions: torch.Tensor,  # [B, T] RoPE positions
        mask: torch.Tensor | None,  # [B or 1, T, S] bool, True = may attend; S = cached + T (or T without cache)
        cache: EagleCache | None = None,  # drafting (B = 1): keys/values are appended to it
        extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # training: [B, Hkv, S0, hd] keys/values
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Predicted next features [B, T, D], and this call's keys/values [B, Hkv, T, hd] (for unrolled training).
        Keys are ``extra_kv`` (if any), then the cache, then the new pairs; ``mask`` covers them in that order."""
        s = self.shape
        x = self.fc(torch.cat((embeds, features), dim=-1))  # [B, T, D]
        attn, new_kv = attend(self, x, positions, mask, cache, extra_kv)  # [B, T, H * hd]
        x = x + self.o_proj(attn)
        h = F.rms_norm(x, (s.hidden_size,), self.post_attention_layernorm.to(x.dtype), s.rms_norm_eps)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))  # [B, T, D]
        return x, new_kv


def attend(head: nn.Module, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
           cache: EagleCache | None, extra_kv: tuple[torch.Tensor, torch.Tensor] | None
           ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The head's attention over x [B, T, *] (its q/k/v projections, RoPE at ``positions``): the attended values
    [B, T, H * hd] and this call's keys/values [B, Hkv, T, hd]. Keys are ``extra_kv`` (if any), then the cache
    (appended to when given: drafting, B = 1), then the new pairs; ``mask`` covers them in that order."""
    s = head.shape
    b, t = x.shape[:2]
    q = head.q_proj(x).view(b, t, s.num_heads, s.head_dim)
    k = head.k_proj(x).view(b, t, s.num_kv_heads, s.head_dim)
    v = head.v_proj(x).view(b, t, s.num_kv_heads, s.head_dim)
    angles = positions[..., None].float() * head.inv_freq  # [B, T, hd/2]
    cos, sin = torch.cat((angles, angles), -1).cos()[:, :, None], torch.cat((angles, angles), -1).sin()[:, :, None]
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)  # [B, T, H, hd]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, hd]
    new_kv = (k, v)
    if cache is not None:
        start = cache.length
        cache.keys[start : start + t] = k[0].transpose(0, 1)
        cache.values[start : start + t] = v[0].transpose(0, 1)
        cache.length = start + t
        k = cache.keys[: cache.length].transpose(0, 1)[None]  # [1, Hkv, C + T, hd]
        v = cache.values[: cache.length].transpose(0, 1)[None]
    if extra_kv is not None:
        k, v = torch.cat((extra_kv[0], k), dim=2), torch.cat((extra_kv[1], v), dim=2)
    attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None] if mask is not None else None,
                                          enable_gqa=True)  # [B, H, T, hd]
    return attn.transpose(1, 2).reshape(b, t, s.num_heads * s.head_dim), new_kv


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE, as Llama: x [B, T, H, hd], cos/sin [B, T, 1, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
