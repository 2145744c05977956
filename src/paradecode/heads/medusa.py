"""Medusa heads (Cai et al. 2024): K small residual blocks on the target's last hidden state.

The target's hidden state f_i at position i predicts t_{i+1} through its own LM head. Medusa head k
(k = 1..K) reads the same f_i and predicts t_{i+1+k}: ``logits_k = lm_head(f_i + SiLU(W_k f_i + b_k))``,
the target's LM head shared and frozen (Medusa-1 with one block per head; a separate LM head per head
would be 28M parameters each on SmolLM2). All K distributions come from one hidden state, so a step's whole
tree is drafted without running anything sequentially.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paradecode.heads.eagle import HeadShape


class MedusaHeads(nn.Module):
    kind = "medusa"

    def __init__(self, shape: HeadShape, num_heads: int = 4) -> None:
        super().__init__()
        self.shape = shape
        self.blocks = nn.ModuleList(nn.Linear(shape.hidden_size, shape.hidden_size) for _ in range(num_heads))
        for block in self.blocks:  # start as the identity: every head first guesses the next token
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] -> each head's feature [K, ..., D] (feed to the LM head)."""
        rows = hidden.reshape(-1, hidden.shape[-1])  # [N, D]: quantized linears take 2-D inputs only
        return torch.stack([rows + F.silu(block(rows)) for block in self.blocks]).view(-1, *hidden.shape)
