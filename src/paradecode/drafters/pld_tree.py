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

from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.drafters.ngram_index import NgramOccurrences
from paradecode.drafters.tree import merge_prefix_tree, tree_parents, tree_room
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


@register("pld-tree")
class PromptLookupTreeDrafter(Drafter):
    Options = PromptLookupTreeOptions
    # not a default `auto` candidate: its peeks over-rate it (drafters/auto.py, "Candidates"); candidates= adds it
    training_free: ClassVar[bool] = False

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

    peek = propose  # a function of state.tokens (the index only catches up with them)

