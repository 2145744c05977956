"""Prompt lookup decoding (Saxena 2023): draft by copying what followed an earlier occurrence of the suffix.

Match the last n tokens (largest n first, down to ``min_ngram``) against the prompt and the text generated so
far, and propose the tokens that followed the most recent earlier occurrence (``drafters.ngram_index``). How
many tokens to propose is the ``schedule`` option's call (``drafters.schedule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.ngram_index import NgramIndex
from paradecode.drafters.schedule import ScheduledDrafter, check_schedule_options
from paradecode.errors import ParadecodeError
from paradecode.registry import register
from paradecode.verify.base import Verdict


@dataclass(frozen=True)
class PromptLookupOptions:
    max_ngram: int = 3  # longest suffix to match
    min_ngram: int = 1  # shortest suffix to match
    num_draft: int = 6  # most tokens to propose per step (fixed), or the first step's (heuristic, cost)
    schedule: str = "cost"  # fixed | heuristic | cost: see drafters.schedule
    max_num_draft: int = 16  # ceiling for the heuristic and cost schedules

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ParadecodeError(
                f"pld needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, max_ngram={self.max_ngram}."
            )
        check_schedule_options("pld", self.schedule, self.num_draft, self.max_num_draft)


@register("pld")
class PromptLookupDrafter(ScheduledDrafter):
    Options = PromptLookupOptions
    # the index catches up with state.tokens itself; observe only feeds the schedule its own steps' verdicts
    observe_optional: ClassVar[bool] = True

    def begin(self, state: DecodeState) -> None:
        self.index = NgramIndex(self.options.min_ngram, self.options.max_ngram)
        self.schedule = self.new_schedule(state)

    def propose(self, state: DecodeState) -> Proposal:
        tokens = self._draft(state, self.schedule.length())
        self.schedule.proposed(len(tokens))
        return Proposal(tokens=tokens)

    def peek(self, state: DecodeState) -> Proposal:
        length = self.schedule.planned()
        candidate = self._draft(state, max(length, self.schedule.planned_candidates()))
        probe = Proposal(tokens=candidate)  # the longest continuation, judged position by position (Drafter.peek)
        return Proposal(tokens=candidate[:length], info={"probe": probe})

    def peeked(self, proposal: Proposal, accepted: int) -> None:
        self.schedule.judged(len(proposal.tokens), accepted)

    def _draft(self, state: DecodeState, length: int) -> list[int]:
        length = min(length, state.max_draft)
        return self.index.continuation(state.tokens, length) if length > 0 else []

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        self.schedule.update(len(verdict.accepted))
