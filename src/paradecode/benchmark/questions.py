"""Spec-Bench-format questions: one JSON object per line with ``question_id``, ``category`` and ``turns``.

``load_questions`` checks every line and names the first bad one; ``select`` keeps the first N questions of
each category in file order, so a run with ``--per-category 1`` covers every category in a few minutes.
The Spec-Bench question set ships inside the package (``data/specbench``, Apache-2.0, licence beside it) and
is the default, so the benchmark runs from any working directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from paradecode import utf8
from paradecode.errors import ParadecodeError

DEFAULT_QUESTIONS = Path(__file__).parent / "data" / "specbench" / "question.jsonl"  # shipped package data


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]


def default_questions_path() -> Path | None:
    """The Spec-Bench question set shipped with the package (None only in a broken install)."""
    return DEFAULT_QUESTIONS if DEFAULT_QUESTIONS.is_file() else None


def load_questions(path: str | Path) -> list[Question]:
    path = Path(path)
    if not path.is_file():
        problem = "is not a file" if path.exists() else "does not exist"
        raise ParadecodeError(
            f"questions file {path} {problem}. Pass a Spec-Bench-format .jsonl file with --questions "
            "(one JSON object per line with question_id, category and turns)."
        )
    questions: list[Question] = []
    seen: set = set()
    for number, line in enumerate(utf8.json_lines(utf8.read(path, f"questions file {path}")), start=1):
        if not line.strip():
            continue
        questions.append(_parse_line(line, number, path))
        qid = questions[-1].question_id
        if qid in seen:
            raise ParadecodeError(f"{path}, line {number}: question_id {qid!r} appears twice; ids must be unique.")
        seen.add(qid)
    if not questions:
        raise ParadecodeError(f"questions file {path} holds no questions.")
    return questions


def _parse_line(line: str, number: int, path: Path) -> Question:
    where = f"{path}, line {number}"
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise ParadecodeError(f"{where} is not valid JSON ({error.msg} at column {error.colno}).") from None
    if not isinstance(data, dict):
        raise ParadecodeError(f"{where} is not a JSON object; each line must be one question object.")
    missing = [key for key in ("question_id", "category", "turns") if key not in data]
    if missing:
        raise ParadecodeError(f"{where} lacks {', '.join(missing)}; Spec-Bench questions need "
                              "question_id, category and turns.")
    qid, category, turns = data["question_id"], data["category"], data["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise ParadecodeError(f"{where}: question_id must be an integer or a string, got {qid!r}.")
    if not isinstance(category, str) or not category:
        raise ParadecodeError(f"{where}: category must be a non-empty string, got {category!r}.")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise ParadecodeError(f"{where}: turns must be a non-empty list of non-empty strings.")
    return Question(qid, category, tuple(turns))


def select(
    questions: list[Question],
    per_category: int | None,
    categories: list[str] | None = None,
) -> list[Question]:
    """The first ``per_category`` questions of each category (all when None), keeping file order."""
    if per_category is not None and (isinstance(per_category, bool) or per_category < 1):
        raise ParadecodeError(f"--per-category must be a positive integer or 'all', got {per_category!r}.")
    if categories:
        known = sorted({q.category for q in questions})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ParadecodeError(f"no questions in category {', '.join(unknown)}; the file has: {', '.join(known)}.")
    counts: dict[str, int] = {}
    chosen = []
    for question in questions:
        if categories and question.category not in categories:
            continue
        if per_category is not None and counts.get(question.category, 0) >= per_category:
            continue
        counts[question.category] = counts.get(question.category, 0) + 1
        chosen.append(question)
    return chosen


def round_robin(questions: list[Question]) -> list[Question]:
    """The run order: the first question of every category, then the second of every category, and so on
    (file order within a round), so a partial or interrupted run has covered every category evenly."""
    seen: dict[str, int] = {}
    ranked = []
    for index, question in enumerate(questions):
        rank = seen.get(question.category, 0)
        seen[question.category] = rank + 1
        ranked.append((rank, index, question))
    return [question for _, _, question in sorted(ranked, key=lambda item: item[:2])]


def parse_per_category(raw: str) -> int | None:
    """``--per-category``: a positive integer, or ``all``."""
    if raw.strip().lower() == "all":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ParadecodeError(f"--per-category must be a positive integer or 'all', got {raw!r}.")
    return value
