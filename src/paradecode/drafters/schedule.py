"""How many tokens to draft next: one small policy shared by every chain drafter (``schedule=`` option).

    fixed      always ``num_draft`` tokens.
    heuristic  transformers' ``num_assistant_tokens_schedule="heuristic"``: start at ``num_draft``; after a
               full accept draft 2 more next time, after a rejection 1 fewer (never below 1, never above
               ``max_num_draft``).
    cost       draft the k that maximises expected committed tokens per second,

                   k* = argmax_k  (1 + E[accepted(k)]) / (verify(1 + k) + k * draft_per_token)

               where E[accepted(k)] = sum_{j<=k} prod_{i<=j} a_i from an online estimate of a_i, the chance
               that draft position i is accepted given positions < i were, verify(T) is the time of a step
               whose forward pass scores T tokens (root + drafts), fitted online as a line in T, and
               draft_per_token is the drafter's own time per drafted token (a draft model, layer skip).
               Nothing is calibrated up front: the schedule times its own steps. k = 0 (plain decoding) is a
               choice too when drafting does not pay; then a one-token probe, after ``FIRST_PROBE`` idle
               steps and twice as long a wait after each probe that does not change the choice, lets the
               acceptance estimate recover at a cost that shrinks over time.

               Under load (the request shares its passes with others: ``DecodeState.load``, from
               ``backends.sequences``) the same rule is applied to the whole pass: with the others putting
               R rows into each pass and committing A tokens from it,

                   k* = argmax_k  (A + 1 + E[accepted(k)]) / (pass(R + 1 + k) + k * draft_per_token)

               where pass(T) is the one-row step time scaled by the measured relative cost at T rows (without
               a measured curve: the fit of the request's own steps, which ran in passes under that load). A draft
               row is worth its place when what it adds to the pass's tokens beats what it adds to the pass's
               time: alone (R = A = 0) this is the rule above; in a full pass, where each extra row costs the
               others' time too, it drafts less or not at all.

A drafter with a ``schedule`` option derives from ``ScheduledDrafter``, which builds the schedule for each
request (``new_schedule``) and asks the model for its measured cost curve when the schedule is ``cost``.
It calls ``length()`` at the start of ``propose``, ``proposed(n)`` once it has drafted n tokens, and
``update(accepted)`` from ``observe``. Time between ``proposed`` and the next ``length`` is the step's verify
cost (the target forward plus the engine's per-step work); time between ``length`` and ``proposed`` is drafting.
A drafter that can estimate the chance of each of its own tokens (``ngram``) calls ``candidates()`` instead of
``length()`` and lets ``best_prefix(chances)`` cut its draft: the cost schedule then weighs those per-token
chances, which know more than an average over positions, against the same cost curve.
"""

from __future__ import annotations

import itertools
import time
from typing import Callable

from paradecode.backends.base import Load
from paradecode.drafters.base import DecodeState, Drafter
from paradecode.errors import ParadecodeError

SCHEDULES = ("fixed", "heuristic", "cost")
FIRST_PROBE = 8  # cost schedule: idle steps before the first one-token probe (the wait then doubles)


def check_schedule_options(method: str, schedule: str, num_draft: int, max_num_draft: int) -> None:
    """Raise a ParadecodeError for a bad schedule / num_draft / max_num_draft (call from Options)."""
    if schedule not in SCHEDULES:
        raise ParadecodeError(f"{method} option schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}.")
    if num_draft < 1:
        raise ParadecodeError(f"{method} option num_draft must be >= 1, got {num_draft}.")
    if max_num_draft < num_draft:
        raise ParadecodeError(
            f"{method} needs max_num_draft >= num_draft, got max_num_draft={max_num_draft}, num_draft={num_draft}."
        )


class DraftSchedule:
    """``fixed``: always ``num_draft`` tokens. Base class of the other schedules."""

    def __init__(self, num_draft: int, max_num_draft: int) -> None:
        self.num_draft, self.max_num_draft = num_draft, max_num_draft
        self.drafted = 0  # tokens in the proposal now being verified

    def length(self) -> int:
        """Draft tokens to propose this step (the drafter still caps it by ``state.max_draft``)."""
        return self.planned()

    def candidates(self) -> int:
        """Like ``length``, for a drafter that will cut its draft with ``best_prefix``."""
        return self.planned_candidates()

    def best_prefix(self, chances: list[float]) -> int:
        """How many tokens of a candidate draft to keep, given the drafter's own estimate of the chance that
        its first 1, 2, ... tokens are all accepted (drafted already). Only the cost schedule weighs this
        against time."""
        return self.planned(chances, drafted=True)

    def proposed(self, drafted: int) -> None:
        self.drafted = drafted

    def drafted_elsewhere(self, drafted: int) -> None:
        """The coming step verifies ``drafted`` tokens that another source drafted instead of this schedule's
        drafter (a head drafter's copy, ``HeadDrafter.copy_draft``); its verdict does not come to ``update``."""

    def not_drafting(self, seconds: float) -> None:
        """``seconds`` of the drafting now under way went to something else than the draft's tokens (a head
        feeding the pairs committed since it last ran)."""

    def update(self, accepted: int) -> None:
        """The verdict of the last proposal: ``accepted`` of its ``drafted`` tokens matched."""
        self.judged(self.drafted, accepted)

    def judged(self, drafted: int, accepted: int) -> None:
        """``accepted`` of ``drafted`` tokens matched: the last proposal's verdict, or a peek's (``Drafter.peeked``)."""

    def planned_candidates(self) -> int:
        """What ``candidates`` would say now, with no side effect."""
        return self.planned()

    def planned(self, chances: list[float] | None = None, drafted: bool = False) -> int:
        """What ``length`` (or, given the chances, ``best_prefix``) would say now, with no side effect: for a
        drafter's ``peek``. ``drafted``: the chances' tokens are drafted already, so their drafting time is
        spent whatever is kept (``best_prefix``'s case); without it the cost schedule counts that time too,
        which answers whether drafting them pays at all."""
        return self.num_draft if chances is None else len(chances)


class HeuristicSchedule(DraftSchedule):
    def __init__(self, num_draft: int, max_num_draft: int) -> None:
        super().__init__(num_draft, max_num_draft)
        self.current = num_draft

    def planned(self, chances: list[float] | None = None, drafted: bool = False) -> int:
        return self.current if chances is None else len(chances)

    def judged(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return  # nothing was drafted (no n-gram match, or the budget is spent): nothing learnt
        if accepted == drafted:
            self.current = min(self.current + 2, self.max_num_draft)
        else:
            self.current = max(self.current - 1, 1)


class AcceptanceProfile:
    """Online a_i = P(draft position i accepted | positions < i accepted), with exponential forgetting.

    Each position's rate is shrunk towards the pooled rate of all positions (``PRIOR_WEIGHT`` pseudo-trials),
    so positions never drafted yet borrow the pooled estimate."""

    DECAY = 0.95  # per update: about the last 20 steps count
    PRIOR_WEIGHT = 2.0

    def __init__(self, positions: int) -> None:
        self.tried = [0.0] * positions
        self.hits = [0.0] * positions

    def update(self, drafted: int, accepted: int) -> None:
        self.tried = [t * self.DECAY for t in self.tried]
        self.hits = [h * self.DECAY for h in self.hits]
        for i in range(min(drafted, accepted + 1, len(self.tried))):  # positions that were judged
            self.tried[i] += 1.0
            self.hits[i] += float(i < accepted)

    def rates(self) -> list[float]:
        pooled = (sum(self.hits) + 1.0) / (sum(self.tried) + 2.0)  # Beta(1, 1) prior
        w = self.PRIOR_WEIGHT
        return [(h + w * pooled) / (t + w) for h, t in zip(self.hits, self.tried)]

    def expected_accepted(self) -> list[float]:
        """E[accepted(k)] for k = 0 .. positions."""
        expected, survive, total = [0.0], 1.0, 0.0
        for rate in self.rates():
            survive *= rate
            total += survive
            expected.append(total)
        return expected


class CostCurve:
    """Online time of a step scoring T tokens.

    Keeps a running mean per T (observations beyond 3x the mean are clipped: other processes share the CPU)
    and fits a line base + slope * (T - 1) through them by weighted least squares, regularised towards
    slope = ``PRIOR_SLOPE`` * base so a few observations at a single T still give a usable curve. A T seen
    often is predicted by its own mean (CPU matmul kernels are not linear in T: on some builds 2 or 3 rows
    cost more than 4), one seen rarely or never by the line."""

    PRIOR_SLOPE = 0.1  # without a measured shape: a forward over 10 tokens costs about twice a 1-token one
    PRIOR_WEIGHT = 2.0
    MAX_WEIGHT = 8.0  # a bucket's weight in the fit saturates, so the line follows every T seen

    def __init__(self, shape: dict[int, float] | None = None) -> None:
        self.mean: dict[int, float] = {}  # T -> mean seconds
        self.count: dict[int, int] = {}
        # The backend's measured cost of T tokens relative to one (``paradecode.profile``): when given, the
        # prior is base * shape(T), base fitted to this request's steps, instead of the line.
        self.shape = dict(sorted(shape.items())) if shape else None
        self._shape_at: dict[float, float] = {}  # shape_at's answers (the shape never changes)
        self._predicted: list[float] = []  # predictions' last answer, until the next add
        self._horizon = 1  # the most T predictions was asked for

    @property
    def empty(self) -> bool:
        return not self.mean

    def add(self, tokens: int, seconds: float) -> None:
        self._predicted = []
        n = self.count.get(tokens, 0)
        if n:
            mean = self.mean[tokens]
            seconds = min(max(seconds, mean / 3), mean * 3)
            self.mean[tokens] = mean + (seconds - mean) / min(n + 1, 10)  # running mean, then a moving one
        else:
            self.mean[tokens] = seconds
        self.count[tokens] = n + 1

    def predictions(self, upto: int) -> list[float]:
        """Predicted seconds for T = 1 .. upto: each T's own mean blended with the prior (the measured shape
        scaled to this request, else the fitted line) by their weights. Asked every step by every schedule and
        by ``auto``, so the answer is kept until the next ``add``, for the most T anyone asked since the curve
        began (a schedule asks for its longest draft, ``auto`` for its peeks' rows: one fit serves both)."""
        if len(self._predicted) >= upto:
            return self._predicted[:upto]
        asked, upto = upto, max(upto, self._horizon)
        self._horizon = upto
        prior = self._prior()
        predicted = [prior(t) for t in range(1, upto + 1)]
        # a T never seen keeps the prior: (0 * line + w * line) / w is line to the bit
        for tokens in self.mean:
            if tokens <= upto:
                predicted[tokens - 1] = self._blend(tokens, predicted[tokens - 1])
        self._predicted = predicted
        return predicted[:asked]

    def at(self, tokens: int) -> float:
        """``predictions(tokens)[-1]``, bit for bit, without working out the shorter T (``auto`` prices its step
        by it every step)."""
        if len(self._predicted) >= tokens:
            return self._predicted[tokens - 1]
        prior = self._prior()(tokens)
        return self._blend(tokens, prior) if tokens in self.mean else prior

    def _prior(self) -> Callable[[int], float]:
        """The prior's time for T: the measured shape scaled to this curve's means, else the fitted line."""
        if self.shape:
            base = self._shape_base()
            return lambda tokens: base * self.shape_at(tokens)
        base, slope = self.line()
        return lambda tokens: base + slope * (tokens - 1)

    def _shape_base(self) -> float:
        """The scale of the measured shape that fits this curve's means best (weighted least squares)."""
        num = den = 0.0
        for t, y in self.mean.items():
            w, x = min(self.count[t], self.MAX_WEIGHT), self.shape_at(t)
            num += w * x * y
            den += w * x * x
        return num / den

    def _blend(self, tokens: int, prior: float) -> float:
        """A seen T's mean blended with the prior by their weights."""
        n = min(self.count[tokens], self.MAX_WEIGHT)
        return (n * self.mean[tokens] + self.PRIOR_WEIGHT * prior) / (n + self.PRIOR_WEIGHT)

    def shape_at(self, tokens: float) -> float:
        """The measured relative cost at T, linear between measured sizes and along the last segment beyond."""
        known = self._shape_at.get(tokens)
        if known is None:
            known = self._shape_at[tokens] = self._interpolate(tokens)
        return known

    def _interpolate(self, tokens: float) -> float:
        sizes = list(self.shape)
        if tokens in self.shape:
            return self.shape[tokens]
        if len(sizes) == 1:
            return self.shape[sizes[0]]
        i = next((i for i, t in enumerate(sizes) if t > tokens), len(sizes) - 1)
        lo, hi = sizes[max(i - 1, 0)], sizes[max(i, 1)]
        slope = (self.shape[hi] - self.shape[lo]) / (hi - lo)
        return max(self.shape[lo] + slope * (tokens - lo), 1e-9)

    def line(self) -> tuple[float, float]:
        """(base, slope) minimising sum w (y - base - slope x)^2 + P (slope - r base)^2, with x = T - 1."""
        r, p = self.PRIOR_SLOPE, self.PRIOR_WEIGHT
        points = [(min(self.count[t], self.MAX_WEIGHT), t - 1, y) for t, y in self.mean.items()]  # (w, x, y)
        sw = sum(w for w, _, _ in points)
        sx = sum(w * x for w, x, _ in points)
        sxx = sum(w * x * x for w, x, _ in points)
        sy = sum(w * y for w, _, y in points)
        sxy = sum(w * x * y for w, x, y in points)
        # normal equations of the regularised fit, a 2x2 system in (base, slope)
        a11, a12, a22 = sw + p * r * r, sx - p * r, sxx + p
        det = a11 * a22 - a12 * a12
        base = (sy * a22 - sxy * a12) / det
        slope = (a11 * sxy - a12 * sy) / det
        if slope < 0:  # a flat curve (or noise): extra tokens are free
            return sy / sw, 0.0
        if base <= 0:  # noise: keep the prior's shape, base * (1 + r x), fitted to the data
            base = sum(w * y * (1 + r * x) for w, x, y in points) / sum(w * (1 + r * x) ** 2 for w, x, _ in points)
            slope = r * base
        return base, slope


class CostSchedule(DraftSchedule):
    def __init__(self, num_draft: int, max_num_draft: int, shape: dict[int, float] | None = None,
                 curve: CostCurve | None = None, load: Callable[[], Load] | None = None) -> None:
        super().__init__(num_draft, max_num_draft)
        self.load = load  # what the requests sharing this one's passes put into each (None: it runs alone)
        self.profile = AcceptanceProfile(max_num_draft)
        self.curve = curve if curve is not None else CostCurve(shape)  # shared where DecodeState.step_cost is
        # a shared curve is fitted by its owner (``auto`` times every step, whichever arm ran it): a schedule that
        # added its own steps as well counted each twice, and its first step after other arms' steps as long as
        # all of them (clipped at 3x the mean)
        self.times_steps = curve is None
        self.draft_seconds: float | None = None  # running mean time per drafted token
        self.idle_steps = 0  # steps in a row that drafted nothing by choice
        self.probe_after = FIRST_PROBE  # idle steps before the next probe
        self._verify_start: float | None = None
        self._propose_start = 0.0

    def length(self) -> int:
        self._start_step()
        return self._probed(self.planned())

    def candidates(self) -> int:
        self._start_step()
        return self.planned_candidates()

    def best_length(self) -> int:
        return self._best(self.profile.expected_accepted())

    def best_prefix(self, chances: list[float]) -> int:
        return self._probed(self.planned(chances, drafted=True)) if chances else 0

    def planned_candidates(self) -> int:
        return self.num_draft if self.curve.empty else self.max_num_draft

    def planned(self, chances: list[float] | None = None, drafted: bool = False) -> int:
        """Without a timed step yet, the base schedule's answer (under load with a measured curve, its shape
        decides already: a first step's full-length draft would cost every request in the pass); then the
        length that maximises tokens per second (no probe of an idle schedule: ``length`` and ``best_prefix``
        add that)."""
        if self.curve.empty and not (self.curve.shape and self._load().rows > 0):
            return super().planned(chances)
        if chances is None:
            return self.best_length()
        return self._best([0.0, *itertools.accumulate(chances)], drafted)

    def _load(self) -> Load:
        return self.load() if self.load is not None else Load()

    def _probed(self, k: int) -> int:
        return k if self.curve.empty else self._probe(k)

    def _best(self, expected: list[float], drafted: bool = False) -> int:
        """argmax_k (1 + expected[k]) / (verify(1 + k) + k * draft_per_token): tokens per second; under load, the
        whole pass's tokens per second (see the module's docstring). ``drafted``: the candidates are drafted
        already, so their drafting time is spent whatever is kept and only the verify time counts."""
        draft = 0.0 if drafted else self.draft_seconds or 0.0
        load = self._load()
        if load.rows > 0:
            if self.curve.shape:  # the measured cost of a pass by its total rows; this request's own steps ran
                at = self.curve.shape_at  # in passes of R + 1 + drafted rows, so its fit at one row is pass(R + 1)
                if self.curve.empty:  # no step timed yet: the shape alone (drafting taken as free)
                    one_row, draft = 1.0, 0.0
                else:
                    one_row = self.curve.predictions(1)[0] / at(load.rows + 1)
                passes = [one_row * at(load.rows + 1 + k) for k in range(len(expected))]
            else:  # no measured shape: the fit of this request's own steps, timed in passes under the same load
                passes = self.curve.predictions(len(expected))
            scores = [(load.tokens + 1 + e) / (passes[k] + draft * k) for k, e in enumerate(expected)]
        else:
            verify = self.curve.predictions(len(expected))  # verify[k]: a step scoring 1 + k tokens
            scores = [(1 + e) / (verify[k] + draft * k) for k, e in enumerate(expected)]
        return scores.index(max(scores))  # the first best, as max over the indices would pick

    def _probe(self, k: int) -> int:
        """While drafting does not pay (k = 0), draft one token now and then so a low estimate can be proven
        wrong: after FIRST_PROBE idle steps, then after twice as many as the last wait."""
        if k > 0:
            self.idle_steps, self.probe_after = 0, FIRST_PROBE
            return k
        self.idle_steps += 1
        if self.idle_steps < self.probe_after:
            return 0
        self.idle_steps, self.probe_after = 0, 2 * self.probe_after
        return 1

    def _end_step(self) -> float:
        """Time the step in flight (its forward and the engine's work since ``proposed``) into the curve, at its
        rows; returns now."""
        now = time.perf_counter()
        if self._verify_start is not None and self.times_steps:
            self.curve.add(1 + self.drafted, now - self._verify_start)
        return now

    def _start_step(self) -> None:
        self._propose_start = self._end_step()
        self._verify_start = None

    def proposed(self, drafted: int) -> None:
        now = time.perf_counter()
        if drafted:
            per_token = (now - self._propose_start) / drafted
            old = self.draft_seconds
            self.draft_seconds = per_token if old is None else old + (min(per_token, 3 * old) - old) / 8
        self.drafted = drafted
        self._verify_start = now

    def drafted_elsewhere(self, drafted: int) -> None:
        """The step in flight ends here, and the coming one is timed as a step over 1 + ``drafted`` rows: it is
        one on the same forward, though neither its drafting time nor its verdict is this schedule's. Without
        this a copy step's time ran into the step before it: a head step followed by a copy was timed as two
        steps at the head step's width."""
        self._verify_start = self._end_step()
        self.drafted = drafted

    def not_drafting(self, seconds: float) -> None:
        """Leave ``seconds`` out of this step's drafting time. A head's feed of the prompt at its first draft
        made the first price per drafted token 7 ms where a head step takes ~0.4 (SmolLM2-135M, AMD EPYC Zen 4),
        and with the catch-up feeds after copies the price stayed at 0.9-1 ms: the schedule cut drafts that
        paid."""
        self._propose_start += seconds

    def judged(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.profile.update(drafted, accepted)


_KINDS = {"fixed": DraftSchedule, "heuristic": HeuristicSchedule, "cost": CostSchedule}


def make_schedule(kind: str, num_draft: int, max_num_draft: int, state: DecodeState | None = None) -> DraftSchedule:
    """A schedule for the request starting with ``state``; ``cost`` starts from the target's measured cost curve
    when given (``DecodeState.cost_curve``), fits its step times into ``DecodeState.step_cost`` where one is shared,
    and weighs its drafts against the whole pass where the request shares its passes (``DecodeState.load``)."""
    if kind == "cost":
        if state is None:
            return CostSchedule(num_draft, max_num_draft)
        return CostSchedule(num_draft, max_num_draft, state.cost_curve, state.step_cost, state.load)
    return _KINDS[kind](num_draft, max_num_draft)


class ScheduledDrafter(Drafter):
    """A drafter whose draft length follows its ``schedule`` option (with ``num_draft`` and ``max_num_draft``,
    unless it builds its schedule from other options)."""

    def wants_cost_curve(self) -> bool:
        return self.options.schedule == "cost"

    def new_schedule(self, state: DecodeState) -> DraftSchedule:
        """The schedule for the request starting with ``state``."""
        o = self.options
        return make_schedule(o.schedule, o.num_draft, o.max_num_draft, state)
