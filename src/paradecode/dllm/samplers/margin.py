"""``margin``: Dream's margin order: commit the planned number of positions with the largest gap between
the two most probable tokens."""

from __future__ import annotations

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler, top_by


@register_sampler("margin")
class MarginOrder(Sampler):
    fixed_steps = True

    def select(self, view: StepView):
        top2 = view.probs.topk(2, dim=-1).values  # [n, 2]
        return top_by(top2[:, 0] - top2[:, 1], view.count)
