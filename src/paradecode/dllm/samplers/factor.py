"""``factor``: Fast-dLLM's factor rule. With the block's confidences sorted in descending order
c_1 >= c_2 >= ..., commit the top n for the largest n with (n + 1)(1 - c_n) < f (at least one).

The bound comes from Fast-dLLM's analysis: if the n committed positions each have confidence c_i and
(n + 1)(1 - c_n) < 1, greedy parallel decoding gives the same tokens as greedy sequential decoding of the
product distribution; ``factor`` f relaxes the 1 (default 1.0; larger commits more).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler
from paradecode.errors import ParadecodeError


@register_sampler("factor")
class Factor(Sampler):
    @dataclass(frozen=True)
    class Options:
        factor: float = 1.0

        def __post_init__(self) -> None:
            if not self.factor > 0:
                raise ParadecodeError(f"factor must be a number > 0, got {self.factor!r}.")

    def select(self, view: StepView):
        conf, order = torch.sort(view.confidence, descending=True, stable=True)  # [n]
        n = torch.arange(1, conf.numel() + 1, dtype=conf.dtype)
        ok = (n + 1) * (1 - conf) < self.options.factor  # [n]; conf falls as n grows, so ok is a prefix
        count = int(torch.cumprod(ok.long(), 0).sum())
        return order[: max(count, 1)]
