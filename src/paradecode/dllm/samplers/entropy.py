"""``entropy``: Dream's entropy order: commit the planned number of positions whose predicted distribution
has the lowest entropy (the most certain positions overall, not only in their top token)."""

from __future__ import annotations

import torch

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler, top_by


@register_sampler("entropy")
class EntropyOrder(Sampler):
    fixed_steps = True

    def select(self, view: StepView):
        entropy = -(view.probs * torch.log(view.probs.clamp_min(1e-30))).sum(-1)  # [n]
        return top_by(-entropy, view.count)
