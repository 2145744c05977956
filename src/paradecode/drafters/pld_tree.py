"""Prompt lookup as a token tree: several earlier continuations of the current suffix, merged into a prefix tree.

Where ``pld`` copies what followed the latest occurrence of the longest matching suffix, ``pld-tree`` collects
the continuations after the last few occurrences of that suffix and of shorter suffixes (longest suffix
first, most recent occurrence first), and merges them into a prefix tree of at most ``budget`` nodes, verified
in one target forward pass. Candidates that share a prefix share nodes, so a tree costs fewer tokens than the
chains it holds. When the backend verifies chains only, it proposes the first candidate, exactly like ``pld``.
Drafts are deterministic (no q), so sampling stays exact through ``verify_speculative``'s q-free path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from paradecode.drafters.base import DecodeState, Drafter, Proposal, tree_parents
from paradecode.errors import ParadecodeError
from paradecode.registry import register


@dataclass(frozen=True)
class PromptLookupTreeOptions:
    max_ngram: int = 3  # longest suffix to match
    min_ngram: int = 1  # shortest suffix to match
    num_draft: int = 6  # deepest branch (tokens per candidate)
    budget: int = 8  # most tree nodes per step (each costs target compute: small on CPU)
    occurrences: int = 3  # latest occurrences remembered per n-gram
    candidates: int = 4  # most continuations merged into the tree

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ParadecodeError(
                "pld-tree needs 1 <= min_ngram <= max_ngram, "
                f"got min_ngram={self.min_ngram}, max_ngram={self.max_ngram}."
            )
        for name in ("num_draft", "budget", "occurrences", "candidates"):
            if getattr(self, name) < 1:
                raise ParadecodeError(f"pld-tree option {name} must be >= 1, got {getattr(self, name)}.")


class NgramOccurrences:
    """Maps each n-gram (min_n <= n <= max_n) of a growing token list to the ends of its latest occurrences."""

    def __init__(self, min_n: int, max_n: int, keep: int) -> None:
        self.min_n, self.max_n, self.keep = min_n, max_n, keep
        self.ends: dict[tuple[int, ...], list[int]] = {}  # oldest first, at most `keep`
        self.indexed = 0  # n-grams ending before this position are indexed

    def update(self, tokens: list[int], upto: int) -> None:
        """Index the n-grams ending at positions [indexed, upto)."""
        for end in range(self.indexed, upto):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                ends = self.ends.setdefault(tuple(tokens[end - n + 1 : end + 1]), [])
                ends.append(end)
                if len(ends) > self.keep:
                    del ends[0]
        self.indexed = max(self.indexed, upto)

    def continuations(self, tokens: list[int], length: int, limit: int) -> list[list[int]]:
        """Up to ``limit`` distinct continuations of ``tokens``' suffix, best first: longest suffix, then latest."""
        self.update(tokens, len(tokens) - 1)  # never match the suffix against itself
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            for end in reversed(self.ends.get(tuple(tokens[-n:]), ())):
                continuation = tuple(tokens[end + 1 : end + 1 + length])
                if continuation and continuation not in seen:
                    seen.add(continuation)
                    found.append(list(continuation))
                    if len(found) == limit:
                        return found
        return found


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


@register("pld-tree")
class PromptLookupTreeDrafter(Drafter):
    Options = PromptLookupTreeOptions
    training_free: ClassVar[bool] = True  # a candidate for `auto`

    def begin(self, state: DecodeState) -> None:
        o = self.options
        self.index = NgramOccurrences(o.min_ngram, o.max_ngram, o.occurrences)

    def propose(self, state: DecodeState) -> Proposal:
        depth = min(self.options.num_draft, state.max_draft)
        if depth <= 0:
            return Proposal()
        limit = self.options.candidates if state.supports_tree else 1
        chains = self.index.continuations(state.tokens, depth, limit)
        budget = min(self.options.budget, tree_room(state))
        if len(chains) <= 1:
            return Proposal(tokens=chains[0][:budget] if chains else [])
        tokens, parents = merge_prefix_tree(chains, budget)
        return Proposal(tokens=tokens, parents=tree_parents(parents))  # None: candidates were prefixes of one another


def tree_room(state: DecodeState) -> int:
    """Draft nodes that fit the target's cache this step (the root takes one slot)."""
    max_length = getattr(state.target, "max_length", None)
    if max_length is None:
        return max(state.max_draft, 1)
    return max(max_length - len(state.tokens), 1)
