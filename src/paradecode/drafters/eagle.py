"""EAGLE drafting (Li et al. 2024): a one-layer head autoregresses on the target's features; EAGLE-2's tree.

Pairs (f_i, t_{i+1}) of the committed text sit in the head's own KV cache (``EagleCache``), pair i at slot
and position i. A step that drafts first feeds, in one pass, the pairs the verifications since its last
draft produced: the target's hidden states of each root and of every accepted node, each with the token
that followed it (the accepted tokens and the new root); a step that drafts nothing feeds nothing. The last
pair's output predicts the root's feature; its LM-head image gives the draft distribution after the root.
A tree node x with parent feature g becomes the pair (g, x) at position ``committed - 1 + depth``, fed with
a tree mask (the committed pairs, its ancestors, itself); its output is the feature its own children are
drafted from. After drafting, the cache is cut back to the committed pairs: the draft pairs carried
predicted features, and the next step feeds the target's real ones.

Before the first step the prompt's pairs come from the prefill's hidden states; a one-token prompt has
none, so its first step drafts nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from paradecode.backends.base import causal_mask
from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.head_drafter import HeadDrafter, check_tree_options
from paradecode.drafters.head_tree import DraftTree, grow_tree, tree_limits
from paradecode.drafters.tree import fed_nodes_mask
from paradecode.heads.eagle import EagleCache
from paradecode.registry import register
from paradecode.verify.base import Verdict


@dataclass(frozen=True)
class EagleOptions:
    head: str = ""  # head folder (config.json + head.safetensors); "" = the head shipped for the model
    tree: bool = False  # True: EAGLE-2's dynamic tree; False: a chain (docs/heads.md compares them)
    budget: int = 16  # most tree nodes per step
    branching: int = 4  # most children per node
    width: int = 4  # nodes expanded per head forward
    depth: int = 3  # deepest draft (the chain's longest length)
    schedule: str = "cost"  # chain length: fixed (= depth) | heuristic | cost (0 when drafting does not pay)
    head_dtype: str = "int8"  # int8: the step on the native int8 forward (heads/eagle_native.py), or PyTorch's
    # int8 linears without the native kernels (eagle3: always) | fp32: the PyTorch head as trained
    draft_vocab: int = 0  # keep the head's N most frequent draft tokens (0: its whole draft vocabulary)
    lookup: int = 2  # copy what followed an earlier occurrence of the last N+ tokens when there is one (0: never)
    lookup_draft: int = 4  # most tokens such a copy drafts

    def __post_init__(self) -> None:
        check_tree_options("eagle", self)


@register("eagle")
class EagleDrafter(HeadDrafter):
    """Drafts with an EAGLE head; see the module docstring."""

    Options = EagleOptions
    kind = "eagle"

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        room = state.target.max_length + max(self.options.budget, self.options.depth) + 1
        # the head's steps on the native int8 forward (heads/eagle_native.py), or None: the PyTorch head's cache
        self.native = self.runtime.native_layer(room)
        self.cache = self.native if self.native is not None else EagleCache(self.module.shape, room)
        features = self.prompt_features(state)  # [P-1, D] f_0 .. f_{P-2} (EAGLE-3: [P-1, A*D])
        # pairs not fed to the head yet: fed in one pass by the next step that drafts, so a step that drafts
        # nothing (the cost schedule's choice when drafting does not pay) costs no head forward
        self.pending: list[tuple[torch.Tensor, list[int]]] = [(features, state.tokens[1 : state.prompt_len])] \
            if features is not None else []
        self.foreign_pairs = sum(len(tokens) for _, tokens in self.pending)  # pending pairs it did not draft for
        self.root_feature: torch.Tensor | None = None  # [D] predicted feature of the root
        self.root_logits: torch.Tensor | None = None  # [Vd] its draft logits: the distribution after the root

    @torch.inference_mode()
    def head_draft(self, state: DecodeState) -> Proposal:
        length = self.chain_length(state)
        if state.max_draft > 0 and length > 0 and self.pending:
            start = time.perf_counter()
            features = self.module.fuse(torch.cat([f for f, _ in self.pending]))  # [T, D]
            out, logits = self._feed(features, [t for _, tokens in self.pending for t in tokens], None, None,
                                     last_logits=True)  # [T, D], [1, Vd]
            self.root_feature, self.root_logits, self.pending = out[-1], logits[-1], []
            # catching up on the committed pairs (at a request's first draft, the whole prompt's) is not what a
            # draft token costs: the schedule's price per drafted token leaves it out
            seconds = time.perf_counter() - start
            self.schedule.not_drafting(seconds)
            self.foreign_seconds = seconds * self.foreign_pairs / out.shape[0]  # the prompt's, other drafters' steps'
            self.foreign_pairs = 0
        if self.root_feature is None or state.max_draft <= 0 or length <= 0:
            self.drafted(0)
            return Proposal()
        o, runtime = self.options, self.runtime
        committed = self.cache.length
        node_features: list[torch.Tensor] = []  # [D] output feature of each expanded node, by node index
        slot: dict[int, int] = {}  # expanded node -> its cache slot after the committed pairs

        def expand(batch: list[int], tree: DraftTree) -> torch.Tensor:
            fed = self.cache.length - committed
            parent_features = torch.stack([self.root_feature if tree.parents[n] < 0
                                           else node_features[slot[tree.parents[n]]] for n in batch])  # [B, D]
            positions = torch.tensor([committed - 1 + tree.depths[n] for n in batch])
            mask = fed_nodes_mask(batch, tree.parents, slot, committed, fed)  # [B, C + fed + B]
            slot.update((node, fed + row) for row, node in enumerate(batch))
            out, logits = self._feed(parent_features, [tree.tokens[n] for n in batch], positions, mask)
            node_features.extend(out)  # out [B, D]
            return logits  # [B, Vd]

        limits = tree_limits(o.tree, o.budget, o.branching, o.width, length, state)
        try:
            proposal = grow_tree(self.root_logits, expand, state, limits, runtime.ids, runtime.vocab,
                                 self.worth_growing)  # (each node it opens costs a head forward)
        finally:
            self.cache.length = committed  # drop the draft pairs: the next step feeds the target's features
        return self.finish(proposal)

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        self.accepted(verdict)
        self._keep(verdict)

    def witness(self, state: DecodeState, verdict: Verdict) -> bool:
        self.foreign_pairs += self._keep(verdict)
        return True

    def _keep(self, verdict: Verdict) -> int:
        """Pend the step's pairs for the next feed: the target's features of the root and of every accepted node,
        each with the token that followed it; returns how many."""
        rows = [0] + [1 + i for i in verdict.accepted]  # the root and the accepted nodes
        features = verdict.target_hidden[rows].float()  # [A+1, D]
        self.pending.append((features, verdict.accepted_tokens + [verdict.next_token]))
        return len(rows)

    def _feed(self, features: torch.Tensor, tokens: list[int], positions: torch.Tensor | None,
              mask: torch.Tensor | None, last_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head on pairs (features [T, D], tokens [T]) appended to its cache -> (output features [T, D],
        draft logits [T, Vd], or [1, Vd] of the last pair with ``last_logits``). Default positions and mask (both
        None): the next slots, causally."""
        self.draft_forward_passes += 1
        embeds = self.runtime.embed[torch.tensor(tokens, dtype=torch.long)]  # [T, D]
        if self.native is not None:
            return self.native(torch.cat((embeds, features), dim=-1), positions, mask,
                               skip=len(tokens) - 1 if last_logits else 0)
        start, t = self.cache.length, len(tokens)
        if positions is None:
            positions = torch.arange(start, start + t)
            mask = causal_mask(start, t)
        out, _ = self.module(embeds[None], features[None], positions[None], mask[None], cache=self.cache)
        out = out[0]  # [T, D]
        return out, self.runtime.draft_logits(out[-1:] if last_logits else out)


@register("eagle3")
class Eagle3Drafter(EagleDrafter):
    """Drafts with an EAGLE-3 head (``heads/eagle3.py``): as ``eagle``, but the pairs' features are the inputs of
    the head's aux layers of the target (the engine hands those over, see ``engine.Features``), fused by the
    head's ``fc``, and each draft token is scored by the head's own LM head. No head ships: train one with
    ``paradecode train-draft --kind eagle3`` and pass ``--opt head=DIR``."""

    kind = "eagle3"

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.runtime.head.module.aux_layers
