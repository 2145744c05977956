"""Logits -> probabilities, and drawing from them.

``probabilities`` applies temperature, top-k and top-p in that order (as transformers does). The engine uses
it for the target (p) and drafters use it for their own distribution (q), so both are processed identically,
which exact speculative sampling requires.
"""

from __future__ import annotations

import torch

from paradecode.config import SamplingConfig


def probabilities(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities under temperature / top-k / top-p (temperature > 0)."""
    logits = logits.float() / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass (keep at least one)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, rng: torch.Generator) -> int:
    """One token id from a [V] distribution."""
    return int(torch.multinomial(probs, 1, generator=rng))


def uniform(rng: torch.Generator) -> float:
    return float(torch.rand((), generator=rng))


def draw_draft_token(logits: torch.Tensor, sampling: SamplingConfig, rng: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """A drafter's next token from its logits [V]: the argmax when greedy (q = None), else a sample from
    q = probabilities(logits), returned with q for speculative sampling."""
    if sampling.greedy:
        return int(logits.argmax()), None
    q = probabilities(logits, sampling)  # [V]
    return sample(q, rng), q
