"""``train-draft`` as one library call: answer each prompt set with the target (self-distillation data, resumable
shards), then train a head on every answer.

    train_draft_head("smollm2-135m", model_dir, [("builtin", prompts)], out, data, distill, train)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from paradecode.heads.store import target_weights
from paradecode.training.features import TargetFeatures
from paradecode.training.selfdistill import DistillConfig, generate_dataset, load_shards, saved_shards
from paradecode.training.trainer import TrainConfig, train_head


def train_draft_head(model: str, model_dir: Path, prompt_sets: list[tuple[str, list[str]]], out: Path, data: Path,
                     distill: DistillConfig, train: TrainConfig, *, workers: int = 1, cache_dir: str | None = None,
                     log: Callable[[str], None] = print, progress: bool = True, info: dict | None = None,
                     data_only: bool = False, train_only: bool = False, keep_features: bool = False) -> dict | None:
    """Answer each (source, prompts) set into ``data`` (one subfolder per source when there are several, so a
    source can grow without touching the others), then train the head into ``out``; returns what
    ``train_head`` saved (its config, with the training history). ``info`` goes into the saved config.
    ``data_only``: stop after the data; ``train_only``: answer nothing, train on the shards saved so far (of a
    data run still going, or stopped). ``keep_features``: the target's features computed for training are kept
    under ``data``/features/<the target's folder name> and read back by later epochs and runs
    (``TargetFeatures``)."""
    started = time.perf_counter()
    shards = []
    for source, prompts in prompt_sets:
        folder = data if len(prompt_sets) == 1 else data / Path(source).stem
        if train_only:
            shards += saved_shards(folder)
            continue
        shards += generate_dataset(model_dir, prompts, folder, distill, log=log, workers=workers,
                                   cache_dir=cache_dir)
    data_seconds = time.perf_counter() - started
    if data_only:
        log(f"data: {len(shards)} shards ready (this run spent {data_seconds:.0f} s on them)")
        return None
    rows = load_shards(shards)
    answer_tokens = sum(len(r["tokens"]) - r["prompt_len"] for r in rows)
    log(f"data: {len(rows)} answers, {answer_tokens} answer tokens (this run spent {data_seconds:.0f} s on it)")
    info = dict(info or {}, answers=len(rows), answer_tokens=answer_tokens)
    store = data / "features" / Path(model_dir).name if keep_features else None  # (features are the target's own)
    _, saved = train_head(rows, target_weights(str(model_dir)), model, out, train, log=log, progress=progress,
                          training_info=info, features=TargetFeatures(model_dir, cache_dir, store=store))
    return saved
