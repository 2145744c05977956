"""Prompts written by the target model itself: a numbered list of requests, continued by sampling.

Self-distillation needs prompts that look like what users ask; templates (``prompts.py``, ``task_prompts.py``)
give shapes but few words. Here the target writes them: each call shows it three seed requests (written for
this repository, no benchmark text) as items 1-3 of "requests people sent to a helpful assistant" and samples
the rest of the list (raw text, no chat template). Its numbered lines are kept when they read like a request
(4-60 words, mostly letters, ending in ``?``, ``.``, ``!`` or ``:``; the first ``PER_CALL`` of a call, as
later ones repeat the pattern of the earlier), are new, and share no run of
``OVERLAP`` words with the benchmark's questions. The issue allows a prompt set the model generates itself;
these prompts are under paradecode's licence (Apache-2.0), like the seeds.

    paradecode make-prompts --count 1500 --out runs/self-prompts.jsonl
    paradecode train-draft --kind eagle --prompts builtin,builtin-tasks,runs/self-prompts.jsonl ...

The file is written as prompts come (one ``{"prompt": ..., "call": i}`` per line); run the command again to
resume after an interruption or to extend it to a larger ``--count``.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Callable

from paradecode import utf8
from paradecode.errors import ParadecodeError

SEEDS = [
    "Can you write a short poem about autumn leaves?",
    "How do I fix a leaking kitchen tap?",
    "Explain the difference between weather and climate.",
    "Write a cover letter for a junior accountant position.",
    "What should I pack for a week of hiking in the mountains?",
    "Describe how a bill becomes a law in a parliament.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Pretend you are a ship's captain and describe a storm at sea.",
    "Why do cats purr?",
    "Give me a weekly meal plan for a vegetarian family.",
    "Summarize the main causes of the First World War.",
    "How can I improve my handwriting?",
    "Write a product description for a bamboo toothbrush.",
    "What is the derivative of x squared times sine of x?",
    "Compare renting and buying a house for a young couple.",
    "Draft a polite email asking my landlord to repair the heating.",
    "Tell me a bedtime story about a brave little turtle.",
    "What were the achievements of the Maya civilization?",
    "How does a refrigerator keep food cold?",
    "Write a SQL query that lists customers who ordered nothing last year.",
    "If a train leaves at 3 pm and travels 240 km at 80 km/h, when does it arrive?",
    "What are good questions to ask at the end of a job interview?",
    "Write a speech for my sister's wedding.",
    "Explain what a neural network is in simple words.",
    "Translate 'Where is the nearest pharmacy?' into Spanish.",
    "Plan a three-day trip to Lisbon on a small budget.",
    "Act as a museum guide and introduce a painting of sunflowers.",
    "What is the role of mitochondria in a cell?",
    "Write a haiku about the first snow of winter.",
    "How do vaccines train the immune system?",
    "Create a workout routine for someone who sits all day.",
    "Which philosophers wrote about happiness, and what did they say?",
    "Write a Python class for a simple bank account with deposits and withdrawals.",
    "Give me five ideas for a science fair project.",
    "Explain the rules of cricket to an American.",
    "What is the difference between a virus and a bacterium?",
    "Write a short dialogue between a customer and a barista.",
    "How should I prepare for my first marathon?",
    "Describe the water cycle for a school report.",
    "Write a limerick about a forgetful wizard.",
]
HEADER = "Here are some requests that people sent to a helpful assistant:\n"
OVERLAP = 8  # words in a run shared with a benchmark question that disqualify a prompt
PER_CALL = 3  # requests kept from one continuation (later items tend to repeat the earlier ones' pattern)
ITEM = re.compile(r"^\s*(\d+)\.\s*(.+?)\s*$")


def make_prompts(model, count: int, out: Path, seed: int = 0, temperature: float = 0.8, top_p: float = 0.95,
                 log: Callable[[str], None] = print, log_every: int = 100) -> list[str]:
    """Have ``model`` (a loaded ``paradecode.Model``) write ``count`` prompts into ``out`` (.jsonl, resumed)."""
    banned = _benchmark_runs()
    kept, seen, call = [], set(), 0
    if out.exists():
        for number, line in enumerate(utf8.json_lines(utf8.read(out)), 1):
            try:
                row = json.loads(line)
                prompt, row_call = row["prompt"], int(row["call"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise ParadecodeError(f"{out} line {number} is not a make-prompts line ({{\"prompt\", \"call\"}}); "
                                      "pass another --out to start a new file.") from None
            kept.append(prompt)
            seen.add(_key(prompt))
            call = max(call, row_call + 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    started, calls, resumed = time.perf_counter(), 0, len(kept)
    with out.open("a", encoding="utf-8") as sink:
        while len(kept) < count:
            draws = random.Random(seed * 1_000_003 + call)
            shown = draws.sample(SEEDS, 3)
            text = HEADER + "".join(f"{i}. {request}\n" for i, request in enumerate(shown, 1)) + "4."
            result = model.generate(text, chat=False, max_new_tokens=160, temperature=temperature, top_p=top_p,
                                    seed=seed * 1_000_003 + call)
            for prompt in parse_items("4." + result.text)[:PER_CALL]:
                if len(kept) >= count or _key(prompt) in seen or not _reads_like_a_request(prompt):
                    continue
                if banned & _runs(prompt):
                    continue
                seen.add(_key(prompt))
                kept.append(prompt)
                sink.write(json.dumps({"prompt": prompt, "call": call}) + "\n")
                sink.flush()
                if len(kept) % log_every == 0:
                    log(f"prompts: {len(kept)}/{count} ({time.perf_counter() - started:.0f} s, {calls + 1} calls)")
            call += 1
            calls += 1
            if calls > 50 and len(kept) == resumed:
                raise ParadecodeError("the model wrote no usable request in 50 calls; try another --temperature.")
    return kept


def parse_items(text: str) -> list[str]:
    """The numbered items of a continued list, up to the first line that is not one (or a blank line)."""
    items = []
    for line in text.split("\n"):
        match = ITEM.match(line)
        if not match:
            break
        items.append(match.group(2))
    return items


def _reads_like_a_request(prompt: str) -> bool:
    words = prompt.split()
    letters = sum(c.isalpha() for c in prompt)
    return (4 <= len(words) <= 60 and prompt[-1] in "?.!:" and letters >= 0.7 * len(prompt.replace(" ", ""))
            and "http" not in prompt)


def _key(prompt: str) -> str:
    return " ".join(prompt.lower().split())


def _runs(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + OVERLAP]) for i in range(len(words) - OVERLAP + 1)}


def _benchmark_runs() -> set[tuple[str, ...]]:
    from paradecode.benchmark.questions import default_questions_path, load_questions

    runs: set[tuple[str, ...]] = set()
    for question in load_questions(default_questions_path()):
        for turn in question.turns:
            runs |= _runs(turn)
    return runs
