"""What a weight format costs in quality: perplexity on human-written text and top-1 agreement with fp32.

Both are teacher-forced: each text is fed once, and every position's logits are scored against the text's next
token (perplexity) and against the fp32 model's argmax at the same position (agreement). The texts are the
long human-written passages of Spec-Bench's summarization and RAG questions (shipped with the benchmark).
Calibration text for int8 (``data/calibration.txt``, written for this project) is a different text, so the
measurement is not scored on what the quantizer saw.

``paradecode quality`` runs this and stores the figures in the model cache, where ``paradecode models`` finds
them; ``data/quality.json`` holds the figures measured for the built-in models when they were released.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

import torch

QUALITY_BAR = 0.01  # a dtype may be a default only if its perplexity is within 1% of fp32's
EVAL_CATEGORIES = ("summarization", "rag")


@dataclass(frozen=True)
class Quality:
    dtype: str
    texts: int
    tokens: int  # scored positions
    perplexity: float
    reference_perplexity: float  # fp32 on the same tokens
    top1_agreement: float  # share of positions whose argmax equals fp32's

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.reference_perplexity - 1.0

    @property
    def passes(self) -> bool:
        return self.perplexity_change <= QUALITY_BAR

    def to_dict(self) -> dict:
        return {**asdict(self), "perplexity_change": self.perplexity_change, "passes_bar": self.passes}


def calibration_ids(tokenizer) -> list[list[int]]:
    """Token sequences of the shipped calibration text: each paragraph raw, and the first in the chat template."""
    text = resources.files("paradecode.data").joinpath("calibration.txt").read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    sequences = [list(tokenizer.encode(p)) for p in paragraphs]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": paragraphs[0]}],
                                            add_generation_prompt=True, tokenize=True)
        sequences.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return [s for s in sequences if len(s) > 1]


def evaluation_texts(questions: Sequence, count: int) -> list[str]:
    """The first ``count`` first turns of the summarization / RAG questions, alternating the two categories."""
    by_category = {c: [q.turns[0] for q in questions if q.category == c] for c in EVAL_CATEGORIES}
    texts = [t for pair in zip(*by_category.values()) for t in pair]
    return texts[:count]


@torch.inference_mode()
def teacher_forced(backend, ids: Sequence[int]) -> torch.Tensor:
    """[len(ids) - 1, V] logits predicting ids[1:], in one forward pass from an empty cache."""
    backend.reset()
    logits = backend.forward(torch.tensor(list(ids), dtype=torch.long)).logits[:-1]
    backend.reset()
    return logits


def measure(reference, candidates: dict[str, object], sequences: Sequence[Sequence[int]],
            progress=None) -> list[Quality]:
    """Score every candidate backend (name -> backend) against the fp32 ``reference`` on ``sequences``."""
    sequences = [list(s) for s in sequences if len(s) > 1]
    if not sequences:
        raise ValueError("quality needs at least one text of two or more tokens")
    totals = {name: [0.0, 0] for name in ["fp32", *candidates]}  # name -> [nll sum, argmax matches]
    tokens = 0
    for ids in sequences:
        targets = torch.tensor(ids[1:])[:, None]  # [L - 1, 1]
        ref = teacher_forced(reference, ids)
        ref_top = ref.argmax(-1)
        tokens += len(ids) - 1
        for name, backend in [("fp32", reference), *candidates.items()]:
            logits = ref if backend is reference else teacher_forced(backend, ids)
            totals[name][0] += -torch.log_softmax(logits, -1).gather(1, targets).sum().item()
            totals[name][1] += int((logits.argmax(-1) == ref_top).sum())
        if progress is not None:
            progress()
    ref_ppl = math.exp(totals["fp32"][0] / tokens)
    return [Quality(name, len(sequences), tokens, math.exp(nll / tokens), ref_ppl, matches / tokens)
            for name, (nll, matches) in totals.items()]


def record_path(cache_root: Path, model: str) -> Path:
    return cache_root / "quality" / f"{Path(model).name}.json"


def save(cache_root: Path, model: str, results: Sequence[Quality]) -> Path:
    """Write ``results`` to the model's record, keeping the dtypes measured before on the same texts (the same
    reference perplexity) that this run left out; an unreadable record is replaced."""
    path = record_path(cache_root, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    figures = {q.dtype: q.to_dict() for q in results}
    try:
        earlier = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        earlier = {}
    reference = results[0].reference_perplexity if results else None
    kept = {dtype: entry for dtype, entry in earlier.items() if isinstance(entry, dict)
            and entry.get("reference_perplexity") == reference and dtype not in figures}
    path.write_text(json.dumps({**kept, **figures}, indent=2))
    return path


def known(cache_root: Path, model: str) -> dict[str, dict]:
    """Quality figures for ``model``: measured on this machine (cache) over the shipped ones."""
    shipped = json.loads(resources.files("paradecode.data").joinpath("quality.json").read_text())
    figures = dict(shipped.get(model, {}))
    path = record_path(cache_root, model)
    if path.is_file():
        figures.update(json.loads(path.read_text()))
    return figures
