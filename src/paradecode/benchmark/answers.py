"""Spec-Bench answer files: ``model_answer/<method>.jsonl``, one line per question, as Spec-Bench's
``evaluation/eval.py`` writes them, so its ``speed.py`` can read paradecode's runs next to its own.

Each line: question_id, category, answer_id, model_id, tstamp and ``choices=[{index: 0, turns,
decoding_steps, new_tokens, wall_time, accept_lengths}]`` (per-turn lists; accept_lengths per step, all
turns together). A count a peer cannot observe is written as null (decoding_steps) or [] (accept_lengths).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from paradecode.benchmark.metrics import ok_records


def answer_line(record: dict, model_id: str) -> dict:
    turns = record["turns"]
    accept = [t.get("accepted_per_step") for t in turns]
    return dict(
        question_id=record["question_id"],
        category=record["category"],
        answer_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{model_id}/{record['question_id']}/{record.get('tstamp')}").hex,
        model_id=model_id,
        choices=[dict(
            index=0,
            turns=[t["text"] for t in turns],
            decoding_steps=[t.get("forward_passes") for t in turns],
            new_tokens=[t["new_tokens"] for t in turns],
            wall_time=[t["wall_time_s"] for t in turns],
            accept_lengths=[n for steps in accept for n in steps] if None not in accept else [],
        )],
        tstamp=record.get("tstamp"),
    )


def write_answers(records: list[dict], out_dir: Path, model_name: str) -> list[Path]:
    """Write one answer file per method, questions in id order; returns the paths written."""
    folder = Path(out_dir) / "model_answer"
    folder.mkdir(parents=True, exist_ok=True)
    by_method: dict[str, list[dict]] = {}
    for record in ok_records(records):
        by_method.setdefault(record["method"], []).append(record)
    paths = []
    for method, rows in by_method.items():
        path = folder / f"{method}.jsonl"
        model_id = f"{model_name}-{method}"
        rows = sorted(rows, key=lambda r: (str(type(r["question_id"])), r["question_id"]))
        path.write_text("".join(json.dumps(answer_line(r, model_id)) + "\n" for r in rows), encoding="utf-8")
        paths.append(path)
    return paths
