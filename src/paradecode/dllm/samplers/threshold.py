"""``threshold``: Fast-dLLM's confidence-aware parallel decoding: commit every masked position of the block
whose confidence is at least τ, and always the most confident one (so each step makes progress).

Option: ``threshold`` τ in [0, 1] (default 0.9). τ = 0 fills a block in one step; τ above every
confidence commits one token per step, in confidence order (LLaDA's order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler, top_by
from paradecode.errors import ParadecodeError


@register_sampler("threshold")
class Threshold(Sampler):
    @dataclass(frozen=True)
    class Options:
        threshold: float = 0.9

        def __post_init__(self) -> None:
            if not 0.0 <= self.threshold <= 1.0:
                raise ParadecodeError(f"threshold must be in [0, 1], got {self.threshold!r}.")

    def select(self, view: StepView):
        confident = torch.nonzero(view.confidence >= self.options.threshold).flatten()
        return confident if confident.numel() else top_by(view.confidence, 1)
