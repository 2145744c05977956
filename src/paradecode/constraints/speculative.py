"""A constraint is a transform of the target distribution: the grammar masks the target's logits before
verification, so the verify functions stay pure and verify against p' = p restricted to what the grammar
allows (renormalised; greedy takes the masked argmax). Exact under speculation, step by step:

* Forced tokens are a proposal: where the grammar admits only one text (JSON keys, separators), its tokens are
  proposed as drafts, in front of (or instead of) the drafter's, for free. Only for deterministic drafts (all
  of them at temperature 0): a drafter that samples its tokens from its own q keeps its proposal as it is.
* A draft is cut at the first token the grammar rejects. Such a token has p'(x) = 0, so verification never
  accepts it; the rows below it are never read (their masks are left open). A chain of deterministic drafts
  simply ends before it. A chain drawn from q keeps the rejected token as its last node, so speculative
  sampling rejects it with certainty and draws from normalize(max(0, p' - q)) as the proof requires (cutting
  it off and drawing from p' instead would skew the output towards tokens q makes likely). Trees keep their
  shape (nodes keep their indices for the drafters that track them); rejected branches are never accepted.
* The grammar state moves along each draft to compute the rows' masks, rolls back to the committed output,
  and advances by the tokens each step commits.
"""

from __future__ import annotations

import torch

from paradecode.constraints.grammar import GrammarState
from paradecode.drafters.base import Proposal


class Constraint:
    """The engine's hook: ``with_forced`` before trimming a proposal, ``masks`` before verifying it, ``commit``
    after."""

    def __init__(self, state: GrammarState) -> None:
        self.state = state
        self.forced_tokens = 0  # forced tokens proposed (for the stats)

    def with_forced(self, proposal: Proposal, max_draft: int) -> Proposal:
        """The proposal with the grammar's forced tokens in front, for deterministic drafts."""
        if proposal.draft_probs is not None or max_draft <= 0:
            return proposal
        forced = self.state.forced()[:max_draft]
        if not forced or _has_path(proposal, forced):
            return proposal
        self.forced_tokens += len(forced)
        if proposal.is_chain and proposal.extra_tokens is None:  # the drafter's tokens may go on after them
            tail = proposal.tokens[len(forced):] if proposal.tokens[: len(forced)] == forced else []
            return Proposal(tokens=forced + tail, info=proposal.info)
        return Proposal(tokens=forced, info=proposal.info)

    def masks(self, proposal: Proposal) -> torch.Tensor:
        """[1+N, V] bool: the tokens the grammar allows after the root and after each node; a chain is cut (in
        place) at the first node the grammar rejects."""
        tokens, parents = proposal.tokens, proposal.node_parents
        rows = [self.state.allowed()]  # row 0: after the committed output
        valid = [False] * len(tokens)  # the grammar has a state after the node (an allowed token, not the end)
        path: list[int] = []  # the nodes the grammar state has consumed, root first
        for i, token in enumerate(tokens):
            parent = parents[i]
            if (parent >= 0 and not valid[parent]) or not rows[parent + 1][token]:
                if proposal.is_chain:
                    break
                rows.append(torch.ones_like(rows[0]))  # below a rejected node or the end: never read
                continue
            if token in self.state.eos_ids:  # allowed: the output ends here, nothing after it is read
                rows.append(torch.ones_like(rows[0]))
                if proposal.is_chain:
                    break
                continue
            target = _ancestors(parents, parent)
            common = next((k for k, (a, b) in enumerate(zip(path, target)) if a != b), min(len(path), len(target)))
            self.state.rollback(len(path) - common)
            path = path[:common]
            for node in target[common:] + [i]:
                if not self.state.advance(tokens[node]):
                    raise RuntimeError(f"the grammar rejected token {tokens[node]} it had allowed")
                path.append(node)
            valid[i] = True
            rows.append(self.state.allowed())
        self.state.rollback(len(path))
        if proposal.is_chain and len(rows) < 1 + len(tokens):
            ended = len(rows) > 1 and tokens[len(rows) - 2] in self.state.eos_ids
            keep = len(rows) - 1 + (proposal.draft_probs is not None and not ended)  # q drafts keep a rejected token
            if keep > len(rows) - 1:
                rows.append(torch.ones_like(rows[0]))  # the rejected token's row: never read
            proposal.keep(list(range(keep)))
        return torch.stack(rows)  # [1+N, V]

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            if not self.state.advance(token):
                raise RuntimeError(f"the grammar rejected committed token {token}")

    def summary(self) -> dict:
        return dict(grammar_masks=self.state.masks, grammar_mask_time_s=self.state.mask_time_s,
                    grammar_forced_tokens=self.forced_tokens)


def _ancestors(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's first child down to ``node`` (empty for the root, -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _has_path(proposal: Proposal, tokens: list[int]) -> bool:
    """Whether the proposal already holds ``tokens`` as a path from the root."""
    node = -1
    parents = proposal.node_parents
    for token in tokens:
        node = next((i for i, p in enumerate(parents) if p == node and proposal.tokens[i] == token), None)
        if node is None:
            return False
    return True

