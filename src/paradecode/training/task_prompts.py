"""The ``builtin-tasks`` prompt set: task-shaped prompts (summarise, answer from a passage, translate, extract,
solve, code, role-play, short facts), composed from seed lists written for this repository.

The ``builtin`` set (``prompts.py``) asks short everyday instructions about a topic; a benchmark also asks
the model to summarise an article, answer from a retrieved passage, translate a German sentence, work a
word problem or write a function. These prompts have those shapes, so a head trained on the answers sees
copying from a long context, translations and step-by-step arithmetic too. Every passage, sentence and
problem here is composed from the slot lists below (fictional towns, people and events); nothing comes from
Spec-Bench, MT-bench, HumanEval or GSM8K. Part of paradecode, under its licence (Apache-2.0).
"""

from __future__ import annotations

import random
from typing import Callable

from paradecode.training.prompts import TOPICS

TOWNS = ["Lindenfeld", "Port Avery", "Maple Hollow", "Kessington", "Riverton", "Bellmoor", "Ashby Cross",
         "New Harwick", "Elm Ridge", "Calloway", "Stonebridge", "Westmere", "Fairhaven", "Oakvale"]
PEOPLE = ["Maria Keller", "James Okafor", "Li Wen", "Sofia Rossi", "Daniel Brooks", "Amira Haddad",
          "Tom Becker", "Hannah Lindqvist", "Carlos Mendes", "Priya Nair", "Oliver Grant", "Yuki Tanaka"]
ROLES = ["the mayor", "a local teacher", "the head of the hospital", "a farmer", "a university researcher",
         "the owner of a bakery", "a city engineer", "the director of the museum", "a bus driver", "a nurse"]
PROJECTS = ["a new bridge over the river", "a free bus line to the hospital", "a solar farm on the old airfield",
            "a public swimming pool", "a program that plants a thousand trees", "a new library for children",
            "a bicycle lane through the city center", "a weekly farmers market", "a repair cafe for old devices",
            "a night shelter for homeless people", "a festival of local music", "a flood barrier along the coast"]
REACTIONS = ["welcomed the plan but worried about the cost", "said the town had waited for years",
             "asked for more time to study the details", "called it the best news of the year",
             "warned that construction would block traffic for months", "started a petition against it"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "March", "April", "June", "August", "September", "October", "December"]

GERMAN = [
    "Der Zug nach Hamburg hat heute zwanzig Minuten Verspätung.", "Meine Schwester arbeitet seit drei Jahren in "
    "einem Krankenhaus.", "Die Stadt plant einen neuen Park am Fluss.", "Wir haben am Wochenende einen langen "
    "Spaziergang im Wald gemacht.", "Die Preise für Lebensmittel sind im letzten Jahr stark gestiegen.",
    "Das Museum ist montags geschlossen.", "Die Schüler lernen in diesem Monat etwas über das Sonnensystem.",
    "Nach dem Regen war die Luft kühl und frisch.", "Die Regierung will mehr Geld in Schulen investieren.",
    "Der Bäcker öffnet seinen Laden jeden Morgen um sechs Uhr.", "Viele Menschen fahren im Sommer mit dem "
    "Fahrrad zur Arbeit.", "Das neue Stadion wird im nächsten Frühling fertig sein.", "Die Forscher haben eine "
    "neue Art von Käfer entdeckt.", "Am Abend treffen sich die Nachbarn oft im Garten.", "Die Firma hat im "
    "letzten Quartal weniger Autos verkauft.", "Der Arzt sagt, dass man genug Wasser trinken soll.",
    "Die Bibliothek bietet kostenlose Kurse für Senioren an.", "Im Winter ist es in den Bergen sehr kalt.",
    "Die Polizei sucht Zeugen für den Unfall auf der Autobahn.", "Unser Lehrer erklärt die Aufgaben immer "
    "sehr geduldig.", "Die Konferenz findet dieses Jahr in Wien statt.", "Der Film hat drei Preise gewonnen.",
]

CODE_TASKS = [
    "reverses the words in a sentence", "checks whether a string is a palindrome", "returns the n-th Fibonacci "
    "number", "counts how often each word appears in a text", "merges two sorted lists into one sorted list",
    "finds the largest number in a list without using max()", "removes duplicates from a list but keeps the "
    "order", "converts a temperature from Celsius to Fahrenheit", "checks whether a number is prime",
    "computes the average of a list of numbers", "finds the second smallest element of a list", "returns all "
    "pairs of numbers in a list that add up to a target", "flattens a nested list", "counts the vowels in a "
    "string", "implements binary search on a sorted list", "rotates a list by k positions", "computes the "
    "greatest common divisor of two numbers", "groups a list of words by their first letter", "validates that "
    "a string of brackets is balanced", "returns the longest common prefix of a list of strings", "transposes "
    "a matrix given as a list of lists", "reads a CSV file and returns the sum of one column", "implements a "
    "simple stack class with push and pop", "computes the factorial of a number recursively",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C++", "Java"]

QUESTIONS = ["What is the capital of {country}?", "What language do people speak in {country}?",
             "What is {country} famous for?", "Which continent is {country} on?"]
COUNTRIES = ["France", "Japan", "Brazil", "Kenya", "Canada", "Norway", "India", "Egypt", "Mexico", "Australia",
             "Italy", "Vietnam", "Peru", "Turkey", "Poland", "Argentina", "Thailand", "Ghana", "Spain", "Chile"]
FACTS = ["Who invented {thing}?", "When was {thing} first used?", "How does {thing} work?",
         "Why is {thing} important?"]
THINGS = ["the telephone", "the light bulb", "the steam engine", "the compass", "paper money", "the bicycle",
          "the microscope", "the radio", "vaccination", "the calendar", "the printing press", "the airplane"]

PERSONAS = ["a pirate captain", "a tour guide in Rome", "a detective", "a medieval knight", "a chef", "a coach "
            "before a big game", "an astronaut on the Moon", "a librarian", "a wise old wizard", "a news reporter"]


def _article(r: random.Random) -> tuple[str, dict]:
    """A short fictional news article and the facts it states."""
    f = dict(town=r.choice(TOWNS), person=r.choice(PEOPLE), role=r.choice(ROLES), project=r.choice(PROJECTS),
             other=r.choice(PEOPLE), reaction=r.choice(REACTIONS), day=r.choice(DAYS), month=r.choice(MONTHS),
             cost=r.randint(2, 90), year=r.randint(2019, 2031), people=r.randint(3, 60) * 100)
    sentences = [
        "Officials in {town} announced on {day} that the town will build {project}.",
        "{person}, {role}, said the work should begin in {month} and end before {year}.",
        "The project is expected to cost about {cost} million dollars, paid partly by the regional government.",
        "About {people} residents attended a public meeting about the plan last week.",
        "{other}, who has lived in {town} for many years, {reaction}.",
        "Supporters say the project will create jobs and make {town} a better place to live.",
        "Critics point out that a similar plan failed ten years ago because of rising costs.",
        "A final vote of the town council is planned for {month}.",
    ]
    keep = [s for i, s in enumerate(sentences) if i < 2 or r.random() < 0.75]
    return " ".join(s.format(**f) for s in keep), f


def _summarize(r):
    return r.choice(["Summarize: ", "Summarize the following article in two sentences.\n\n",
                     "Write a short summary of this news story:\n"]) + _article(r)[0]


def _rag(r):
    text, f = _article(r)
    question = r.choice([f"What will {f['town']} build?", f"How much will the project cost?",
                         f"Who is {f['person']}?", f"When should the work begin?",
                         f"How many residents attended the meeting?"])
    return r.choice([f"{text}\n\nAnswer the question using the text above: {question}",
                     f"Context: {text}\nQuestion: {question}\nAnswer:"])


def _extract(r):
    text, _ = _article(r)
    what = r.choice(["all names of people", "every number and what it refers to", "the dates and places",
                     "the main facts as a bulleted list", "the facts as a JSON object"])
    return f"Extract {what} from the following text:\n{text}"


def _translate(r):
    picks = r.sample(GERMAN, r.choice([1, 1, 2, 3]))
    return r.choice(["Translate German to English: ", "Translate into English: "]) + " ".join(picks)


def _math(r):
    a, b, c = r.randint(3, 80), r.randint(2, 40), r.randint(2, 12)
    p = r.choice([10, 20, 25, 50])
    return r.choice([
        f"{r.choice(PEOPLE)} buys {a} notebooks for {c} dollars each and pays with a {100 * (1 + a * c // 100)} "
        "dollar bill. How much change does she get?",
        f"A farm has {a} chickens and {b} cows. How many legs do the animals have in total?",
        f"A bakery sells {a} loaves of bread a day. Each loaf costs {c} dollars. How much does it earn in a "
        "week?",
        f"A jacket costs {a * 2} dollars. It is on sale for {p}% off. What is the new price?",
        f"A car drives {a} miles per hour for {c} hours and then {b} miles more. How many miles did it drive?",
        f"{r.choice(PEOPLE)} reads {b} pages a day. The book has {b * c + a} pages. How many days does it take "
        "to finish the book?",
        f"A rectangle is {a} meters long and {b} meters wide. What are its area and its perimeter?",
    ]) + r.choice(["", " Think step by step.", " Show your work."])


def _code(r):
    lang = r.choice(LANGUAGES)
    return r.choice([f"Write a {lang} function that {r.choice(CODE_TASKS)}.",
                     f"Implement a function in {lang} that {r.choice(CODE_TASKS)}. Add a short docstring.",
                     f"Write a {lang} program that {r.choice(CODE_TASKS)} and explain how it works."])


def _roleplay(r):
    return r.choice([f"Pretend to be {r.choice(PERSONAS)}. Describe your day.",
                     f"You are {r.choice(PERSONAS)}. Give advice to someone interested in {r.choice(TOPICS)}.",
                     f"Write a dialogue between {r.choice(PERSONAS)} and a child about {r.choice(TOPICS)}."])


def _qa(r):
    if r.random() < 0.5:
        return r.choice(QUESTIONS).format(country=r.choice(COUNTRIES))
    return r.choice(FACTS).format(thing=r.choice(THINGS))


def _reasoning(r):
    a, b, c = r.sample(PEOPLE, 3)
    return r.choice([f"{a} is older than {b}, and {b} is older than {c}. Who is the youngest? Explain.",
                     f"{a} finished a race before {b} but after {c}. Who finished first?",
                     f"If it takes {r.randint(2, 9)} workers {r.randint(2, 9)} days to paint a house, how long "
                     "would it take twice as many workers? Explain your reasoning."])


KINDS: list[Callable[[random.Random], str]] = [_summarize, _rag, _extract, _translate, _math, _code, _roleplay,
                                               _qa, _reasoning]


def task_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct prompts, cycling through the kinds above (the same list for the same seed)."""
    r = random.Random(seed)
    prompts, seen = [], set()
    for attempt in range(count * 50):
        prompt = KINDS[attempt % len(KINDS)](r)
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
            if len(prompts) == count:
                break
    return prompts
