"""How a token tree is laid out for one forward pass: each node's depth (its position) and the attention mask.

Backends, the engine and the drafters all read trees this way, so it lives below all of them. A tree is a list
of parent indices, parents first; -1 is the root (the last cached token). Masks are boolean, ``True`` = may
attend, and cover ``[T, cache_len + T]`` as ``backends.base.Backend.forward`` takes them.
"""

from __future__ import annotations

from typing import Sequence

import torch


def tree_mask(parents: Sequence[int], cache_len: int) -> torch.Tensor:
    """[T, cache_len + T] mask for new tokens that form a forest: ``parents[i]`` is the index of node i's
    parent among the new tokens (< i), or -1 when its parent is the last cached token. Each node sees the
    whole cache, its ancestors and itself."""
    t = len(parents)
    local = torch.zeros(t, t, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError(f"tree node {i} has parent {parent}; parents must come first")
        local[i, i] = True
        if parent >= 0:
            local[i] |= local[parent]
    mask = torch.ones(t, cache_len + t, dtype=torch.bool)
    mask[:, cache_len:] = local
    return mask


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (1 for children of the cached root)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths
