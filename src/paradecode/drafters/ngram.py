"""Adaptive n-gram drafting (ANPD, Ou et al. 2024): a multi-level n-gram model of the prompt and the output.

For every n in [min_ngram, max_ngram] a table maps each n-gram of the text so far (prompt and generated
tokens, updated every step) to counts of the tokens that followed it. A draft is generated token by token,
like a tiny language model: each suffix of ``text + draft so far`` that the table knows offers its most
frequent successor (ties: the latest), and the level whose kind of guess has been accepted most often wins
(ties: the longest suffix). Because each drafted token extends the context of the next lookup, a draft runs
past the end of one copied span into another and follows the most frequent continuation rather than the
latest one, which prompt lookup (``pld``) cannot.

It also learns how far to trust itself. A guess is tagged (n, how often that successor was seen, whether it
followed most occurrences of the suffix), and the verdicts keep a decaying acceptance rate per tag (kinds
of guess differ widely: docs/methods.md). Their product along the draft estimates the chance that its first 1, 2, ... tokens are accepted. With the default
``cost`` schedule those chances decide the draft's length: it keeps the prefix that maximises expected tokens
per second under the measured cost of a verify pass (``drafters.schedule``). With the other schedules
drafting stops at the schedule's length or when that chance falls below ``min_accept``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.schedule import ScheduledDrafter, check_schedule_options
from paradecode.errors import ParadecodeError
from paradecode.registry import register
from paradecode.verify.base import Verdict


@dataclass(frozen=True)
class NgramOptions:
    max_ngram: int = 4  # longest context the tables keep
    min_ngram: int = 1  # shortest context used to predict
    num_draft: int = 8  # most tokens per step (fixed), or the first step's (heuristic, cost)
    schedule: str = "cost"  # fixed | heuristic | cost: see drafters.schedule
    max_num_draft: int = 16  # ceiling for the heuristic and cost schedules
    min_accept: float = 0.0  # stop once the estimated chance that the whole draft is accepted is below this

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ParadecodeError(
                f"ngram needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, max_ngram={self.max_ngram}."
            )
        if not 0.0 <= self.min_accept < 1.0:
            raise ParadecodeError(f"ngram option min_accept must be in [0, 1), got {self.min_accept}.")
        check_schedule_options("ngram", self.schedule, self.num_draft, self.max_num_draft)


class NgramTable:
    """For each n-gram (min_n <= n <= max_n) of a growing token list: its successors' counts and the best one."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}  # context -> {next token: times seen}
        self.best: dict[tuple[int, ...], int] = {}  # context -> most frequent next token (ties: the latest)
        self.total: dict[tuple[int, ...], int] = {}  # context -> times seen with a successor
        self.indexed = 1  # successors at positions < indexed are counted

    def update(self, tokens: list[int]) -> None:
        """Count the successors of every n-gram whose next token is known."""
        counts, best, total = self.counts, self.best, self.total
        for end in range(self.indexed, len(tokens)):  # tokens[end] follows the n-grams ending at end - 1
            token = tokens[end]
            for n in range(self.min_n, min(self.max_n, end) + 1):
                context = tuple(tokens[end - n : end])
                seen = counts.get(context)
                if seen is None:
                    seen = counts[context] = {}
                times = seen[token] = seen.get(token, 0) + 1
                total[context] = total.get(context, 0) + 1
                if times >= seen.get(best.get(context, token), 0):
                    best[context] = token
        self.indexed = max(self.indexed, len(tokens))

    def predict(self, context: list[int]) -> list[tuple[int, tuple[int, int, bool]]]:
        """For each suffix of ``context`` seen before, longest first: (its best next token, tag). The tag is
        (n, the token's count capped at 3, whether it followed more than half of the suffix's occurrences)."""
        guesses = []
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            key = tuple(context[-n:])
            token = self.best.get(key)
            if token is not None:
                times = self.counts[key][token]
                guesses.append((token, (n, min(times, 3), 2 * times > self.total[key])))
        return guesses


class TagAcceptance:
    """Discounted acceptance rate per tag (see ``NgramTable.predict``), shrunk towards the rate of all tags."""

    DECAY = 0.98
    PRIOR_WEIGHT = 2.0

    def __init__(self) -> None:
        self.tried: dict[tuple, float] = {}
        self.hits: dict[tuple, float] = {}
        self.all_tried = self.all_hits = 0.0

    def rate(self, tag: tuple) -> float:
        pooled = (self.all_hits + 1.0) / (self.all_tried + 2.0)
        w = self.PRIOR_WEIGHT
        return (self.hits.get(tag, 0.0) + w * pooled) / (self.tried.get(tag, 0.0) + w)

    def update(self, tag: tuple, hit: bool) -> None:
        self.tried[tag] = self.tried.get(tag, 0.0) * self.DECAY + 1.0
        self.hits[tag] = self.hits.get(tag, 0.0) * self.DECAY + float(hit)
        self.all_tried = self.all_tried * self.DECAY + 1.0
        self.all_hits = self.all_hits * self.DECAY + float(hit)


@register("ngram")
class NgramDrafter(ScheduledDrafter):
    Options = NgramOptions
    # the table catches up with state.tokens itself; observe only judges the tags of its own last proposal
    observe_optional: ClassVar[bool] = True

    def begin(self, state: DecodeState) -> None:
        self.table = NgramTable(self.options.min_ngram, self.options.max_ngram)
        self.acceptance = TagAcceptance()
        self.schedule = self.new_schedule(state)
        self.tags: list[tuple] = []  # tag of each token of the proposal being verified

    def propose(self, state: DecodeState) -> Proposal:
        drafts, tags, chances = self._draft(state, self.schedule.candidates())
        keep = self.schedule.best_prefix(chances)  # the cost schedule weighs the chances against time
        drafts, self.tags = drafts[:keep], tags[:keep]
        self.schedule.proposed(len(drafts))
        return Proposal(tokens=drafts)

    def peek(self, state: DecodeState) -> Proposal:
        drafts, tags, chances = self._draft(state, self.schedule.planned_candidates())
        keep = self.schedule.planned(chances)
        probe = Proposal(tokens=drafts, info={"tags": tags})  # every candidate token is judged (Drafter.peek)
        return Proposal(tokens=drafts[:keep], info={"tags": tags[:keep], "probe": probe})

    def peeked(self, proposal: Proposal, accepted: int) -> None:
        self._judge(proposal.info["tags"], accepted)
        self.schedule.judged(len(proposal.tokens), accepted)

    def _draft(self, state: DecodeState, length: int) -> tuple[list[int], list[tuple], list[float]]:
        """Up to ``length`` drafted tokens, their tags and the estimated chance that the draft's first 1, 2, ...
        tokens are accepted."""
        length = min(length, state.max_draft)
        self.table.update(state.tokens)
        context = state.tokens[-self.options.max_ngram :]
        drafts: list[int] = []
        tags: list[tuple] = []
        chances: list[float] = []
        rates: dict[tuple, float] = {}  # each tag's rate: the acceptance does not change while drafting

        def rate(guess: tuple[int, tuple]) -> float:
            tag = guess[1]
            known = rates.get(tag)
            if known is None:
                known = rates[tag] = self.acceptance.rate(tag)
            return known

        while len(drafts) < length:
            guesses = self.table.predict(context)
            if not guesses:
                break
            # the level whose kind of guess has been accepted most often (ties: the longest context)
            guess = max(guesses, key=rate)
            token, tag = guess
            chance = (chances[-1] if chances else 1.0) * rate(guess)
            if chance < self.options.min_accept:
                break
            drafts.append(token)
            tags.append(tag)
            chances.append(chance)
            context = context[1:] + [token] if len(context) == self.options.max_ngram else context + [token]
        return drafts, tags, chances

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        accepted = len(verdict.accepted)
        self._judge(self.tags, accepted)
        self.schedule.update(accepted)

    def _judge(self, tags: list[tuple], accepted: int) -> None:
        for i, tag in enumerate(tags[: accepted + 1]):  # the tokens that were judged
            self.acceptance.update(tag, i < accepted)
