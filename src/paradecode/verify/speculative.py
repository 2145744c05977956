"""Exact verification under sampling (temperature > 0).

With draft probabilities q (a draft model), this is speculative sampling (Leviathan et al. 2023; Chen et al.
2023). At draft position i with token x ~ q_i:
    accept x with probability min(1, p_i(x) / q_i(x));
    on rejection, draw the recovered token from normalize(max(0, p_i - q_i)) and stop;
    after a full accept, draw the bonus token from p_n.
Each emitted token is then distributed exactly as p: P(x) = q(x) min(1, p/q) + (1 - sum_y min(p, q)) *
max(0, p - q)(x) / sum max(0, p - q) = min(p, q)(x) + max(0, p - q)(x) = p(x).

Without q (deterministic drafts: n-grams, a tree of candidates), draw x ~ p at the current node and move to
the child carrying x, if any; stop at the first node with no such child, emitting x. Every emitted token is a
plain draw from p, so this is exact too, for chains and trees alike.
"""

from __future__ import annotations

from typing import Sequence

import torch

from paradecode.verify.base import Verdict
from paradecode.verify.sampling import sample, uniform
from paradecode.verify.tree import verify_tree


def verify_speculative(
    draft_tokens: Sequence[int],
    parents: Sequence[int] | None,
    draft_probs: torch.Tensor | None,  # [N, V] q of each node's token; None for deterministic drafts
    target_probs: torch.Tensor,  # [1+N, V] p: row 0 at the root, row 1+i after node i
    rng: torch.Generator,
) -> Verdict:
    if draft_probs is None:
        return _verify_by_sampling(draft_tokens, parents, target_probs, rng)
    if parents is not None and any(parent != i - 1 for i, parent in enumerate(parents)):
        return verify_tree(draft_tokens, parents, draft_probs, target_probs, rng)  # siblings: verify/tree.py
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]  # [V], [V]
        if uniform(rng) * float(q[token]) < float(p[token]):  # u < p(x)/q(x), without dividing by 0
            continue
        residual = torch.clamp(p - q, min=0.0)  # [V]
        total = float(residual.sum())
        recovered = sample(residual / total if total > 0 else p, rng)
        return Verdict(list(range(i)), list(draft_tokens[:i]), recovered, bonus=False)
    n = len(draft_tokens)
    return Verdict(list(range(n)), list(draft_tokens), sample(target_probs[n], rng), bonus=True)


def _verify_by_sampling(
    draft_tokens: Sequence[int],
    parents: Sequence[int] | None,
    target_probs: torch.Tensor,  # [1+N, V]
    rng: torch.Generator,
) -> Verdict:
    if parents is None:
        parents = list(range(-1, len(draft_tokens) - 1))
    children: dict[int, dict[int, int]] = {}  # node -> {token: child}
    for i, parent in enumerate(parents):
        children.setdefault(parent, {}).setdefault(draft_tokens[i], i)
    accepted: list[int] = []
    node = -1
    while True:
        token = sample(target_probs[node + 1], rng)
        child = children.get(node, {}).get(token)
        if child is None:
            return Verdict(accepted, [draft_tokens[i] for i in accepted], token, bonus=node not in children)
        accepted.append(child)
        node = child
