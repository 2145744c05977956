"""Draft-length schedules: heuristic grow/shrink, and the cost schedule's choice on synthetic costs and acceptance.

The cost schedule times its own steps; these tests drive it with a fake clock, so every number is exact.
"""

import random

import pytest
import torch

import paradecode.drafters.schedule as schedule_module
from paradecode.backends.base import Load
from paradecode.config import SamplingConfig
from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.schedule import (
    FIRST_PROBE,
    AcceptanceProfile,
    CostCurve,
    CostSchedule,
    make_schedule,
)
from paradecode.errors import ParadecodeError
from paradecode.registry import get_method


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(schedule_module, "time", fake)
    return fake


def test_fixed_always_drafts_num_draft():
    schedule = make_schedule("fixed", 5, 16)
    for accepted in (0, 5, 2, 5):
        assert schedule.length() == 5
        schedule.proposed(5)
        schedule.update(accepted)


def test_heuristic_grows_after_full_accept_and_shrinks_after_rejection():
    schedule = make_schedule("heuristic", 4, 9)
    lengths = []
    for accepted_all in (True, True, True, False, False, True, False, False, False, False, False, False):
        n = schedule.length()
        lengths.append(n)
        schedule.proposed(n)
        schedule.update(n if accepted_all else n - 1)
    assert lengths == [4, 6, 8, 9, 8, 7, 9, 8, 7, 6, 5, 4]  # +2 capped at 9, -1 per rejection
    for _ in range(10):
        n = schedule.length()
        schedule.proposed(n)
        schedule.update(0)
    assert schedule.length() == 1  # never below one token


def test_heuristic_counts_a_short_draft_fully_accepted_as_full_and_ignores_empty_drafts():
    schedule = make_schedule("heuristic", 4, 16)
    schedule.length()
    schedule.proposed(2)  # pld found only 2 tokens to copy
    schedule.update(2)
    assert schedule.length() == 6
    schedule.proposed(0)  # no match: nothing learnt
    schedule.update(0)
    assert schedule.length() == 6


def test_acceptance_profile_learns_per_position_rates():
    profile = AcceptanceProfile(4)
    for _ in range(200):
        profile.update(drafted=4, accepted=1)  # position 0 always accepted, position 1 always rejected
    rates = profile.rates()
    assert rates[0] > 0.9 and rates[1] < 0.1
    assert profile.tried[2] == profile.tried[3] == 0  # never judged
    expected = profile.expected_accepted()
    assert expected[0] == 0 and expected[1] == pytest.approx(rates[0])
    assert expected[2] - expected[1] < 0.1  # a second token is almost never accepted
    assert all(b >= a for a, b in zip(expected, expected[1:]))


def test_cost_curve_recovers_a_line_and_keeps_a_kink():
    curve = CostCurve()
    for _ in range(10):
        for tokens in range(1, 9):
            curve.add(tokens, 2.0 + 0.5 * (tokens - 1))
    base, slope = curve.line()
    assert base == pytest.approx(2.0, rel=0.05) and slope == pytest.approx(0.5, rel=0.05)
    single = CostCurve()
    single.add(1, 3.0)
    assert single.line() == pytest.approx((3.0, 3.0 * CostCurve.PRIOR_SLOPE), rel=1e-6)  # the prior's shape
    kinked = CostCurve()
    for _ in range(10):
        for tokens, seconds in ((1, 1.0), (2, 1.8), (4, 1.3), (8, 1.7)):  # 2 rows cost more than 4
            kinked.add(tokens, seconds)
    predicted = kinked.predictions(8)
    assert predicted[1] > predicted[3]
    assert predicted[1] == pytest.approx(1.8, rel=0.1)


def _reference_predictions(curve: CostCurve, upto: int) -> list[float]:
    """predictions' definition, written out plainly: each T's mean blended with the prior by their weights."""
    if curve.shape:
        points = [(min(curve.count[t], curve.MAX_WEIGHT), curve.shape_at(t), y) for t, y in curve.mean.items()]
        base = sum(w * x * y for w, x, y in points) / sum(w * x * x for w, x, _ in points)
        prior = [base * curve.shape_at(t) for t in range(1, upto + 1)]
    else:
        base, slope = curve.line()
        prior = [base + slope * (t - 1) for t in range(1, upto + 1)]
    out = []
    for tokens, line in zip(range(1, upto + 1), prior):
        n = min(curve.count.get(tokens, 0), curve.MAX_WEIGHT)
        out.append((n * curve.mean.get(tokens, line) + curve.PRIOR_WEIGHT * line) / (n + curve.PRIOR_WEIGHT))
    return out


@pytest.mark.parametrize("shape", [None, {1: 1.0, 2: 1.1, 4: 1.25, 8: 1.5, 16: 2.05, 32: 3.2}])
def test_cost_curve_predictions_match_their_definition_to_the_bit_whatever_was_asked_before(shape):
    """predictions keeps one fit for the most T asked and answers shorter questions from it, and ``at`` answers
    for one T: every answer is the definition's, bit for bit, after any sequence of adds and questions (a T beyond
    every mean included)."""
    rng = random.Random(7)
    curve = CostCurve(shape)
    for _ in range(200):
        if rng.random() < 0.6:
            curve.add(rng.choice([1, 1, 1, 2, 3, 5, 9, 17, 40]), rng.uniform(0.002, 0.02))
        if not curve.empty:
            upto = rng.choice([1, 2, 6, 17, 33])
            if rng.random() < 0.5:  # one T alone, before or after the list
                assert curve.at(upto) == _reference_predictions(curve, upto)[-1]
            assert curve.predictions(upto) == _reference_predictions(curve, upto)
            assert curve.at(upto) == _reference_predictions(curve, upto)[-1]


def test_cost_curve_clips_outliers():
    curve = CostCurve()
    for _ in range(5):
        curve.add(1, 1.0)
    curve.add(1, 100.0)  # another process stole the CPU for this step
    assert curve.mean[1] < 1.5


def _primed(rate: float, base: float, slope: float, draft: float, positions: int = 16) -> CostSchedule:
    """A cost schedule whose estimates are a constant acceptance rate and a linear cost curve."""
    schedule = CostSchedule(4, positions)
    schedule.profile.tried = [1e6] * positions
    schedule.profile.hits = [1e6 * rate] * positions
    for tokens in range(1, positions + 2):
        for _ in range(10):
            schedule.curve.add(tokens, base + slope * (tokens - 1))
    schedule.draft_seconds = draft
    return schedule


def _brute_force(rate: float, base: float, slope: float, draft: float, positions: int = 16) -> int:
    def speed(k):
        return (1 + sum(rate**j for j in range(1, k + 1))) / (base + (slope + draft) * k)

    return max(range(positions + 1), key=speed)


@pytest.mark.parametrize(
    "rate,base,slope,draft",
    [(0.5, 1.0, 0.1, 0.0), (0.8, 1.0, 0.1, 0.0), (0.9, 1.0, 0.05, 0.1), (0.6, 1.0, 0.2, 0.3), (0.95, 1.0, 0.0, 0.0)],
)
def test_cost_schedule_maximises_tokens_per_second(rate, base, slope, draft):
    chosen = _primed(rate, base, slope, draft).best_length()
    assert chosen == _brute_force(rate, base, slope, draft)


def test_cost_schedule_extremes():
    assert _primed(0.95, 1.0, 0.0, 0.0).best_length() == 16  # free tokens, nearly always accepted: the ceiling
    assert _primed(0.1, 1.0, 0.3, 0.2).best_length() == 0  # drafting does not pay: plain decoding
    assert _primed(0.5, 1.0, 0.1, 0.0).best_length() == 2  # (1 + .5 + .25) / 1.2 beats k = 1 and k = 3


def test_cost_schedule_learns_from_its_own_timing(clock):
    """A cheap verifier and drafts that are always accepted: the draft grows to the ceiling."""
    schedule = make_schedule("cost", 3, 12)
    for _ in range(40):
        n = schedule.length()
        schedule.proposed(n)
        clock.now += 1.0 + 0.01 * n  # the step's forward pass
        schedule.update(n)
    assert schedule.length() == 12


def test_cost_schedule_times_a_step_drafted_elsewhere_apart_from_the_step_before(clock):
    """A head step (1 draft token), then a copy of 4 tokens verified in the next step: the curve gets each step's
    own time at its own width; without ``drafted_elsewhere`` the head step was timed as both (2.2 s at 2 rows)."""
    schedule = make_schedule("cost", 1, 4)
    for _ in range(3):
        assert schedule.length() >= 0
        schedule.proposed(1)
        clock.now += 1.0  # the head step's forward over 2 rows
        schedule.update(1)
        schedule.drafted_elsewhere(4)
        clock.now += 1.2  # the copy's forward over 5 rows
    schedule.length()
    assert schedule.curve.mean == {2: pytest.approx(1.0), 5: pytest.approx(1.2)}
    assert schedule.curve.count == {2: 3, 5: 3}
    fixed = make_schedule("fixed", 1, 4)
    fixed.drafted_elsewhere(4)  # other schedules time nothing
    assert fixed.length() == 1


def test_a_cut_of_drafted_tokens_counts_their_verify_time_only(clock):
    """Drafted tokens' drafting time is spent: ``best_prefix`` keeps a token whose chance pays for its row, where
    ``planned`` (would drafting it pay at all) also counts the drafting time; time a drafter reports as
    ``not_drafting`` (a head catching up on committed pairs) stays out of the price per drafted token."""
    schedule = _primed(0.3, 1.0, 0.1, 0.5)  # a row costs 0.1, drafting a token 0.5
    assert schedule.best_prefix([0.3]) == 1  # (1 + 0.3) / 1.1 beats 1 / 1.0
    assert schedule.planned([0.3]) == 0  # (1 + 0.3) / 1.6 does not
    assert schedule.best_prefix([0.05]) == 0  # (1 + 0.05) / 1.1 does not pay its row
    fresh = make_schedule("cost", 1, 4)
    fresh.length()
    clock.now += 5.0  # feeding the prompt's pairs
    fresh.not_drafting(5.0)
    clock.now += 0.4  # one draft token
    fresh.proposed(1)
    assert fresh.draft_seconds == pytest.approx(0.4)


def test_a_head_drafters_copy_step_is_timed_as_its_own_step(monkeypatch):
    """``HeadDrafter.propose`` tells the schedule when the step verifies a copy instead of the head's draft."""
    from paradecode.drafters.head_drafter import HeadDrafter

    calls = []

    class Schedule:
        def drafted_elsewhere(self, drafted):
            calls.append(drafted)

    drafter = HeadDrafter.__new__(HeadDrafter)
    drafter.schedule = Schedule()
    monkeypatch.setattr(HeadDrafter, "copy_draft", lambda self, state: Proposal(tokens=[5, 6, 7]))
    assert drafter.propose(None).tokens == [5, 6, 7] and calls == [3]
    monkeypatch.setattr(HeadDrafter, "copy_draft", lambda self, state: None)
    monkeypatch.setattr(HeadDrafter, "head_draft", lambda self, state: Proposal(tokens=[9]))
    assert drafter.propose(None).tokens == [9] and calls == [3]


def test_cost_schedule_stops_drafting_when_it_does_not_pay_and_probes_less_and_less(clock):
    schedule = make_schedule("cost", 3, 12)
    lengths = []
    for _ in range(200):
        n = schedule.length()
        lengths.append(n)
        clock.now += 0.5 * n  # drafting is expensive
        schedule.proposed(n)
        clock.now += 1.0 + 0.3 * n  # so is verifying
        schedule.update(0)  # and nothing is accepted
    probes = [i for i, n in enumerate(lengths) if i > 0 and n > 0]
    assert all(lengths[i] == 1 for i in probes)  # a probe is one token
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) >= 3 and gaps == sorted(gaps) and gaps[-1] >= 4 * FIRST_PROBE  # each wait doubles


@pytest.mark.parametrize("method", ["pld", "ngram", "layerskip", "draft"])
def test_schedule_options_are_validated(method):
    extra = {"draft_model": "x"} if method == "draft" else {}
    cls = get_method(method)
    with pytest.raises(ParadecodeError, match="schedule"):
        cls.create({"schedule": "sometimes", **extra})
    with pytest.raises(ParadecodeError, match="max_num_draft"):
        cls.create({"num_draft": 8, "max_num_draft": 4, **extra})


def test_cost_schedule_cuts_a_scored_draft_where_tokens_per_second_peak():
    schedule = _primed(0.5, 1.0, 0.1, 0.0)
    chances = [0.9, 0.8, 0.3, 0.1, 0.05]  # the drafter's chance that its first 1, 2, ... tokens all pass
    # tokens per second: k=2: 2.7 / 1.2 = 2.25, k=3: 3.0 / 1.3 = 2.31, k=4: 3.1 / 1.4 = 2.21
    assert schedule.best_prefix(chances) == 3
    assert _primed(0.5, 1.0, 0.5, 0.0).best_prefix(chances) == 2  # a steeper cost curve keeps fewer
    assert make_schedule("fixed", 4, 16).best_prefix(chances) == 5  # other schedules keep what was drafted
    assert schedule.candidates() == 16  # the chances decide, up to the ceiling


def _brute_force_under_load(rate: float, base: float, slope: float, draft: float, rows: float, tokens: float,
                            positions: int = 16) -> int:
    """The k that maximises the whole pass's tokens per second: the others' R rows and A tokens plus this request's."""
    def speed(k):
        return (tokens + 1 + sum(rate**j for j in range(1, k + 1))) / (base + slope * (rows + k) + draft * k)

    return max(range(positions + 1), key=speed)


@pytest.mark.parametrize("rows,tokens", [(0.0, 0.0), (3.0, 4.0), (15.0, 20.0), (40.0, 45.0)])
@pytest.mark.parametrize("rate,slope", [(0.8, 0.05), (0.9, 0.02), (0.6, 0.1)])
def test_cost_schedule_under_load_maximises_the_pass_tokens_per_second(rate, slope, rows, tokens):
    """Its own steps ran in passes of R + 1 + k rows: the schedule recovers the one-row cost and prices the pass."""
    load = Load(rows=rows, tokens=tokens)
    schedule = CostSchedule(4, 16, load=lambda: load)
    schedule.profile.tried = [1e6] * 16
    schedule.profile.hits = [1e6 * rate] * 16
    for own in range(1, 18):  # what the request measured: the shared pass's time at its own row counts
        for _ in range(10):
            schedule.curve.add(own, 1.0 + slope * (rows + own - 1))
    schedule.draft_seconds = 0.0
    assert schedule.best_length() == _brute_force_under_load(rate, 1.0, slope, 0.0, rows, tokens)


def test_cost_schedule_drafts_less_as_the_pass_fills():
    """A request that drafts 6+ tokens alone drafts fewer as others fill the pass, and none in a full one."""
    lengths = []
    for others in (0, 2, 8, 32, 128):
        load = Load(rows=others * 1.5, tokens=others * 1.3)
        schedule = _primed(0.75, 1.0, 0.04, 0.0)
        schedule.load = lambda load=load: load
        lengths.append(schedule.best_length())
    assert lengths[0] >= 6 and lengths == sorted(lengths, reverse=True) and lengths[-1] == 0, lengths
    alone = _primed(0.75, 1.0, 0.04, 0.0)
    alone.load = Load  # no others: the rule for a request alone, unchanged
    assert alone.best_length() == _primed(0.75, 1.0, 0.04, 0.0).best_length() == lengths[0]


def test_make_schedule_reads_the_load_from_the_decode_state():
    state = DecodeState(tokens=[1], prompt_len=1, sampling=SamplingConfig(), rng=torch.Generator(), max_draft=8,
                        load=lambda: Load(rows=100.0, tokens=90.0))
    schedule = make_schedule("cost", 3, 12, state)
    assert schedule.load().rows == 100.0
    assert make_schedule("cost", 3, 12).load is None


def test_cost_schedule_under_load_prices_the_pass_by_the_measured_shape():
    """With a measured curve (relative cost by total rows), steps timed in shared passes of R + 1 + k rows give
    the one-row cost back, and each k is priced at R + 1 + k rows of that curve."""
    shape = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.5, 16: 2.4, 32: 4.2, 64: 7.8}
    for rows, tokens in [(6.0, 7.0), (20.0, 26.0), (50.0, 60.0)]:
        load = Load(rows=rows, tokens=tokens)
        schedule = CostSchedule(4, 12, shape=shape, load=lambda load=load: load)
        schedule.profile.tried = [1e6] * 12
        schedule.profile.hits = [1e6 * 0.85] * 12
        for own in range(1, 14):
            for _ in range(10):
                schedule.curve.add(own, 0.004 * schedule.curve.shape_at(rows + own))
        schedule.draft_seconds = 0.0

        def speed(k, rows=rows, tokens=tokens):
            return (tokens + 1 + sum(0.85**j for j in range(1, k + 1))) / schedule.curve.shape_at(rows + 1 + k)

        assert schedule.best_length() == max(range(13), key=speed)


def test_under_load_the_measured_shape_decides_before_any_step_is_timed():
    """A request's first step in a full pass: with a measured curve the shape alone decides (a full-length first
    draft would slow every request in the pass); alone, or without a curve, the first step drafts ``num_draft``."""
    shape = {1: 1.0, 2: 1.1, 4: 1.3, 8: 2.3, 16: 4.5}
    full = CostSchedule(8, 16, shape=shape, load=lambda: Load(rows=15.0, tokens=15.0))
    assert full.curve.empty and full.length() == 0
    assert CostSchedule(8, 16, shape=shape, load=Load).length() == 8  # alone: the base schedule's first draft
    assert CostSchedule(8, 16, load=lambda: Load(rows=15.0, tokens=15.0)).length() == 8  # nothing measured
    light = CostSchedule(8, 16, shape=shape, load=lambda: Load(rows=1.0, tokens=1.0))
    assert light.best_prefix([0.95, 0.9, 0.85]) == 3  # a sure draft in a light pass still pays
