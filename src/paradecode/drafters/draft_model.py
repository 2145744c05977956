"""Speculative decoding with an independent, smaller draft model (Leviathan et al. 2023; Chen et al. 2023).

The draft model runs on its own backend and proposes tokens one at a time (how many: the ``schedule``
option, see ``drafters.schedule``; ``num_draft`` with the default fixed schedule): greedily at
temperature 0, otherwise sampled from q (its logits under the same temperature / top-k / top-p as the target),
with q returned so the verifier can run exact speculative sampling. Its KV cache is kept in step with the
committed text: each step rolls back to the longest prefix it shares with ``state.tokens`` and feeds the rest.
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
class DraftModelOptions:
    draft_model: str = ""  # built-in name, .gguf path or HF model directory
    num_draft: int = 4  # tokens per step (fixed), or the first step's (heuristic, cost)
    schedule: str = "fixed"  # fixed | heuristic | cost: see drafters.schedule
    max_num_draft: int = 16  # ceiling for the heuristic and cost schedules

    def __post_init__(self) -> None:
        if not self.draft_model:
            raise ParadecodeError("method 'draft' needs a draft model: pass --draft-model NAME_OR_PATH.")
        check_schedule_options("draft", self.schedule, self.num_draft, self.max_num_draft)


@register("draft")
class DraftModelDrafter(ScheduledDrafter):
    Options = DraftModelOptions
    draws_from_rng: ClassVar[bool] = True  # sampled drafts: each draws from the request's random stream
    exclusive: ClassVar[bool] = True  # the draft model's backend (one cache) serves one request at a time

    def __init__(self, options: DraftModelOptions, context) -> None:
        super().__init__(options, context)
        if context is None:
            raise ParadecodeError("method 'draft' must be created through a loaded model (paradecode.load).")
        self.backend = context.load_draft_backend(options.draft_model)
        self.cached: list[int] = []  # tokens whose keys/values sit in the draft backend's cache
        self.draft_forward_passes = 0

    def begin(self, state: DecodeState) -> None:
        self.backend.reset()
        self.cached = []
        self.schedule = self.new_schedule(state)

    def propose(self, state: DecodeState) -> Proposal:
        proposal = self._draft(state, self.schedule.length())
        self.schedule.proposed(len(proposal.tokens))
        return proposal

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        self.schedule.update(len(verdict.accepted))

    def _draft(self, state: DecodeState, length: int) -> Proposal:
        length = min(length, state.max_draft, self.backend.max_length - len(state.tokens))
        if length <= 0:
            return Proposal()
        shared = common_prefix(self.cached, state.tokens)
        shared = min(shared, len(state.tokens) - 1)  # always feed the root to get its logits
        self.backend.rollback(shared)
        proposal = draft_chain(self._next_logits, state.tokens[shared:], length, state)
        # the draft cache now holds the committed tokens and every drafted token but the last (never fed)
        self.cached = (list(state.tokens) + proposal.tokens)[: self.backend.cache_len]
        return proposal

    def _next_logits(self, feed: list[int]) -> torch.Tensor:
        self.draft_forward_passes += 1
        return self.backend.forward(torch.tensor(feed, dtype=torch.long)).logits[-1]  # [V]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (``draft`` and ``draft-tree`` keep their caches by it)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
