"""Speculative decoding with a token tree grown by a draft model (SpecInfer, Miao et al. 2024; EAGLE-2, Li et al.
2024): the draft's most likely branches, expanded best-first under a node budget.

Every node the draft model has run on offers up to ``branching`` children, its k-th child scored by the path's
log-probability plus log of the k-th largest draft probability. Each round takes the ``width`` best-scoring
children of all open nodes, adds them to the tree and runs the draft model once on the new nodes (a tree
attention mask over the draft's own cache) to open them in turn, until ``budget`` nodes are drafted.

At temperature 0 the k-th child is the draft's k-th most likely token. Under sampling the children of a node
are drawn from q *without replacement* (child j from q with children 1..j-1 removed, renormalised) and that
renormalised q_j is reported with the node, which is what ``verify/tree.py``'s recursive rejection sampling
needs to be exact. A child is added (by rank) before its token is drawn and never pruned afterwards, so the
tree's shape never depends on a token's own value.

The draft cache is kept in step like ``draft``'s: ``observe`` keeps the accepted path's entries, and
``propose`` rolls back to the longest prefix shared with the committed text and feeds the rest. When the
target (or the draft backend) verifies chains only, the same loop grows a chain (branching 1, width 1). The
best-first loop itself is ``head_tree.grow_tree``, shared with the trained heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.drafters.draft_model import common_prefix
from paradecode.drafters.head_tree import DraftTree, TreeLimits, grow_tree
from paradecode.drafters.tree import fed_nodes_mask, tree_room
from paradecode.errors import ParadecodeError
from paradecode.registry import register
from paradecode.verify.base import Verdict


@dataclass(frozen=True)
class DraftTreeOptions:
    draft_model: str = ""  # built-in name, .gguf path or HF model directory
    budget: int = 12  # most tree nodes per step
    branching: int = 3  # most children per node (the draft's top k)
    width: int = 3  # nodes opened per draft forward pass
    depth: int = 6  # deepest branch

    def __post_init__(self) -> None:
        if not self.draft_model:
            raise ParadecodeError("method 'draft-tree' needs a draft model: pass --draft-model NAME_OR_PATH.")
        for name in ("budget", "branching", "width", "depth"):
            if getattr(self, name) < 1:
                raise ParadecodeError(f"draft-tree option {name} must be >= 1, got {getattr(self, name)}.")


@register("draft-tree")
class DraftTreeDrafter(Drafter):
    Options = DraftTreeOptions
    observe_optional: ClassVar[bool] = True  # propose re-syncs the draft cache from state.tokens
    draws_from_rng: ClassVar[bool] = True  # sampled drafts: each draws from the request's random stream
    exclusive: ClassVar[bool] = True  # the draft model's backend (one cache) serves one request at a time

    def __init__(self, options: DraftTreeOptions, context) -> None:
        super().__init__(options, context)
        if context is None:
            raise ParadecodeError("method 'draft-tree' must be created through a loaded model (paradecode.load).")
        self.backend = context.load_draft_backend(options.draft_model)
        self.cached: list[int] = []  # tokens whose keys/values sit in the draft backend's cache, in order
        self.draft_forward_passes = 0
        self.slots: dict[int, int] = {}  # tree node -> its cache slot after the committed text
        self.base = -1  # committed tokens in the draft cache when this step's tree was grown (-1: none)

    def begin(self, state: DecodeState) -> None:
        self.backend.reset()
        self.cached, self.slots, self.base = [], {}, -1

    def propose(self, state: DecodeState) -> Proposal:
        o, draft = self.options, self.backend
        self.slots, self.base = {}, -1
        tree = state.supports_tree and draft.supports_tree
        depth_limit = min(o.depth, state.max_draft, draft.max_length - len(state.tokens))
        if depth_limit <= 0:
            return Proposal()
        budget = min(o.budget if tree else depth_limit, tree_room(state))
        branching, width = (o.branching, o.width) if tree else (1, 1)

        shared = min(common_prefix(self.cached, state.tokens), len(state.tokens) - 1)  # always feed the root
        draft.rollback(shared)
        root_logits = draft.forward(torch.tensor(state.tokens[shared:], dtype=torch.long)).logits[-1]  # [V]
        self.draft_forward_passes += 1
        self.cached, self.base = list(state.tokens), len(state.tokens)

        limits = TreeLimits(budget=budget, branching=branching, width=width, depth=depth_limit)

        def expand(batch: list[int], grown: DraftTree) -> torch.Tensor:
            batch = batch[: draft.max_length - self.base - len(self.slots)]  # what the draft cache still holds
            if not batch:
                return root_logits.new_empty(0, root_logits.shape[-1])
            return self._feed(batch, grown, tree)  # [len(batch), V]

        return grow_tree(root_logits, expand, state, limits, None, draft.vocab_size)

    def _feed(self, batch: list[int], grown: DraftTree, tree: bool) -> torch.Tensor:
        """One draft forward over new tree nodes; each sees the committed text, its ancestors and itself."""
        fed = len(self.slots)
        ids = torch.tensor([grown.tokens[n] for n in batch], dtype=torch.long)
        mask = positions = None
        if tree:
            positions = torch.tensor([self.base - 1 + grown.depths[n] for n in batch], dtype=torch.long)
            # every ancestor was opened, so it was fed and has a slot
            mask = fed_nodes_mask(batch, grown.parents, self.slots, self.base, fed)  # [T, C + fed + T]
        logits = self.backend.forward(ids, positions, mask).logits  # [T, V]
        self.draft_forward_passes += 1
        for row, node in enumerate(batch):
            self.slots[node] = fed + row
        return logits

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        """Keep the accepted path's cache entries, so the next step feeds only what the draft has not seen."""
        keep = []
        for node in verdict.accepted:
            if node not in self.slots:
                break
            keep.append(self.slots[node])
        if self.base >= 0:  # propose grew a tree this step
            self.backend.commit(self.base, keep)
            self.cached = self.cached[: self.base] + verdict.accepted_tokens[: len(keep)]
        self.slots, self.base = {}, -1
