"""Plain autoregressive decoding: the drafter that proposes nothing, so each step emits one target token."""

from __future__ import annotations

from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.registry import register


@register("ar")
class AutoregressiveDrafter(Drafter):
    drafts = False  # the plain reference: one target token per forward, grammar-forced tokens included

    def propose(self, state: DecodeState) -> Proposal:
        return Proposal()

    peek = propose  # nothing to draft, nothing to change
