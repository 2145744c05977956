"""The sampler interface and registry: which masked positions of the current block to commit this step.

A sampler sees a ``StepView`` of the block's still-masked positions (the model's token for each, its
probability, the full distribution) and returns the indices (into those candidates) to commit, at least one;
``choose`` adds the tokens to write there (the model's own, unless a sampler picks others from the
distribution, as ``pool`` does).
Fixed-step samplers (LLaDA, Dream) commit a number planned once per block by ``planned_counts``; adaptive
ones (Fast-dLLM's threshold and factor rules) decide the number from the confidences each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from paradecode.registry import Registry, build_options

SAMPLERS = Registry("sampler", builtins="paradecode.dllm.samplers", name_attribute="name")
register_sampler = SAMPLERS.register
sampler_names = SAMPLERS.names


@dataclass
class StepView:
    x0: torch.Tensor  # [n] the model's token for each masked position of the block
    confidence: torch.Tensor  # [n] its probability p(x0) under the (unnoised) model distribution
    probs: torch.Tensor  # [n, V] the model distribution at each position
    count: int  # fixed-step samplers: tokens to commit this step (from planned_counts)
    generator: torch.Generator
    target: torch.Tensor | None = None  # [n] the known answer (oracle only)
    positions: torch.Tensor | None = None  # [n] each candidate's canvas offset (samplers that remember steps)


class Sampler:
    """Base class: ``Options`` is a frozen dataclass; ``select`` picks candidates to commit."""

    name = ""
    fixed_steps = False  # True: commits ``view.count`` per step, so the decoder's ``steps`` applies

    @dataclass(frozen=True)
    class Options:
        pass

    def __init__(self, options: "Sampler.Options"):
        self.options = options

    def select(self, view: StepView) -> torch.Tensor:  # -> [k] candidate indices, k >= 1
        raise NotImplementedError

    def choose(self, view: StepView) -> tuple[torch.Tensor, torch.Tensor]:  # -> [k] indices, [k] tokens
        """The candidates to commit and their tokens: the model's token ``x0`` unless a sampler says otherwise."""
        chosen = self.select(view)
        return chosen, view.x0[chosen]

    def reset(self) -> None:
        """Called before each decode: samplers that remember earlier steps forget them here."""


def top_by(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` highest scores (ties: lowest index first), at least one."""
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[: max(1, min(count, scores.numel()))]


def planned_counts(masked: int, steps: int) -> list[int]:
    """LLaDA's schedule: ``masked`` tokens over ``steps`` steps, as evenly as possible, the remainder first
    (a linear noise schedule unmasks the same expected number per step)."""
    base, extra = divmod(masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def build_sampler(name: str, options: dict[str, Any] | None = None) -> Sampler:
    """The sampler ``name`` with ``options`` (key -> value), every value checked."""
    cls = SAMPLERS.lookup(name)
    return cls(build_options(cls, options or {}, f"sampler {name!r}"))
