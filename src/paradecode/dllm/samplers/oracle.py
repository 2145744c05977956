"""``oracle``: the benchmark's upper bound: commit every masked position where the model's token already
equals the known answer (and, when none does, the most confident one, which is then wrong).

No real sampler can know the answer; the oracle shows how much parallelism the model's own predictions allow.
"""

from __future__ import annotations

import torch

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler, top_by
from paradecode.errors import ParadecodeError


@register_sampler("oracle")
class Oracle(Sampler):
    def select(self, view: StepView):
        if view.target is None:
            raise ParadecodeError("the oracle sampler needs the known answer; it runs inside `dllm bench` only.")
        right = torch.nonzero(view.x0 == view.target).flatten()
        return right if right.numel() else top_by(view.confidence, 1)
