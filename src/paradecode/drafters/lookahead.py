"""Lookahead decoding (Fu et al., 2024): harvest n-grams from Jacobi trajectories, verify them in the same pass.

Each step's one target forward pass carries two branches next to the root:

- **verification**: up to ``candidates`` n-grams from the pool whose first token is the root, proposed as a tree that
  shares common prefixes (or, when the backend verifies chains only, the most recent one as a chain). The
  engine verifies them exactly like any draft, so greedy output equals autoregressive decoding and sampling
  stays exact (deterministic drafts: every emitted token is a draw from p).
- **lookahead**: a 2-D Jacobi window of ``ngram_size - 1`` levels and ``window`` columns, riding along as extra inputs
  (never verified). The root is column 0 of level 0; token (level l, column j) sits j + l positions after
  the root and sees the root, level 0's columns before j and its own column's levels 1..l, so its context is
  the contiguous guess ``root, level0[1..j], level1[j], ..., level_l[j]``. Extras never see draft nodes.

After the pass, column j of the window plus the target's prediction after its top token is an n-gram of
``ngram_size`` tokens (positions j .. j + ngram_size - 1 after the root) that goes into the pool. Then the
window advances one Jacobi step: level l + 1 becomes level l (level 0 drops column 0, which the next root
replaces) and the predictions become the new top level. Like the paper, the window advances one position per step however many tokens
were accepted. The pool also takes every n-gram of the prompt (at ``begin``) and of the committed output.
The paper's names for the options, ``W``, ``N`` and ``G``, are still accepted (with a warning).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import torch

from paradecode.backends.native import row_argmax
from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.drafters.ngram_pool import NgramPool
from paradecode.drafters.tree import merge_prefix_tree, tree_parents
from paradecode.errors import ParadecodeError
from paradecode.registry import register
from paradecode.verify.base import Verdict


@dataclass(frozen=True)
class LookaheadOptions:
    # Defaults for small models on CPU, where every token fed costs (docs/methods.md).
    window: int = 3  # lookahead window width (columns); the paper's W
    ngram_size: int = 3  # n-gram size; the window has ngram_size - 1 levels; the paper's N
    candidates: int = 2  # most n-grams verified per step (and kept per first token); the paper's G
    pool_keys: int = 4096  # most first tokens the pool remembers (LRU)

    def __post_init__(self) -> None:
        if self.window < 1 or self.ngram_size < 3 or self.candidates < 0 or self.pool_keys < 1:
            raise ParadecodeError(
                "lookahead needs window >= 1, ngram_size >= 3, candidates >= 0 and pool_keys >= 1, got "
                f"window={self.window}, ngram_size={self.ngram_size}, candidates={self.candidates}, "
                f"pool_keys={self.pool_keys}."
            )


def window_offsets(width: int, depth: int) -> list[int]:
    """Distance from the root of each window token, in extras order: level 0 (columns 1..width-1), then levels
    1..depth-2 (columns 0..width-1); ``depth`` is the n-gram size."""
    return [j for j in range(1, width)] + [j + level for level in range(1, depth - 1) for j in range(width)]


def window_index(width: int, level: int, column: int) -> int:
    """Index among the extras of the token at (level, column); (0, 0) is the root, not an extra."""
    return column - 1 if level == 0 else width - 1 + (level - 1) * width + column


def window_mask(width: int, depth: int) -> torch.Tensor:
    """[E, 1 + E] bool: what each window token sees among root (column 0) + window tokens (column 1 + index)."""
    extras = (width - 1) + (depth - 2) * width
    mask = torch.zeros(extras, 1 + extras, dtype=torch.bool)
    for level in range(depth - 1):
        for column in range(1 if level == 0 else 0, width):
            row = window_index(width, level, column)
            mask[row, 0] = True  # the root
            for before in range(1, column + 1):  # level 0 up to this column
                mask[row, 1 + window_index(width, 0, before)] = True
            for lower in range(1, level + 1):  # this column's levels 1..level (itself included)
                mask[row, 1 + window_index(width, lower, column)] = True
    return mask


@register("lookahead")
class LookaheadDrafter(Drafter):
    Options = LookaheadOptions
    renamed_options: ClassVar[dict[str, str]] = {"W": "window", "N": "ngram_size", "G": "candidates"}

    def begin(self, state: DecodeState) -> None:
        o = self.options
        width, size = o.window, o.ngram_size
        self.pool = NgramPool(per_key=max(o.candidates, 1), max_keys=o.pool_keys)
        self.pool.add_all(state.tokens, size)
        self.harvested = len(state.tokens)  # n-grams ending before this index are in the pool
        self.offsets = window_offsets(width, size)
        self.mask = window_mask(width, size)  # [E, 1 + E]
        seeded = random.Random(0)  # the window starts from prompt tokens, as in the paper's code
        self.levels = [[seeded.choice(state.tokens) for _ in range(width - (level == 0))] for level in range(size - 1)]
        self.trajectory_steps = 0  # Jacobi steps so far: levels above 0 are model-made once this reaches size - 2
        self.pool_hits = 0

    def propose(self, state: DecodeState) -> Proposal:
        candidates = self.pool.candidates(state.tokens[-1], self.options.candidates)
        if not state.supports_tree:
            candidates = candidates[:1]
        tokens, parents = merge_prefix_tree([list(c) for c in candidates], budget=sum(map(len, candidates)))
        proposal = Proposal(tokens=tokens, parents=tree_parents(parents), info={"candidates": len(candidates)})
        if state.max_draft > 0:  # the window only pays off if another step follows
            cache_len = len(state.tokens) - 1  # the root's position
            extras = len(self.offsets)
            mask = torch.zeros(extras, 1 + len(tokens) + extras, dtype=torch.bool)  # [E, 1 + N + E]
            mask[:, 0] = self.mask[:, 0]
            mask[:, 1 + len(tokens) :] = self.mask[:, 1:]
            proposal.extra_tokens = [t for level in self.levels for t in level]
            proposal.extra_positions = [cache_len + offset for offset in self.offsets]
            proposal.extra_mask = mask
        return proposal

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        width, size = self.options.window, self.options.ngram_size
        if verdict.accepted:
            self.pool_hits += 1
        if verdict.extra_logits is not None:
            predicted = row_argmax(verdict.extra_logits)  # [E]
            top = [predicted[window_index(width, size - 2, j)] for j in range(width)]  # after each top-level token
            if self.trajectory_steps >= size - 2:
                row0 = [state.tokens[-1 - len(verdict.committed_tokens)]] + self.levels[0]  # root + level 0
                for j in range(width):
                    self.pool.add([row0[j]] + [self.levels[level][j] for level in range(1, size - 1)] + [top[j]])
            self.levels = [self.levels[1][1:]] + self.levels[2:] + [top]
            self.trajectory_steps += 1
        self.pool.add_all(state.tokens, size, start=self.harvested - size + 1)
        self.harvested = len(state.tokens)

    def summary(self) -> dict:
        return {"pool_size": len(self.pool), "steps_with_pool_hit": self.pool_hits}
