"""Greedy verification (temperature 0): exact by construction.

Walk from the root: the target's argmax at the current node is the token plain autoregressive decoding would
emit there. If a child of the node carries that token, accept it and continue from the child; otherwise stop,
and the argmax is the target's own next token. For a chain this is "the longest draft prefix equal to the
target's argmax, plus the target's next token".
"""

from __future__ import annotations

from typing import Sequence

import torch

from paradecode.backends.native import row_argmax
from paradecode.verify.base import Verdict


def verify_greedy(
    draft_tokens: Sequence[int],
    parents: Sequence[int] | None,
    target_logits: torch.Tensor,  # [1+N, V]: row 0 is the root (last committed token), row 1+i is node i
) -> Verdict:
    n = len(draft_tokens)
    if parents is None:
        parents = list(range(-1, n - 1))
    argmax = row_argmax(target_logits)  # [1+N]
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)

    accepted: list[int] = []
    node = -1  # the root
    while True:
        want = argmax[node + 1]
        match = next((c for c in children.get(node, ()) if draft_tokens[c] == want), None)
        if match is None:
            return Verdict(
                accepted=accepted,
                accepted_tokens=[draft_tokens[i] for i in accepted],
                next_token=want,
                bonus=node not in children,
            )
        accepted.append(match)
        node = match
