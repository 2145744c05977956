"""The target's features along stored answers, computed when a training batch needs them.

Data shards may hold token ids only (``DistillConfig.hidden=False``): decoding the answers is the expensive,
kept part; a feature pass over prompt + answer is one prefill-sized forward, cheaper than storing 20,000
answers' features (~6 GB for the last hidden state alone, three times that for EAGLE-3's three layers). Every row of the native
forward is computed on its own, so a row's features are the ones decoding computed along it, to the bit.

    features = TargetFeatures(model_dir)
    features(rows, aux_layers=(2, 15, 27))   # [T, 3D] per row: the inputs of those layers (EAGLE-3)
    features(rows, aux_layers=())             # [T, D] per row: the last hidden state (EAGLE-1, Medusa)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch


class TargetFeatures:
    """Loads the target (int8, our native forward: the teacher's own model) on first use."""

    def __init__(self, model_dir: Path | str, cache_dir: str | None = None, model=None) -> None:
        self.model_dir, self.cache_dir, self.model = model_dir, cache_dir, model

    @torch.inference_mode()
    def __call__(self, rows: Sequence[dict], aux_layers: Sequence[int] = ()) -> list[torch.Tensor]:
        if self.model is None:
            from paradecode.api import load

            self.model = load(str(self.model_dir), backend="llama", dtype="int8", cache_dir=self.cache_dir)
        from paradecode.engine import Features

        backend, wanted = self.model.backend, Features(True, tuple(aux_layers))  # what a head drafting reads
        out = []
        for row in rows:
            backend.reset()
            out.append(wanted.read(backend.forward(row["tokens"].long(), logits=False, **wanted.arguments)).clone())
        backend.reset()
        return out
