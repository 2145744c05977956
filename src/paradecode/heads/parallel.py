"""A parallel draft head: EAGLE-3's layer that fills k draft positions in one forward, from mask rows.

EAGLE-3 (``heads/eagle3.py``) drafts a chain of k tokens in k head forwards: each draft position reads the
head's output for the one before. Parallel drafters (PARD, DFlash: Lin et al. 2025, Chen et al. 2026) append
k - 1 *mask* rows after the last committed pair instead and draft every position in the same forward. This
head is EAGLE-3's (the same fused low/mid/high target features, the same layer, its own draft LM head) plus
two learned vectors:

* ``mask_embed`` [D] stands in for the token embedding of a mask row, ``mask_feature`` [D] for its feature.
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


class ParallelHead(Eagle3Head):
    kind = "parallel"
    parallel = True  # passes k >= 2 read the mask rows (``mask_rows``), not the previous pass's output

    def __init__(self, shape: HeadShape, aux_layers: tuple[int, ...], draft_vocab: int) -> None:
        super().__init__(shape, aux_layers, draft_vocab)
        d = shape.hidden_size
        generator = torch.Generator().manual_seed(0)
        self.mask_embed = nn.Parameter(torch.randn(d, generator=generator))  # RMS-normed before use
        self.mask_feature = nn.Parameter(0.02 * torch.randn(d, generator=generator))

    def mask_rows(self, *lead: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token embeddings and features of mask rows, each [*lead, D]."""
        d = self.shape.hidden_size
        return self.mask_embed.expand(*lead, d), self.mask_feature.expand(*lead, d)
