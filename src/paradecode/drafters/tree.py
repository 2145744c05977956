"""Helpers every tree-drafting method shares: the parent list a proposal carries, merging chains into a prefix
tree, how many nodes fit the target's cache, and the mask for feeding tree nodes to a drafter's own cache.

A tree is a list of parent indices, parents first, -1 for a child of the root; its depths and the target's
attention mask come from ``paradecode.tree_layout``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import torch

if TYPE_CHECKING:
    from paradecode.drafters.base import DecodeState


def tree_parents(parents: list[int]) -> list[int] | None:
    """``parents`` as ``Proposal.parents`` wants them: None when the nodes form a chain (each the child of the
    one before)."""
    return None if all(parent == i - 1 for i, parent in enumerate(parents)) else parents


def merge_prefix_tree(chains: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """Merge token chains into a prefix tree of at most ``budget`` nodes: (tokens, parents), parents first."""
    tokens: list[int] = []
    parents: list[int] = []
    child_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for chain in chains:
        node = -1
        for token in chain:
            existing = child_of.get((node, token))
            if existing is None:
                if len(tokens) == budget:
                    break
                existing = child_of[(node, token)] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = existing
    return tokens, parents


def tree_room(state: "DecodeState") -> int:
    """Draft nodes that fit the target's cache this step (the root takes one slot); without a target, the
    token budget."""
    if state.target is None:
        return max(state.max_draft, 1)
    return max(state.target.max_length - len(state.tokens), 1)


def fed_nodes_mask(batch: Sequence[int], parents: Sequence[int], slots: Mapping[int, int], cached: int,
                   fed: int) -> torch.Tensor:
    """[B, cached + fed + B] mask for feeding tree nodes ``batch`` to a drafter's own cache, which holds
    ``cached`` committed entries and then ``fed`` tree nodes fed earlier (node n at ``cached + slots[n]``):
    each new node sees the committed entries, its ancestors (all fed earlier) and itself."""
    mask = torch.zeros(len(batch), cached + fed + len(batch), dtype=torch.bool)
    mask[:, :cached] = True
    for row, node in enumerate(batch):
        ancestor = parents[node]
        while ancestor >= 0:
            mask[row, cached + slots[ancestor]] = True
            ancestor = parents[ancestor]
        mask[row, cached + fed + row] = True
    return mask
