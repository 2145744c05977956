"""``random``: LLaDA's random remasking baseline: the planned number of masked positions, chosen uniformly."""

from __future__ import annotations

import torch

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler, top_by


@register_sampler("random")
class RandomOrder(Sampler):
    fixed_steps = True

    def select(self, view: StepView):
        scores = torch.rand(view.confidence.shape, generator=view.generator, dtype=torch.float64)
        return top_by(scores, view.count)
