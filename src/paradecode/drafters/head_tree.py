"""Growing a draft tree best-first from a drafter's confidences (EAGLE-2's dynamic tree, Li et al. 2024).

Shared by ``eagle``, ``medusa`` and ``draft-tree``. A node's k-th child is offered with priority = the path's draft
log-probability + log of the node's k-th largest draft probability; each round adds the ``width`` best
offers to the tree and calls ``expand`` once on the new nodes to get their own draft logits, until
``budget`` nodes are drafted or the tree is ``depth`` deep. ``branching=1, width=1`` grows a chain.

Heads may score a draft vocabulary (``ids`` [Vd]: the full id of each draft logit). Greedy children are the
top-k draft logits, mapped to full ids. Under sampling a node's children are drawn from q *without
replacement* (child j from q with children 1..j-1 removed, renormalised) and that q_j, scattered into the full
vocabulary (zero outside the draft vocabulary), is reported with the node, as ``verify/tree.py`` needs for
exact recursive rejection sampling. The tree's shape never depends on a child's own token.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

import torch

from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.tree import tree_parents, tree_room
from paradecode.verify.sampling import probabilities, sample


@dataclass(frozen=True)
class TreeLimits:
    budget: int  # most nodes
    branching: int  # most children per node
    width: int  # nodes expanded per ``expand`` call
    depth: int  # deepest node


@dataclass
class DraftTree:
    tokens: list[int]  # full-vocabulary ids, parents first
    parents: list[int]  # -1 = child of the root
    depths: list[int]  # 1 for children of the root


@dataclass
class _Open:
    score: float  # draft log-probability of the path to this node
    log_ranked: list[float]  # log of its top `branching` draft probabilities, best first
    top: list[int] | None = None  # greedy: their draft-vocabulary indices
    q: torch.Tensor | None = None  # [Vd] sampling: the node's q
    left: torch.Tensor | None = None  # [Vd] sampling: q without the children drawn so far (unnormalised)


def grow_tree(root_logits: torch.Tensor, expand: Callable[[list[int], DraftTree], torch.Tensor],
              state: DecodeState, limits: TreeLimits, ids: torch.Tensor | None, vocab: int,
              worth_growing: Callable[[list[float], list[int]], bool] | None = None) -> Proposal:
    """root_logits [Vd]: draft logits after the root; ``expand(nodes, tree)`` -> [n, Vd] logits after each of
    the first n nodes (n < len(nodes) when the drafter has room for only n; the rest stay leaves, and n = 0
    ends the growth). ``vocab``: the full vocabulary size (of the reported q rows). ``worth_growing(confidences,
    parents)``, asked before each ``expand`` with every node's confidence and parent so far, ends the growth
    when it says no (a drafter whose proposal will be cut saves the forwards of nodes it would cut)."""
    sampling = state.sampling
    tree = DraftTree([], [], [])
    scores: list[float] = []
    confidences: list[float] = []  # each node's draft probability given its parent
    q_rows: list[torch.Tensor] = []
    opened: dict[int, _Open] = {}
    offers: list[tuple[float, int, int]] = []  # heap of (-priority, parent node, child rank)

    def open_node(node: int, logits: torch.Tensor) -> None:  # logits: [Vd]
        score = 0.0 if node < 0 else scores[node]
        k = min(limits.branching, logits.shape[-1])
        if sampling.greedy:
            top = torch.topk(torch.log_softmax(logits.float(), dim=-1), k)
            opened[node] = _Open(score, top.values.tolist(), top=top.indices.tolist())
        else:
            q = probabilities(logits, sampling)  # [Vd]
            ranked = torch.topk(q, k).values.tolist()
            opened[node] = _Open(score, [math.log(v) if v > 0 else -math.inf for v in ranked], q=q, left=q.clone())
        heapq.heappush(offers, (-(score + opened[node].log_ranked[0]), node, 0))

    open_node(-1, root_logits)
    while len(tree.tokens) < limits.budget:
        batch: list[int] = []
        while offers and len(batch) < limits.width and len(tree.tokens) < limits.budget:
            neg_priority, parent, rank = heapq.heappop(offers)
            offer = opened[parent]
            if neg_priority == math.inf or (offer.left is not None and float(offer.left.sum()) <= 0):
                continue  # q has no support left
            if rank + 1 < len(offer.log_ranked):
                heapq.heappush(offers, (-(offer.score + offer.log_ranked[rank + 1]), parent, rank + 1))
            if sampling.greedy:
                index, score = offer.top[rank], -neg_priority
            else:
                q_j = offer.left / offer.left.sum()  # [Vd] q without the siblings drawn before
                index = sample(q_j, state.rng)
                offer.left[index] = 0.0
                q_rows.append(q_j if ids is None else torch.zeros(vocab).index_copy_(0, ids, q_j))  # [V]
                score = offer.score + math.log(float(offer.q[index]))
            token = int(index if ids is None else ids[index])
            node = len(tree.tokens)
            depth = 1 if parent < 0 else tree.depths[parent] + 1
            tree.tokens.append(token)
            tree.parents.append(parent)
            tree.depths.append(depth)
            scores.append(score)
            confidences.append(math.exp(score - offer.score))
            if token not in state.eos_ids and depth < limits.depth:
                batch.append(node)
        if not batch or len(tree.tokens) >= limits.budget:
            break
        if worth_growing is not None and not worth_growing(confidences, tree.parents):
            break
        logits = expand(batch, tree)  # [n, Vd]: the first n <= len(batch) nodes opened
        if logits.shape[0] == 0:
            break  # the drafter has no room left to open a node
        for row, node in enumerate(batch[: logits.shape[0]]):
            open_node(node, logits[row])

    return Proposal(tokens=tree.tokens, parents=tree_parents(tree.parents),
                    draft_probs=torch.stack(q_rows) if q_rows else None, confidences=confidences)


def tree_limits(tree: bool, budget: int, branching: int, width: int, depth: int, state: DecodeState) -> TreeLimits:
    """The step's limits: a chain when ``tree`` is off or the target verifies chains only; never deeper than
    the token budget, never wider than the target's cache."""
    depth = min(depth, state.max_draft)
    room = tree_room(state)
    if not (tree and state.supports_tree):
        return TreeLimits(budget=min(depth, room), branching=1, width=1, depth=depth)
    return TreeLimits(budget=min(budget, room), branching=branching, width=width, depth=depth)

