"""Exact verification of a token tree with draft probabilities: recursive rejection sampling over siblings.

This is SpecInfer's multi-step speculative sampling (Miao et al. 2024), in the form of Recursive Speculative
Decoding (Jeon et al. 2024) for drafts drawn without replacement. p is the target's distribution at a node,
q the drafter's. Walk from the root; at the current node with target distribution p, try its children
x_1, x_2, ... in order (node order in the proposal):

    accept x_j with probability min(1, p_j(x_j) / q_j(x_j))   -> move to x_j, its p is the target's row;
    on rejection  p_{j+1} = normalize(max(0, p_j - q_j))       -> try the next sibling;
    all rejected: emit the recovered token ~ p_{k+1}; a node without children emits the bonus token ~ p.

Here p_1 = p and ``draft_probs[c]`` must be q_j: **the distribution child c's token was drawn from, given the
tokens of the siblings before it** (and of its ancestors). Why that makes each emitted token exactly ~ p:
let O_j be the token emitted when the walk reaches sibling j with residual p_j. Given everything drawn before,
x_j ~ q_j, so P(accept, O_j = x) = q_j(x) min(1, p_j(x)/q_j(x)) = min(p_j, q_j)(x), and rejection happens with
probability r = 1 - sum min(p_j, q_j) = sum max(0, p_j - q_j). The later siblings are drawn after x_j from
q_{j+1}, ... whatever x_j was, so by induction (from j = k + 1, a plain draw from p_{k+1}) O_{j+1} ~ p_{j+1}:
    P(O_j = x) = min(p_j, q_j)(x) + r * max(0, p_j - q_j)(x) / r = p_j(x).
So O_1 ~ p; the accepted child's subtree is then verified against the target's row for that child, the same
argument applies one level down, and the committed path is distributed as autoregressive sampling.

Two drafting schemes satisfy "x_j ~ q_j given the earlier siblings":
  * with replacement: every sibling is an independent draw from the node's q, and q_j = q for every j.
    Duplicate siblings must stay separate nodes: after x is rejected p_{j+1}(x) = 0, so a later copy of x is
    rejected for sure, but its residual step (subtracting q once more) must still happen.
  * without replacement (what ``draft-tree`` does): x_j is drawn from q with x_1..x_{j-1} removed and
    renormalised, and that renormalised q_j is what the drafter reports. Feeding the plain q here for such
    draws would be wrong (the tests check that this variant fails the distribution test).
Which and how many children a node gets may depend on anything drawn earlier (scores of other nodes), but not
on the child's own token: pruning a drawn token because it looks unlikely would bias the result.
"""

from __future__ import annotations

from typing import Sequence

import torch

from paradecode.verify.base import Verdict
from paradecode.verify.sampling import sample, uniform


def verify_tree(
    draft_tokens: Sequence[int],
    parents: Sequence[int],  # parent index of each node (-1 = root), parents first
    draft_probs: torch.Tensor,  # [N, V] q_j of each node: what its token was drawn from, given earlier siblings
    target_probs: torch.Tensor,  # [1+N, V] p: row 0 at the root, row 1+i after node i
    rng: torch.Generator,
) -> Verdict:
    children: dict[int, list[int]] = {}  # node -> its children in the order they were drawn
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    accepted: list[int] = []
    node = -1  # the root
    while True:
        p = target_probs[node + 1]  # [V]
        siblings = children.get(node, [])
        for child in siblings:
            token, q = draft_tokens[child], draft_probs[child]  # q: [V]
            if uniform(rng) * float(q[token]) < float(p[token]):  # u < p(x)/q(x), without dividing by 0
                accepted.append(child)
                node = child
                break
            residual = torch.clamp(p - q, min=0.0)  # [V]
            total = float(residual.sum())
            if total > 0:  # total == 0 means p == q, where rejection has probability 0
                p = residual / total
        else:
            tokens = [draft_tokens[i] for i in accepted]
            return Verdict(accepted, tokens, sample(p, rng), bonus=not siblings)
