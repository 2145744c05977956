"""Medusa drafting (Cai et al. 2024): K heads on the target's last hidden state, their top tokens as a tree.

The target's hidden state that produced the root (the last accepted row of the previous verification, or
the prefill's last row) feeds all K heads at once; head k gives the draft distribution of the token k places
after the root. A tree node at depth d offers its children from head d+1 (Medusa's candidates do not depend
on the parent token), ranked and grown best-first by path confidence like EAGLE-2's tree (``head_tree``), so
no head runs more than once per step. ``tree=false`` drafts a chain of each head's top token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.head_drafter import HeadDrafter, check_tree_options
from paradecode.drafters.head_tree import DraftTree, grow_tree, tree_limits
from paradecode.registry import register
from paradecode.verify.base import Verdict


@dataclass(frozen=True)
class MedusaOptions:
    head: str = ""  # head folder (config.json + head.safetensors); "" = the heads shipped for the model
    tree: bool = False  # True: a tree of the heads' top tokens; False: a chain (docs/heads.md compares them)
    budget: int = 12  # most tree nodes per step
    branching: int = 3  # most children per node
    width: int = 12  # nodes offered per round (all heads are computed at once, so wide rounds cost nothing)
    depth: int = 3  # deepest draft (the chain's longest length); at most the number of heads
    schedule: str = "cost"  # chain length: fixed (= depth) | heuristic | cost (0 when drafting does not pay)
    head_dtype: str = "int8"  # int8: linears + draft LM head quantized at load (a quarter of the reads) | fp32
    draft_vocab: int = 0  # keep the heads' N most frequent draft tokens (0: their whole draft vocabulary)
    lookup: int = 2  # copy what followed an earlier occurrence of the last N+ tokens when there is one (0: never)
    lookup_draft: int = 4  # most tokens such a copy drafts

    def __post_init__(self) -> None:
        check_tree_options("medusa", self)


@register("medusa")
class MedusaDrafter(HeadDrafter):
    """Drafts with Medusa heads; see the module docstring."""

    Options = MedusaOptions
    kind = "medusa"

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        features = self.prompt_features(state)  # [P-1, D]
        self.root_hidden = None if features is None else features[-1]  # [D] the row that predicted the root

    @torch.inference_mode()
    def head_draft(self, state: DecodeState) -> Proposal:
        length = self.chain_length(state)
        if self.root_hidden is None or state.max_draft <= 0 or length <= 0:
            self.drafted(0)
            return Proposal()
        logits = self.runtime.draft_logits(self.module(self.root_hidden))  # [K, Vd]
        self.draft_forward_passes += 1
        o = self.options
        limits = tree_limits(o.tree, o.budget, o.branching, o.width, min(length, self.module.num_heads), state)

        def expand(batch: list[int], tree: DraftTree) -> torch.Tensor:
            return logits[[tree.depths[n] for n in batch]]  # [B, Vd] children of depth d come from head d+1

        proposal = grow_tree(logits[0], expand, state, limits, self.runtime.ids, self.runtime.vocab)
        return self.finish(proposal)

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        self.accepted(verdict)
        self.witness(state, verdict)

    def witness(self, state: DecodeState, verdict: Verdict) -> bool:
        last = 1 + verdict.accepted[-1] if verdict.accepted else 0  # the row whose logits gave the new root
        self.root_hidden = verdict.target_hidden[last].float()
        return True
