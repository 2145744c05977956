"""Self-speculative decoding (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023).

The draft model is the target itself running a subset of its layers, then its own final norm and LM head:
the first ``exit_layer`` layers (early exit), or every layer but a ``skip`` set. No extra weights.

Drafting runs on the target's backend and cache (``state.target``), one token per forward pass, from the
root: each pass writes keys/values of the layers it runs at the speculative slots after the committed text,
so later draft tokens attend to earlier ones in those layers; layers not run are never read while drafting
because every pass runs the same layers. Before returning, the cache is rolled back to the committed text;
the engine's verify pass then rewrites those slots with every layer. Under sampling each draft token is drawn
from q = the partial model's logits under the request's SamplingConfig, and q goes back with the proposal for
exact speculative sampling.

It pays only on models trained for it (LayerSkip's early-exit loss and layer dropout); docs/methods.md has
the measurements on a model that was not. The default ``cost`` schedule drafts only while it pays and
otherwise falls back to plain decoding with a one-token probe every few steps. Its draft lengths follow
measured time, so a seeded *sampled* output is an exact sample but not bit-for-bit repeatable; pass
``schedule=fixed`` (or ``heuristic``) for that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from paradecode.drafters.base import DecodeState, Proposal, draft_chain
from paradecode.drafters.schedule import ScheduledDrafter, check_schedule_options
from paradecode.errors import ParadecodeError
from paradecode.registry import register
from paradecode.verify.base import Verdict


@dataclass(frozen=True)
class LayerSkipOptions:
    exit_layer: int = 0  # draft with the first exit_layer layers; 0: the default, see default_exit_layer
    skip: str = ""  # or: draft with every layer but these, e.g. "4-9,20" (0-based); excludes exit_layer
    num_draft: int = 4  # tokens per step (fixed), or the first step's (heuristic, cost)
    schedule: str = "cost"  # fixed | heuristic | cost: see drafters.schedule (and the note above)
    max_num_draft: int = 16  # ceiling for the heuristic and cost schedules

    def __post_init__(self) -> None:
        if self.exit_layer < 0:
            raise ParadecodeError(f"layerskip option exit_layer must be >= 1, got {self.exit_layer}.")
        if self.exit_layer and str(self.skip):
            raise ParadecodeError("layerskip takes exit_layer or skip, not both.")
        parse_layer_set(self.skip)
        check_schedule_options("layerskip", self.schedule, self.num_draft, self.max_num_draft)


def default_exit_layer(num_layers: int) -> int:
    """90% of the layers, and never all of them: models not trained for early exit are only predictive in
    their last few layers (docs/methods.md)."""
    return max(1, min(num_layers - 1, round(0.9 * num_layers)))


def parse_layer_set(spec: str | int) -> frozenset[int]:
    """``"4-9,20"`` -> {4, 5, 6, 7, 8, 9, 20}; a ParadecodeError for anything else."""
    layers: set[int] = set()
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            lo, hi = int(first), int(last if dash else first)
        except ValueError:
            raise ParadecodeError(
                f"layerskip option skip takes layer numbers and ranges like 4-9,20; got {spec!r}."
            ) from None
        if lo < 0 or hi < lo:
            raise ParadecodeError(f"layerskip option skip has a bad range {part!r} in {spec!r}.")
        layers.update(range(lo, hi + 1))
    return frozenset(layers)


@register("layerskip")
class LayerSkipDrafter(ScheduledDrafter):
    Options = LayerSkipOptions
    draws_from_rng: ClassVar[bool] = True  # sampled drafts: each draws from the request's random stream

    def begin(self, state: DecodeState) -> None:
        target = state.target
        if target is None:
            raise ParadecodeError("method 'layerskip' runs the target model itself, but no target was given.")
        total = target.num_layers
        skip = parse_layer_set(self.options.skip)
        if skip:
            if max(skip) >= total:
                raise ParadecodeError(f"layerskip skip {self.options.skip!r} names layer {max(skip)}, but the model "
                                      f"has layers 0..{total - 1}.")
            if len(skip) == total:
                raise ParadecodeError("layerskip skip names every layer; keep at least one.")
            self.layer_args = {"layers": tuple(i for i in range(total) if i not in skip)}
            self.description = f"{total - len(skip)} of {total} layers (skipping {self.options.skip})"
        else:
            exit_layer = self.options.exit_layer or default_exit_layer(total)
            if exit_layer > total:
                raise ParadecodeError(f"layerskip exit_layer is {exit_layer}, but the model has {total} layers.")
            self.layer_args = {"exit_layer": exit_layer}
            self.description = f"first {exit_layer} of {total} layers"
        self.schedule = self.new_schedule(state)
        self.draft_forward_passes = 0

    def propose(self, state: DecodeState) -> Proposal:
        length = min(self.schedule.length(), state.max_draft)
        proposal = self._draft(state, length) if length > 0 else Proposal()
        self.schedule.proposed(len(proposal.tokens))
        return proposal

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        self.schedule.update(len(verdict.accepted))

    def summary(self) -> dict:
        return {"draft_layers": self.description}

    def _draft(self, state: DecodeState, length: int) -> Proposal:
        committed = len(state.tokens) - 1  # the cache holds every committed token but the root
        try:
            return draft_chain(lambda feed: self._next_logits(state.target, feed), state.tokens[-1:], length, state)
        finally:
            state.target.rollback(committed)  # drop the draft's partial keys/values; verification rewrites them

    def _next_logits(self, target, feed: list[int]) -> torch.Tensor:
        try:
            logits = target.forward(torch.tensor(feed, dtype=torch.long), **self.layer_args).logits[-1]  # [V]
        except NotImplementedError:
            raise ParadecodeError(
                "method 'layerskip' needs a backend that can run a subset of the model's layers; this one "
                "cannot. Use the llama backend (--backend llama) with a Llama-family model."
            ) from None
        self.draft_forward_passes += 1
        return logits
