"""The target's features along stored answers, computed when a training batch needs them.

Data shards may hold token ids only (``DistillConfig.hidden=False``): decoding the answers is the expensive,
kept part; a feature pass over prompt + answer is one prefill-sized forward, cheaper than storing 20,000
answers' features (~6 GB for the last hidden state alone, three times that for EAGLE-3's three layers). Every row of the native
forward is computed on its own, so a row's features are the ones decoding computed along it, to the bit.

    features = TargetFeatures(model_dir)
    features(rows, aux_layers=(2, 15, 27))   # [T, 3D] per row: the inputs of those layers (EAGLE-3)
    features(rows, aux_layers=())             # [T, D] per row: the last hidden state (EAGLE-1, Medusa)

That forward is half of a training step on a 2-core CPU. With a ``store`` folder (``train-draft
--keep-features``), each row's features are written there once (half floats, one file per row and layer set,
named by a hash of its tokens) and read back by later epochs and later runs on the same data, including runs
side by side.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

import torch


class TargetFeatures:
    """Loads the target (int8, our native forward: the teacher's own model) on first use."""

    def __init__(self, model_dir: Path | str, cache_dir: str | None = None, model=None,
                 store: Path | None = None) -> None:
        self.model_dir, self.cache_dir, self.model, self.store = model_dir, cache_dir, model, store

    @torch.inference_mode()
    def __call__(self, rows: Sequence[dict], aux_layers: Sequence[int] = ()) -> list[torch.Tensor]:
        out = []
        for row in rows:
            path = self._path(row, aux_layers)
            if path is not None and path.is_file():
                out.append(torch.load(path).float())
                continue
            features = self._compute(row, aux_layers)
            if path is not None:  # (as read back later: half floats, so every epoch sees the same features)
                features = features.half()
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(f".{os.getpid()}.tmp")  # (runs side by side each write their own)
                torch.save(features, partial)
                partial.replace(path)
            out.append(features.float())
        return out

    def _path(self, row: dict, aux_layers: Sequence[int]) -> Path | None:
        if self.store is None:
            return None
        key = hashlib.sha1(row["tokens"].to(torch.int64).numpy().tobytes()).hexdigest()
        layers = "aux-" + "-".join(map(str, aux_layers)) if aux_layers else "last"
        return Path(self.store) / layers / key[:2] / f"{key}.pt"

    def _compute(self, row: dict, aux_layers: Sequence[int]) -> torch.Tensor:
        if self.model is None:
            from paradecode.api import load

            self.model = load(str(self.model_dir), backend="llama", dtype="int8", cache_dir=self.cache_dir)
        from paradecode.engine import Features

        backend, wanted = self.model.backend, Features(True, tuple(aux_layers))  # what a head drafting reads
        backend.reset()
        features = wanted.read(backend.forward(row["tokens"].long(), logits=False, **wanted.arguments)).clone()
        backend.reset()
        return features
