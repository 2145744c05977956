"""The result of verifying one proposal."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Verdict:
    accepted: list[int]  # indices of the accepted draft nodes, root to leaf
    accepted_tokens: list[int]  # their token ids
    next_token: int  # recovered token (after a rejection) or bonus token (after a full accept)
    bonus: bool
    # Filled in by the engine for drafters that learn from the target (lookahead, auto, adaptive lengths):
    target_logits: torch.Tensor | None = field(default=None, repr=False)  # [1+N, V] root then draft nodes
    extra_logits: torch.Tensor | None = field(default=None, repr=False)  # [E, V] for Proposal.extra tokens
    target_hidden: torch.Tensor | None = field(default=None, repr=False)  # [1+N, D] for drafters that need_hidden
    committed_tokens: list[int] = field(default_factory=list)  # what the step added to the output
