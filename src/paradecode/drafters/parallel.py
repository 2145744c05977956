"""Parallel drafting: a head fills every draft position of a step in one forward (``heads/parallel.py``).

The committed pairs sit in the head's cache as for ``eagle3`` (``drafters/eagle.py``: fed lazily, in one pass,
by the next step that drafts). A step that drafts k tokens runs one head forward over the pending pairs
followed by k - 1 mask rows: the last pair's output scores depth 1, mask row m depth m + 1. Then the mask
rows are dropped from the cache. The k distributions do not depend on the tokens drafted before them, so the
step's proposal is grown from them as Medusa's is (``head_tree.grow_tree``, children of a depth-d node from
row d): a chain of each depth's top token, or a tree ranked by path marginals; under the cost schedule the
greedy proposal is cut to the prefix worth its verify time by the calibrated acceptance (``HeadDrafter``).
Under sampling each node is drawn from its depth's distribution and reported with it, which keeps the
verifiers exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradecode.backends.base import causal_mask
from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.eagle import Eagle3Drafter
from paradecode.drafters.head_drafter import check_tree_options
from paradecode.drafters.head_tree import DraftTree, grow_tree, tree_limits
from paradecode.errors import ParadecodeError
from paradecode.heads.parallel import MAX_MASKS
from paradecode.registry import register


@dataclass(frozen=True)
class ParallelOptions:
    head: str = ""  # head folder (config.json + head.safetensors) from `train-draft --kind parallel`
    tree: bool = False  # True: a tree of each depth's top tokens ranked by path marginals; False: a chain
    budget: int = 12  # most tree nodes per step
    branching: int = 3  # most children per node
    width: int = 12  # nodes offered per round (every depth is scored in the one forward: wide rounds are free)
    depth: int = 4  # deepest draft: the forward's mask rows are depth - 1 (at most MAX_MASKS + 1)
    schedule: str = "cost"  # chain length: fixed (= depth) | heuristic | cost (0 when drafting does not pay)
    head_dtype: str = "int8"  # int8: linears + draft LM head quantized at load (a quarter of the reads) | fp32
    draft_vocab: int = 0  # keep the head's N most frequent draft tokens (0: its whole draft vocabulary)
    lookup: int = 2  # copy what followed an earlier occurrence of the last N+ tokens when there is one (0: never)
    lookup_draft: int = 4  # most tokens such a copy drafts

    def __post_init__(self) -> None:
        check_tree_options("parallel", self)
        if self.depth > MAX_MASKS + 1:
            raise ParadecodeError(f"parallel option depth must be <= {MAX_MASKS + 1} (the head's mask rows), "
                                  f"got {self.depth}.")


@register("parallel")
class ParallelDrafter(Eagle3Drafter):
    """Drafts with a parallel head; see the module docstring. No head ships: train one with
    ``paradecode train-draft --kind parallel`` and pass ``--opt head=DIR``."""

    Options = ParallelOptions
    kind = "parallel"

    def begin(self, state: DecodeState) -> None:
        super().begin(state)
        self.last_logits: torch.Tensor | None = None  # [Vd] the last committed pair's draft logits (depth 1)
        self.last_fused: torch.Tensor | None = None  # [D] its fused target feature (the mask rows' feature)

    @torch.inference_mode()
    def head_draft(self, state: DecodeState) -> Proposal:
        length = self.chain_length(state)
        o, runtime = self.options, self.runtime
        limits = tree_limits(o.tree, o.budget, o.branching, o.width, length, state)
        if (not self.pending and self.last_logits is None) or state.max_draft <= 0 or length <= 0 or limits.budget <= 0:
            self.drafted(0)
            return Proposal()
        logits = self._forward(limits.depth - 1)  # [depth, Vd]

        def expand(batch: list[int], tree: DraftTree) -> torch.Tensor:
            return logits[[tree.depths[n] for n in batch]]  # [B, Vd] children of depth d come from row d

        proposal = grow_tree(logits[0], expand, state, limits, runtime.ids, runtime.vocab)
        return self.finish(proposal)

    def _forward(self, masks: int) -> torch.Tensor:
        """One head forward over the pending pairs and ``masks`` mask rows -> draft logits [1 + masks, Vd]: the last
        pair's (depth 1), then each mask row's. The pairs stay in the cache, the mask rows do not."""
        committed = self.cache.length
        tokens = [t for _, chunk in self.pending for t in chunk]
        pairs = len(tokens)
        if pairs:
            fused = self.module.fuse(torch.cat([f for f, _ in self.pending]))  # [P, D]
            self.last_fused = fused[-1]
        mask_embeds, mask_features = self.module.mask_rows(masks, self.last_fused)  # [M, D] each
        embeds = torch.cat((self.runtime.embed[torch.tensor(tokens, dtype=torch.long)], mask_embeds))
        features = torch.cat((fused, mask_features)) if pairs else mask_features
        rows, skip = pairs + masks, max(pairs - 1, 0)  # (logits from the last pair on)
        if self.native is not None:
            _, logits = self.native(torch.cat((embeds, features), dim=-1), None, None, skip=skip)
        else:
            out, _ = self.module(embeds[None], features[None], torch.arange(committed, committed + rows)[None],
                                 causal_mask(committed, rows)[None], cache=self.cache)
            logits = self.runtime.draft_logits(out[0, skip:])  # [rows - skip, Vd]
        self.draft_forward_passes += 1
        self.cache.length = committed + pairs  # keep the pairs, drop the mask rows
        self.pending = []
        if pairs:
            self.last_logits, logits = logits[0], logits[1:]
        return torch.cat((self.last_logits[None], logits))
