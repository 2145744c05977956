"""The built-in training prompt set for draft heads: seed topics x instruction templates, written for this repo.

Self-distillation needs prompts, not answers: the target model answers them itself. These prompts are
composed here from a list of everyday seed topics and instruction templates (explain, list, write, code,
compare, summarise a sentence, translate a sentence, arithmetic word problems), so they share no text with
Spec-Bench, MT-bench, HumanEval or GSM8K. They are part of paradecode and under its licence (Apache-2.0).

    paradecode train-draft --prompts builtin     # these prompts (the default)
    paradecode train-draft --prompts builtin,builtin-tasks   # and task-shaped prompts (task_prompts.py)
    paradecode train-draft --prompts my.jsonl    # one {"prompt": "..."} object per line
    paradecode train-draft --prompts ../shared/data/prompts --num-prompts 24000   # a mix of every .jsonl there
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from paradecode import utf8
from paradecode.errors import ParadecodeError

TOPICS = [
    "the water cycle", "volcanoes", "photosynthesis", "black holes", "the human heart", "honey bees",
    "the printing press", "electric cars", "solar panels", "the stock market", "inflation", "vaccines",
    "sleep", "coffee", "chess", "the Roman Empire", "the Silk Road", "jazz music", "impressionist painting",
    "the Moon landing", "climate change", "recycling", "rainforests", "coral reefs", "earthquakes",
    "machine learning", "the internet", "cryptography", "databases", "sorting algorithms", "binary numbers",
    "prime numbers", "fractions", "probability", "geometry", "gravity", "magnets", "light and color",
    "sound waves", "the periodic table", "DNA", "the immune system", "healthy breakfast", "running a marathon",
    "learning a language", "public speaking", "time management", "saving money", "starting a small business",
    "job interviews", "writing a resume", "team work", "gardening", "baking bread", "camping", "travel to Japan",
    "city parks", "public libraries", "trains", "bicycles", "airplanes", "the ocean", "deserts", "mountains",
    "cats", "dogs", "dinosaurs", "friendship", "kindness", "video games", "football", "the Olympic Games",
    "smartphones", "social media", "renewable energy", "space exploration", "robots", "ancient Egypt",
    "the French Revolution", "democracy", "the weather", "rain", "snow", "a rainy afternoon", "an old lighthouse",
]

TEMPLATES = [
    "Explain {topic} to a ten-year-old.",
    "What are three interesting facts about {topic}?",
    "Write a short paragraph about {topic}.",
    "Give me five tips related to {topic}.",
    "Write a short poem about {topic}.",
    "Write a short story that involves {topic}.",
    "What are the pros and cons of {topic}?",
    "Describe the history of {topic} in a few sentences.",
    "Write a Python function that could be useful for a program about {topic}. Explain the code.",
    "Summarize in one sentence: {topic} is a subject many people find interesting because it affects daily "
    "life in ways that are easy to overlook.",
    "Translate into French: I would like to learn more about {topic}.",
    "Translate into English: Ich möchte mehr über {topic} lernen.",
    "Write a question and answer quiz with three questions about {topic}.",
    "Imagine you are a teacher. Introduce {topic} to your class.",
    "Compare {topic} with something similar and explain the differences.",
    "Write an email to a friend about {topic}.",
]

WORD_PROBLEMS = [
    "A shop sells {a} apples on Monday and {b} apples on Tuesday. Each apple costs {c} dollars. How much money "
    "did the shop make? Explain step by step.",
    "Tom has {a} marbles. He gives {b} to his sister and then buys {c} more. How many marbles does he have now? "
    "Think step by step.",
    "A train travels {a} kilometers per hour for {b} hours and then {c} kilometers more. How far did it go? "
    "Show your reasoning.",
]


def builtin_prompts(count: int = 1000, seed: int = 0) -> list[str]:
    """``count`` distinct prompts, shuffled with ``seed``: every topic x template pair, then word problems."""
    pairs = [t.format(topic=topic) for topic in TOPICS for t in TEMPLATES]
    draws = random.Random(seed)
    problems = [p.format(a=draws.randint(2, 60), b=draws.randint(2, 30), c=draws.randint(2, 9))
                for _ in range(40) for p in WORD_PROBLEMS]
    prompts = pairs + problems
    draws.shuffle(prompts)
    return prompts[:count]


def read_prompts(source: str, count: int) -> list[str]:
    """``builtin``, ``builtin-tasks`` (``task_prompts.py``), a .jsonl file of ``{"prompt": ...}`` (or
    ``{"turns": [...]}``) objects (its first ``count``), or a folder of such files (``mix_prompts``)."""
    if Path(source).is_dir():
        return mix_prompts(Path(source), count)
    if source == "builtin":
        return builtin_prompts(count)
    if source == "builtin-tasks":
        from paradecode.training.task_prompts import task_prompts

        return task_prompts(count)
    path = Path(source)
    if not path.is_file():
        raise ParadecodeError(f"prompt file {source} does not exist; pass a .jsonl file, a folder of them or "
                              "'builtin'.")
    return _read_jsonl(path)[:count]


def mix_prompts(folder: Path, count: int, seed: int = 0) -> list[str]:
    """``count`` distinct prompts from every .jsonl file in ``folder``, as even a mix of the files as their sizes
    allow (water-filling: a file smaller than its share gives all of its prompts, the others share the rest
    equally), each file's sample drawn at random with ``seed``, the whole mix shuffled (so any prefix of it,
    e.g. the first shards of an interrupted run, is a mix too). Prompts that occur twice are kept once."""
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise ParadecodeError(f"{folder} holds no .jsonl prompt files.")
    seen: set[str] = set()
    sources = []
    for path in files:
        unique = [p for p in dict.fromkeys(_read_jsonl(path)) if p not in seen]
        seen.update(unique)
        sources.append(unique)
    shares = [0] * len(sources)
    left, open_ = min(count, sum(map(len, sources))), sorted(range(len(sources)), key=lambda i: len(sources[i]))
    while open_:
        level = left // len(open_)
        i = open_[0]
        if len(sources[i]) <= level:  # the smallest file fits under the level: all of it
            shares[i] = len(sources[i])
            left -= shares[i]
            open_.pop(0)
            continue
        for rank, i in enumerate(open_):  # the rest share what is left (the remainder to the first ones)
            shares[i] = level + (rank < left - level * len(open_))
        break
    draws = random.Random(seed)
    prompts = [p for prompts, share in zip(sources, shares) for p in draws.sample(prompts, share)]
    draws.shuffle(prompts)
    return prompts


def _read_jsonl(path: Path) -> list[str]:
    source = str(path)
    prompts = []
    for number, line in enumerate(utf8.json_lines(utf8.read(path, f"prompt file {source}")), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text = row["prompt"] if "prompt" in row else row["turns"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise ParadecodeError(f"{source} line {number}: expected a JSON object with a 'prompt' string.") from None
        if not isinstance(text, str) or not text.strip():
            raise ParadecodeError(f"{source} line {number}: the prompt is empty or not a string.")
        prompts.append(text)
    if not prompts:
        raise ParadecodeError(f"{source} holds no prompts.")
    return prompts
