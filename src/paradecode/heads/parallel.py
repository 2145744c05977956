"""A parallel draft head: EAGLE-3's layer that fills k draft positions in one forward, from mask rows.

EAGLE-3 (``heads/eagle3.py``) drafts a chain of k tokens in k head forwards: each draft position reads the
head's output for the one before. Parallel drafters (PARD, DFlash) append
k - 1 *mask* rows after the last committed pair instead and draft every position in the same forward. This
head is EAGLE-3's (the same fused low/mid/high target features, the same layer, its own draft LM head) plus
mask rows:

* ``mask_embed`` [M, D]: the token embedding of mask row m (m = 1..M, one row per depth, so the layer's MLP
  knows which depth it scores). A mask row's feature (where its residual stream starts) is the fused target
  feature of the last committed pair, the context Medusa's heads read, and its attention reads the rest.
* With pairs 0..n-1 committed (pair j = (g_j, t_{j+1}) at RoPE position j, as EAGLE-3), pair n-1's output
  scores t_{n+1} (depth 1, as EAGLE-3) and mask row m (m = 1..k-1) at position n - 1 + m scores t_{n+1+m}
  (depth m + 1). Mask rows attend causally: to every committed pair and to the mask rows before them.

So one forward of (the pairs the last verification produced + k - 1 mask rows) drafts k tokens, whose
per-depth distributions do not depend on the tokens drafted before them (Medusa's property, with the target's
context behind it): a chain takes each depth's top token; a tree ranks paths by the product of their
marginals (``drafters/head_tree``), cut by the calibrated acceptance under the measured verify cost.

Training is EAGLE-3's unrolled training-time test (``training.losses.eagle_passes``) with pass k >= 2 fed the
mask rows instead of the head's own outputs: pass k at position i is then exactly mask row k - 1 after the
pairs 0..i-k+1, and the labels, masks and acceptance bookkeeping are the ones EAGLE-3 uses.
"""

from __future__ import annotations

import torch
from torch import nn

from paradecode.heads.eagle import HeadShape
from paradecode.heads.eagle3 import Eagle3Head


MAX_MASKS = 15  # mask rows the head has embeddings for: drafts at most 16 deep


class ParallelHead(Eagle3Head):
    kind = "parallel"
    parallel = True  # passes k >= 2 read the mask rows (``mask_rows``), not the previous pass's output

    def __init__(self, shape: HeadShape, aux_layers: tuple[int, ...], draft_vocab: int) -> None:
        super().__init__(shape, aux_layers, draft_vocab)
        generator = torch.Generator().manual_seed(0)
        self.mask_embed = nn.Parameter(torch.randn(MAX_MASKS, shape.hidden_size, generator=generator))  # RMS-normed

    def mask_rows(self, masks: int, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token embeddings and features of mask rows 1..``masks`` after a pair whose fused feature is ``last``
        [*lead, D]: each [*lead, masks, D]."""
        if not 0 <= masks <= MAX_MASKS:
            raise ValueError(f"a parallel head drafts at most {MAX_MASKS + 1} positions, asked for {masks + 1}")
        lead = last.shape[:-1]
        embeds = self.mask_embed[:masks].expand(*lead, masks, self.shape.hidden_size)
        return embeds, last.unsqueeze(-2).expand(*lead, masks, self.shape.hidden_size)
