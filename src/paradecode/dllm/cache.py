"""Key/value caches for ``TinyLM``: one buffer per layer, written at the positions a forward pass computes.

The autoregressive twin writes each new token's keys once and they stay exact. A masked diffusion model
attends bidirectionally, so a token committed later changes every other position's keys: caching them is an
approximation (Fast-dLLM). ``paradecode.dllm.decode`` refreshes the whole cache at the start of each block
(a full forward pass) and then recomputes, per step, either everything from the block on (``prefix``: the
prompt and earlier blocks are reused) or only the block itself (``dual``: the masked suffix is reused too).
Refreshing every step makes both equal to no cache; the benchmark measures what skipping refreshes costs.
"""

from __future__ import annotations

import torch

CACHE_MODES = ("none", "prefix", "dual")


class KVCache:
    def __init__(self, n_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layers  # each [B, H, size, dh]
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.size = 0  # positions 0 .. size-1 hold keys

    def positions(self, index: torch.Tensor) -> torch.Tensor:
        """The key positions a forward pass over ``index`` attends to: every position written so far."""
        self.size = max(self.size, int(index.max()) + 1)
        return torch.arange(self.size, device=index.device)[None]  # [1, size]

    def layer(self, layer: int, index: torch.Tensor):
        """A function (k, v) [B, H, S, dh] -> the layer's keys and values [B, H, size, dh], with k, v written."""

        def write(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            for store in (self.keys, self.values):
                old = store[layer]
                if old is None or old.shape[2] < self.size:
                    grown = k.new_zeros(k.shape[0], k.shape[1], self.size, k.shape[3])
                    if old is not None:
                        grown[:, :, : old.shape[2]] = old
                    store[layer] = grown
            self.keys[layer][:, :, index] = k
            self.values[layer][:, :, index] = v
            return self.keys[layer][:, :, : self.size], self.values[layer][:, :, : self.size]

        return write
