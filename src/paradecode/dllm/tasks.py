"""Synthetic task suites for the shipped diffusion models, modelled on ParallelBench, plus their vocabulary.

``waiting-line``: list tasks over digits (copy, reverse, sort, shuffle, insert / remove / replace at an index),
lists of 4-10 items. ``latin``: complete a 4x4 Latin square from a few given cells, a task whose positions
depend strongly on each other (two cells of a row must differ), so committing many at once should fail.

Every example is a (prompt, answer) pair of space-separated words; ``Task.check`` accepts any valid answer
(shuffle: any permutation of the input; latin: any Latin square that keeps the given cells), so sampling
orders that pick a different valid answer are not penalised. The held-out set is drawn from its own seed and
training skips every prompt in it.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from paradecode.errors import ParadecodeError

PAD, MASK, EOT = "<pad>", "<mask>", "<eot>"
WORDS = ["copy", "reverse", "sort", "shuffle", "insert", "remove", "replace", "latin", ":", "@", "|", "."]
VOCAB = [PAD, MASK, EOT] + WORDS + [str(d) for d in range(10)]
HELDOUT_SEED = 20_250_101
_TOKEN = re.compile(r"<[a-z]+>|[a-z]+|\d|[^\s\w]")


@dataclass(frozen=True)
class Vocab:
    """Word-level vocabulary: one id per word, digit or symbol; ``decode`` stops at the first end-of-text."""

    words: tuple[str, ...] = tuple(VOCAB)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ids", {w: i for i, w in enumerate(self.words)})

    @property
    def pad_id(self) -> int:
        return self._ids[PAD]

    @property
    def mask_id(self) -> int:
        return self._ids[MASK]

    @property
    def eot_id(self) -> int:
        return self._ids[EOT]

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        pieces = _TOKEN.findall(text)
        unknown = sorted({p for p in pieces if p not in self._ids})
        if unknown:
            raise ParadecodeError(f"the prompt has words this model does not know: {', '.join(unknown)}; "
                                  f"it knows: {' '.join(w for w in self.words if not w.startswith('<'))}.")
        return [self._ids[p] for p in pieces]

    def decode(self, ids: list[int]) -> str:
        words = []
        for i in ids:
            if i == self.eot_id:
                break
            words.append(self.words[i])
        return " ".join(words)


@dataclass(frozen=True)
class Task:
    name: str
    make: Callable[[random.Random], tuple[str, str]]  # rng -> (prompt, answer)
    check: Callable[[str, str], bool]  # (prompt, produced answer) -> correct?


def _digits(rng: random.Random) -> list[str]:
    return [str(rng.randrange(10)) for _ in range(rng.randint(4, 10))]


def _list_task(name: str, answer: Callable[[list[str]], list[str]]) -> Task:
    def make(rng: random.Random) -> tuple[str, str]:
        items = _digits(rng)
        return f"{name} : {' '.join(items)}", " ".join(answer(items))

    return Task(name, make, lambda prompt, out: out == " ".join(answer(_items(prompt))))


def _items(prompt: str) -> list[str]:
    return prompt.split(":", 1)[1].split()


def _indexed_task(name: str, with_value: bool, edit: Callable[[list[str], int, str], list[str]]) -> Task:
    def make(rng: random.Random) -> tuple[str, str]:
        items = _digits(rng)
        index = rng.randrange(len(items) + (name == "insert"))
        value = str(rng.randrange(10))
        head = f"{name} {value} @ {index}" if with_value else f"{name} @ {index}"
        return f"{head} : {' '.join(items)}", " ".join(edit(items, index, value))

    def check(prompt: str, out: str) -> bool:
        head = prompt.split(":", 1)[0].split()
        value, index = (head[1], int(head[3])) if with_value else ("", int(head[2]))
        return out == " ".join(edit(_items(prompt), index, value))

    return Task(name, make, check)


def _make_shuffle(rng: random.Random) -> tuple[str, str]:
    items = _digits(rng)
    answer = items[:]
    rng.shuffle(answer)
    return f"shuffle : {' '.join(items)}", " ".join(answer)


@lru_cache(maxsize=1)
def latin_squares() -> tuple[tuple[int, ...], ...]:
    """All 576 4x4 Latin squares over 1..4, row-major."""
    rows = list(itertools.permutations(range(1, 5)))
    squares = []
    for grid in itertools.product(rows, repeat=4):
        if all(len({row[c] for row in grid}) == 4 for c in range(4)):
            squares.append(tuple(v for row in grid for v in row))
    return tuple(squares)


def _make_latin(rng: random.Random) -> tuple[str, str]:
    square = rng.choice(latin_squares())
    given = set(rng.sample(range(16), rng.randint(4, 10)))
    cells = [str(v) if i in given else "." for i, v in enumerate(square)]
    rows = [" ".join(cells[r * 4:(r + 1) * 4]) for r in range(4)]
    return "latin : " + " | ".join(rows), " ".join(map(str, square))


def _check_latin(prompt: str, out: str) -> bool:
    cells = [c for c in _items(prompt) if c != "|"]
    values = out.split()
    if len(values) != 16 or any(v not in "1234" for v in values):
        return False
    if any(c != "." and c != v for c, v in zip(cells, values)):
        return False
    grid = [values[r * 4:(r + 1) * 4] for r in range(4)]
    return all(len(set(row)) == 4 for row in grid) and all(len({row[c] for row in grid}) == 4 for c in range(4))


TASKS: dict[str, Task] = {t.name: t for t in [
    _list_task("copy", lambda xs: xs),
    _list_task("reverse", lambda xs: xs[::-1]),
    _list_task("sort", sorted),
    Task("shuffle", _make_shuffle, lambda prompt, out: sorted(out.split()) == sorted(_items(prompt))),
    _indexed_task("insert", True, lambda xs, i, v: xs[:i] + [v] + xs[i:]),
    _indexed_task("remove", False, lambda xs, i, v: xs[:i] + xs[i + 1:]),
    _indexed_task("replace", True, lambda xs, i, v: xs[:i] + [v] + xs[i + 1:]),
    Task("latin", _make_latin, _check_latin),
]}
SUITES: dict[str, tuple[str, ...]] = {
    "waiting-line": ("copy", "reverse", "sort", "shuffle", "insert", "remove", "replace"),
    "latin": ("latin",),
}


def suite_tasks(suite: str) -> tuple[str, ...]:
    if suite not in SUITES:
        raise ParadecodeError(f"unknown task suite {suite!r}; choose one of: {', '.join(SUITES)}.")
    return SUITES[suite]


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ParadecodeError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}.")
    return TASKS[name]


def task_of(prompt: str) -> Task:
    """The task a prompt asks for (its first word)."""
    first = prompt.split()[0] if prompt.split() else ""
    return get_task(first.rstrip(":"))


def heldout(suite: str, per_task: int) -> list[tuple[str, str, str]]:
    """(task, prompt, answer) triples, the same on every call; training never sees these prompts."""
    rng = random.Random(HELDOUT_SEED)
    examples, seen = [], set()
    for name in suite_tasks(suite):
        made = 0
        while made < per_task:
            prompt, answer = TASKS[name].make(rng)
            if prompt not in seen:
                seen.add(prompt)
                examples.append((name, prompt, answer))
                made += 1
    return examples


def training_batch(suite: str, seed: int, step: int, size: int, exclude: set[str]) -> list[tuple[str, str]]:
    """The (prompt, answer) pairs of one training step: fixed by (seed, step), so a resumed or extended run
    sees exactly the batches an uninterrupted one would; tasks drawn uniformly, held-out prompts skipped."""
    rng = random.Random(seed * 1_000_003 + step)
    names = suite_tasks(suite)
    batch = []
    while len(batch) < size:
        prompt, answer = TASKS[rng.choice(names)].make(rng)
        if prompt not in exclude:
            batch.append((prompt, answer))
    return batch
