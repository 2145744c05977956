"""``topk``: LLaDA's low-confidence remasking: each step commits the planned number of masked positions
whose predicted token is most probable (the rest stay masked)."""

from __future__ import annotations

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler, top_by


@register_sampler("topk")
class TopK(Sampler):
    fixed_steps = True

    def select(self, view: StepView):
        return top_by(view.confidence, view.count)
