"""The built-in training prompt set for draft heads: seed topics x instruction templates, written for this repo.

Self-distillation needs prompts, not answers: the target model answers them itself. These prompts are
composed here from a list of everyday seed topics and instruction templates (explain, list, write, code,
compare, summarise a sentence, translate a sentence, arithmetic word problems), so they share no text with
Spec-Bench, MT-bench, HumanEval or GSM8K. They are part of paradecode and under its licence (Apache-2.0).

    paradecode train-draft --prompts builtin     # these prompts (the default)
    paradecode train-draft --prompts builtin,builtin-tasks   # and task-shaped prompts (task_prompts.py)
    paradecode train-draft --prompts my.jsonl    # one {"prompt": "..."} object per line
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
    """``builtin``, ``builtin-tasks`` (``task_prompts.py``) or a .jsonl file of ``{"prompt": ...}`` (or ``{"turns": [...]}``) objects."""
    if source == "builtin":
        return builtin_prompts(count)
    if source == "builtin-tasks":
        from paradecode.training.task_prompts import task_prompts

        return task_prompts(count)
    path = Path(source)
    if not path.is_file():
        raise ParadecodeError(f"prompt file {source} does not exist; pass a .jsonl file or 'builtin'.")
    prompts = []
    for number, line in enumerate(utf8.read(path, f"prompt file {source}").splitlines(), 1):
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
    return prompts[:count]
