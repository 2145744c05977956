"""Figures from benchmark records: pure functions on plain dicts, so they are tested on hand-built records.

A *record* is one (method, question) run: ``{"method", "question_id", "category", "turns": [turn, ...],
"error"}``; each turn holds ``token_ids``, ``new_tokens``, ``wall_time_s``, ``forward_passes`` and the
per-step lists ``draft_lengths``, ``accepted_lengths`` and ``accepted_per_step`` (any may be None: unknown).

- tokens/s of a question = its tokens over its wall time (turns summed); a method's tokens/s is the mean
  over questions, as in Spec-Bench; *speedup* over a baseline is the ratio of those means, taken on the
  questions both ran; *wall ratio* is the baseline's total wall time over the method's, on the same questions;
- mean accepted (tau) = tokens / target forward passes (the bonus token counted), pooled over questions;
- acceptance at draft position i = among steps that drafted at least i+1 tokens (tree: depth >= i+1), the
  share whose accepted length is at least i+1.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

OVERALL = "overall"


def ok_records(records: Iterable[dict]) -> list[dict]:
    return [r for r in records if not r.get("error")]


def question_totals(record: dict) -> dict:
    """One question's figures, its turns summed; a figure unknown for any turn is None."""
    turns = record["turns"]
    tokens = sum(t["new_tokens"] for t in turns)
    wall = sum(t["wall_time_s"] for t in turns)
    forwards = [t.get("forward_passes") for t in turns]
    return dict(
        tokens=tokens,
        wall_time_s=wall,
        tokens_per_s=tokens / wall if wall > 0 else 0.0,
        forward_passes=None if None in forwards else sum(forwards),
    )


def acceptance_by_position(draft_lengths: Sequence[int], accepted_lengths: Sequence[int]) -> list[float]:
    """Rate at draft position i (0-based): P(accepted >= i+1 | drafted >= i+1), over the given steps."""
    deepest = max(draft_lengths, default=0)
    rates = []
    for i in range(deepest):
        drafted = [a for d, a in zip(draft_lengths, accepted_lengths) if d >= i + 1]
        rates.append(sum(a >= i + 1 for a in drafted) / len(drafted))
    return rates


def method_figures(records: list[dict]) -> dict:
    """Figures of one method over some questions (all records share the method)."""
    totals = [question_totals(r) for r in records]
    tokens = sum(t["tokens"] for t in totals)
    wall = sum(t["wall_time_s"] for t in totals)
    forwards = [t["forward_passes"] for t in totals]
    forward_total = None if None in forwards else sum(forwards)
    turns = [t for r in records for t in r["turns"]]
    drafts = [t.get("draft_lengths") for t in turns]
    accepts = [t.get("accepted_lengths") for t in turns]
    per_step = [t.get("accepted_per_step") for t in turns]
    known_steps = None not in drafts and None not in accepts
    return dict(
        questions=len(records),
        new_tokens=tokens,
        wall_time_s=wall,
        tokens_per_s=sum(t["tokens_per_s"] for t in totals) / len(totals) if totals else 0.0,
        forward_passes=forward_total,
        mean_accepted=tokens / forward_total if forward_total else None,
        forwards_per_token=forward_total / tokens if forward_total is not None and tokens else None,
        acceptance_by_position=acceptance_by_position([d for ds in drafts for d in ds],
                                                      [a for acc in accepts for a in acc]) if known_steps else None,
        accepted_per_step=[n for ns in per_step for n in ns] if None not in per_step else None,
    )


def speedup(records: list[dict], baseline: list[dict]) -> dict:
    """Speedup of ``records`` over ``baseline`` (same method each) on the questions both ran."""
    base_by_id = {r["question_id"]: r for r in baseline}
    shared = [r for r in records if r["question_id"] in base_by_id]
    if not shared:
        return dict(speedup=None, wall_ratio=None)
    mine = method_figures(shared)
    base = method_figures([base_by_id[r["question_id"]] for r in shared])
    return dict(
        speedup=mine["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None,
        wall_ratio=base["wall_time_s"] / mine["wall_time_s"] if mine["wall_time_s"] else None,
    )


def summarize(records: Iterable[dict], baselines: Sequence[str] = ("ar", "hf")) -> dict:
    """``{group: {method: figures}}`` for ``overall`` and each category, with speedups over each baseline."""
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for record in ok_records(records):
        groups[OVERALL][record["method"]].append(record)
        groups[record["category"]][record["method"]].append(record)
    summary: dict[str, dict[str, dict]] = {}
    for group in [OVERALL] + sorted(g for g in groups if g != OVERALL):
        summary[group] = {}
        for method, rows in groups[group].items():
            figures = method_figures(rows)
            for base in baselines:
                ratio = speedup(rows, groups[group][base]) if base in groups[group] else {}
                figures[f"speedup_vs_{base}"] = ratio.get("speedup")
                figures[f"wall_ratio_vs_{base}"] = ratio.get("wall_ratio")
            summary[group][method] = figures
    return summary


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where two outputs differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def lossless_check(records: Iterable[dict], reference: str = "ar") -> dict:
    """Per method: how many questions reproduce ``reference``'s greedy token ids exactly, and where the
    others first differ (turn index, token position)."""
    records = ok_records(records)
    ref = {r["question_id"]: r for r in records if r["method"] == reference}
    result: dict[str, dict] = {}
    for record in records:
        if record["method"] == reference or record["question_id"] not in ref:
            continue
        entry = result.setdefault(record["method"], dict(identical=0, compared=0, share=None, differences=[]))
        entry["compared"] += 1
        pairs = zip(record["turns"], ref[record["question_id"]]["turns"])
        for turn, (mine, theirs) in enumerate(pairs):
            position = first_difference(mine["token_ids"], theirs["token_ids"])
            if position is not None:
                entry["differences"].append(dict(question_id=record["question_id"], category=record["category"],
                                                 turn=turn, position=position))
                break
        else:
            entry["identical"] += 1
    for entry in result.values():
        entry["share"] = entry["identical"] / entry["compared"]
    return result
