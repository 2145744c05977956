"""`auto`: lossless whatever it picks, reports its choices, and picks the faster drafter when one clearly is.

The choice depends on measured time, so the "picks the better one" tests make the difference large and
deterministic in kind: a backend whose forward pass sleeps (so tokens per forward decide), or a candidate
that sleeps while drafting (so drafting cost decides).
"""

import dataclasses
import json
import time

import pytest
import torch

from paradecode.drafters import auto as auto_module
from paradecode import kept as kept_module
from paradecode.config import SamplingConfig
from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.pld_tree import PromptLookupTreeDrafter
from paradecode.drafters.tree import tree_parents
from paradecode.registry import get_method, method_names
from paradecode.verify.base import Verdict
from tiny import PROMPTS, ChainOnly, run, tiny_backend

EVERY_ARM = "ar,pld,pld-tree,ngram,lookahead,jacobi,layerskip"  # every training-free method


@pytest.mark.parametrize("seed", range(2))
def test_auto_greedy_equals_autoregressive(seed):
    backend = tiny_backend(seed, sharp=4.0)
    for prompt in PROMPTS:
        for max_new in (1, 7, 40):
            expected, _ = run(backend, "ar", prompt, max_new_tokens=max_new)
            for candidates in ("", EVERY_ARM):  # the default arms, and every training-free method in play
                got, stats = run(backend, "auto", prompt, max_new_tokens=max_new, candidates=candidates)
                assert got == expected, (seed, prompt, max_new, candidates)
                assert stats.new_tokens == max_new


def test_auto_eos_stop_strings_and_chain_only_backends_like_autoregressive():
    for seed in range(2):
        backend = tiny_backend(seed, sharp=4.0)
        reference, _ = run(backend, "ar", PROMPTS[2], max_new_tokens=30)
        for eos_at in (0, 3, 11):
            expected, _ = run(backend, "ar", PROMPTS[2], max_new_tokens=30, eos_ids=[reference[eos_at]])
            got, stats = run(backend, "auto", PROMPTS[2], max_new_tokens=30, eos_ids=[reference[eos_at]])
            assert got == expected and stats.stop_reason == "eos"
        stop = f"t{reference[9]} t{reference[10]} "
        expected, _ = run(backend, "ar", PROMPTS[2], max_new_tokens=30, stop=[stop])
        got, stats = run(backend, "auto", PROMPTS[2], max_new_tokens=30, stop=[stop])
        assert got == expected and stats.stop_reason == "stop"
        expected, _ = run(backend, "ar", PROMPTS[0], max_new_tokens=40)
        got, stats = run(ChainOnly(backend), "auto", PROMPTS[0], max_new_tokens=40)
        assert got == expected and all(s.parents is None for s in stats.steps)


def test_auto_reports_its_choices():
    backend = tiny_backend(1, sharp=4.0)
    _, stats = run(backend, "auto", PROMPTS[1], max_new_tokens=20)
    report = stats.info["auto"]
    default = {n for n in method_names() if n in auto_module.DEFAULT_CANDIDATES
               or getattr(get_method(n), "training_free", False)}
    assert set(report["candidates"]) == default and {"ar", "pld", "ngram"} <= default
    assert "draft" in report["skipped"] and "draft-tree" in report["skipped"]  # no draft model given
    _, stats = run(backend, "auto", PROMPTS[1], max_new_tokens=60, candidates=EVERY_ARM)
    report = stats.info["auto"]
    candidates = report["candidates"]
    assert set(candidates) == set(EVERY_ARM.split(","))
    assert report["choice"] in candidates
    assert sum(c["steps"] for c in candidates.values()) == stats.forward_passes
    assert sum(c["tokens"] for c in candidates.values()) == stats.new_tokens
    for step in stats.steps:
        assert step.info["auto"] in candidates
        assert step.info["auto_reason"] in ("warmup", "best", "explore", "fallback")
    warmup = [s.info["auto"] for s in stats.steps if s.info["auto_reason"] == "warmup"]
    peekable = {"ar", "pld", "pld-tree", "ngram"}
    # an arm that cannot be peeked at gets one warm-up step (the default); a peekable one is measured by its
    # peeks (a warm-up step only while none of them has been scored)
    assert sorted(n for n in warmup if n not in peekable) == sorted(set(candidates) - peekable)
    assert all(warmup.count(n) <= 1 for n in peekable)
    assert all(candidates[n]["peeks"] + candidates[n]["steps"] > 0 for n in peekable)  # each measured
    assert sum(candidates[n]["peeks"] for n in peekable) > 0


def test_peeked_drafts_are_scored_by_what_greedy_verification_would_accept():
    def peek(tokens, parents):
        return auto_module._Peek("x", 0, Proposal(tokens=tokens, parents=tree_parents(parents)), 0.0)

    chain = peek([5, 6, 7], [-1, 0, 1])
    assert auto_module._accepted(chain, [5, 6, 9]) == 2
    assert auto_module._accepted(chain, [4]) == 0  # the first token already differs
    assert auto_module._accepted(chain, [5, 6]) is None  # the third token's turn has not come
    assert auto_module._accepted(chain, [5, 6, 7]) == 3
    assert auto_module._accepted(peek([], []), []) == 0  # ar
    # a tree: 5 -> (6 -> 7 | 8), and 9 at the root
    tree = peek([5, 9, 6, 8, 7], [-1, -1, 0, 0, 2])
    assert auto_module._accepted(tree, [5, 8, 1]) == 2
    assert auto_module._accepted(tree, [5, 6, 7]) == 3
    assert auto_module._accepted(tree, [9, 1]) == 1
    assert auto_module._accepted(tree, [5, 6]) is None  # node 7 may match next
    assert auto_module._accepted(tree, [5, 4]) == 1


@pytest.mark.parametrize("name", ["pld", "ngram", "pld-tree", "ar"])
def test_a_peek_changes_nothing_the_drafter_proposes_after_it(monkeypatch, name):
    """Peeking before every step leaves every proposal as it was; the peek is the proposal (a schedule that
    does not time the machine, so the two runs are comparable step by step)."""
    options = {} if name in ("pld-tree", "ar") else {"schedule": "heuristic"}
    backend = tiny_backend(1, sharp=4.0)
    plain, plain_stats = run(backend, name, PROMPTS[1], max_new_tokens=50, **options)
    cls = get_method(name)
    propose, peeked = cls.propose, []

    def peek_then_propose(self, state):
        seen = self.peek(state)
        proposal = propose(self, state)
        probe = (seen.info or {}).get("probe")  # a longer chain the drafter learns from, starting with the draft
        peeked.append(seen.tokens == proposal.tokens and seen.parents == proposal.parents
                      and (probe is None or probe.tokens[: len(seen.tokens)] == seen.tokens))
        return proposal

    monkeypatch.setattr(cls, "propose", peek_then_propose)
    got, stats = run(backend, name, PROMPTS[1], max_new_tokens=50, **options)
    assert got == plain
    assert [s.drafted for s in stats.steps] == [s.drafted for s in plain_stats.steps]
    assert peeked and all(peeked)
    if name != "ar":
        assert any(s.drafted for s in stats.steps)  # the comparison covered real drafts


def test_a_peeks_probe_teaches_the_arm_while_its_estimate_counts_what_it_would_propose(monkeypatch):
    """An arm that drafts nothing by choice still learns from its peeks: their probes are judged (else an arm whose
    estimates fell once never drafted again inside auto, since a draft of nothing teaches nothing)."""
    drafter = started({"candidates": "ar,pld"}, {})
    arm, taught = drafter.arms["pld"], []
    probe = Proposal(tokens=[7, 8, 9])
    monkeypatch.setattr(arm.drafter, "peek", lambda state: Proposal(tokens=[], info={"probe": probe}))
    monkeypatch.setattr(arm.drafter, "peeked", lambda proposal, accepted: taught.append((proposal.tokens, accepted)))
    state = DecodeState(tokens=[2, 3, 4], prompt_len=3, sampling=SamplingConfig(), rng=torch.Generator(), max_draft=8)
    drafter._peek(state, "ar")
    state.tokens += [7, 8]
    drafter._score_peeks(state, [0.01] * 8)
    assert taught == [] and len(drafter.peeks) == 1  # the probe's third token has not had its turn
    state.tokens += [5]
    drafter._score_peeks(state, [0.01] * 8)
    assert taught == [([7, 8, 9], 2)] and not drafter.peeks
    assert arm.peeks == 1 and arm.estimate.discounted_tokens == pytest.approx(1.0)  # no draft: one token a step


def test_auto_with_a_draft_model_tries_the_draft_methods_and_stays_lossless():
    backend = tiny_backend(2, sharp=4.0)
    expected, _ = run(backend, "ar", PROMPTS[0], max_new_tokens=40)
    got, stats = run(backend, "auto", PROMPTS[0], max_new_tokens=40, draft_backend=tiny_backend(2, sharp=4.0),
                     candidates="ar,draft,draft-tree")
    assert got == expected
    assert set(stats.info["auto"]["candidates"]) == {"ar", "draft", "draft-tree"}
    assert stats.draft_forward_passes > 0


def test_auto_samples_with_the_candidates_that_keep_the_random_stream():
    backend = tiny_backend(3)
    out, stats = run(backend, "auto", PROMPTS[0], max_new_tokens=40, temperature=0.8, seed=5,
                     draft_backend=tiny_backend(4), candidates="ar,pld-tree,draft-tree")
    assert len(out) == 40 and sum(c["steps"] for c in stats.info["auto"]["candidates"].values()) == len(stats.steps)
    assert stats.info["auto"]["skipped"] == {"draft-tree": "draws its drafts at random"}


@pytest.mark.parametrize("seed", range(3))
def test_auto_under_sampling_gives_the_text_ar_gives_with_the_same_seed(seed):
    """Whatever arms the timings pick, each emitted token is one draw from p in turn, as plain decoding draws."""
    backend = tiny_backend(0, sharp=1.5)  # soft logits: many rejections
    prompt = PROMPTS[seed % len(PROMPTS)]
    expected, _ = run(backend, "ar", prompt, max_new_tokens=48, temperature=0.9, seed=seed)
    for exploration in (0.0, 5.0):  # two quite different sequences of arms
        got, stats = run(backend, "auto", prompt, max_new_tokens=48, temperature=0.9, seed=seed,
                         exploration=exploration)
        assert got == expected
        assert len({s.info["auto"] for s in stats.steps}) > 1


class SlowForward:
    """A target whose every forward pass takes at least ``seconds`` (a memory-bound model: cost per pass)."""

    def __init__(self, inner, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.inner.forward(*args, **kwargs)
        time.sleep(max(0.0, self.seconds - (time.perf_counter() - start)))
        return out


def test_auto_picks_the_drafter_with_more_tokens_per_forward_when_forwards_cost_the_time():
    backend = SlowForward(tiny_backend(1, sharp=4.0), seconds=0.03)  # pld: ~3.6 tokens per forward here; the
    # padded forward time (30 ms) dwarfs what a loaded machine adds to the tiny model's own compute
    expected, _ = run(backend, "ar", PROMPTS[1], max_new_tokens=80)
    got, stats = run(backend, "auto", PROMPTS[1], max_new_tokens=80, candidates="ar,pld")
    assert got == expected
    report = stats.info["auto"]
    assert report["choice"] == "pld"
    late = [s.info["auto"] for s in stats.steps[-10:]]  # the text repeats once it is under way
    assert late.count("pld") >= 8


class _SlowDrafter(PromptLookupTreeDrafter):
    """The same drafts as pld-tree, 15 ms late."""

    def propose(self, state):
        time.sleep(0.015)
        return super().propose(state)


@pytest.mark.parametrize("order", ["slow,fast", "fast,slow"])
def test_auto_picks_the_cheaper_drafter_when_drafts_are_the_same(monkeypatch, order):
    fakes = {"slow": _SlowDrafter, "fast": type("_FastDrafter", (PromptLookupTreeDrafter,), {})}
    monkeypatch.setattr(auto_module, "get_method", lambda name: fakes.get(name) or get_method(name))
    backend = tiny_backend(1, sharp=4.0)
    expected, _ = run(backend, "ar", PROMPTS[0], max_new_tokens=60)
    got, stats = run(backend, "auto", PROMPTS[0], max_new_tokens=60, candidates=order)
    assert got == expected
    report = stats.info["auto"]
    assert report["choice"] == "fast"
    assert report["candidates"]["fast"]["steps"] > 2 * report["candidates"]["slow"]["steps"]


class _CatchingUpDrafter(PromptLookupTreeDrafter):
    """pld-tree's drafts 30 ms late, the 30 ms spent catching up on text it did not draft (``foreign_seconds``)."""

    def propose(self, state):
        start = time.perf_counter()
        while time.perf_counter() - start < 0.03:  # busy, as a head's pass is (a sleep leaves the caches cold)
            pass
        self.foreign_seconds = time.perf_counter() - start
        return super().propose(state)


def test_an_arms_catch_up_on_text_it_did_not_draft_is_left_out_of_its_rate(monkeypatch):
    """Two arms with the same drafts, one of them late (30 ms, or 15 ms of sleep): where the time is catch-up (a head
    feeding the pairs of other arms' steps), auto counts its steps about as long as the other's (a tiny model's steps
    take ~1 ms); where it is the arm's own, many times as long."""
    rates = {}
    backend = tiny_backend(1, sharp=4.0)
    run(backend, "pld-tree", PROMPTS[0], max_new_tokens=60)  # the first passes' one-time costs
    for slow in (_CatchingUpDrafter, _SlowDrafter):
        fakes = {"slow": slow, "fast": type("_FastDrafter", (PromptLookupTreeDrafter,), {})}
        monkeypatch.setattr(auto_module, "get_method", lambda name: fakes.get(name) or get_method(name))
        _, stats = run(backend, "auto", PROMPTS[0], max_new_tokens=60, candidates="fast,slow", exploration=0.0,
                       warmup=4)
        arms = stats.info["auto"]["candidates"]
        per_step = {name: arms[name]["time_s"] / arms[name]["steps"] for name in ("slow", "fast")}
        rates[slow] = per_step["slow"] / per_step["fast"]  # the time of a step, as auto counts it
    assert rates[_CatchingUpDrafter] < 6 and rates[_SlowDrafter] > 10


def started(options: dict, estimates: dict) -> "auto_module.AutoDrafter":
    """An auto drafter that begins a request with ``estimates`` kept from earlier ones."""
    drafter = get_method("auto").create(dict(options, persist=False))
    store = {("auto", drafter.options): {"estimates": estimates}}
    state = DecodeState(tokens=[2, 3, 4], prompt_len=3, sampling=SamplingConfig(), rng=torch.Generator(),
                        max_draft=8, method_state=store)
    drafter.begin(state)
    return drafter


def rated(rate: float) -> "auto_module._Estimate":
    return auto_module._Estimate(discounted_tokens=rate, discounted_seconds=1.0, steps=100)


@pytest.mark.parametrize("pld_rate, choice", [(102.0, "ar"), (98.0, "ar"), (104.0, "pld")])
def test_plain_decoding_wins_unless_a_drafter_beats_it_by_the_margin(pld_rate, choice):
    drafter = started({"candidates": "ar,pld", "exploration": 0.0}, {"ar": rated(100.0), "pld": rated(pld_rate)})
    assert drafter._choose() == (choice, "best")


@pytest.mark.parametrize("jacobi_rate, choice", [(102.0, "pld"), (104.0, "jacobi")])
def test_an_arm_that_cannot_be_peeked_at_must_beat_the_peeked_ones_by_the_margin(jacobi_rate, choice):
    drafter = started({"candidates": "pld,jacobi", "exploration": 0.0},
                      {"pld": rated(100.0), "jacobi": rated(jacobi_rate)})
    assert drafter.arms["pld"].peekable and not drafter.arms["jacobi"].peekable
    assert drafter._choose() == (choice, "best")


@pytest.mark.parametrize("greedy", [True, False])
def test_only_an_arm_no_peek_measures_gets_the_exploration_bonus(greedy):
    """pld rated just under plain decoding, on few measurements: its peeks measure it on the same text, so greedy
    decoding never gives it a step to explore (each such step drafted where nothing paid); under sampling, where
    nothing is peeked at, the bonus tries it; jacobi, which cannot be peeked at, is tried either way."""
    def estimate(rate: float, steps: int) -> "auto_module._Estimate":
        return auto_module._Estimate(discounted_tokens=rate, discounted_seconds=1.0, steps=steps)

    sampling = SamplingConfig() if greedy else SamplingConfig(temperature=0.8)
    for candidates, other in (("ar,pld", "pld"), ("ar,jacobi", "jacobi")):
        drafter = get_method("auto").create(dict(candidates=candidates, persist=False))
        store = {("auto", drafter.options): {"estimates": {"ar": estimate(100.0, 400), other: estimate(97.0, 8)}}}
        drafter.begin(DecodeState(tokens=[2, 3, 4], prompt_len=3, sampling=sampling, rng=torch.Generator(),
                                  max_draft=8, method_state=store))
        explored = other == "jacobi" or not greedy
        assert drafter._choose() == ((other, "explore") if explored else ("ar", "best"))


@pytest.mark.parametrize("retry_every", [0, 5])
def test_an_arm_that_cannot_be_peeked_at_is_retried_after_retry_every_steps_without_one(retry_every):
    """jacobi rated far below pld on many steps (the UCB bonus is nothing by then): a rate measured on other text
    is only proven wrong by a step, so after ``retry_every`` steps without one it gets a step; then it waits again."""
    drafter = started({"candidates": "pld,jacobi", "exploration": 0.25, "retry_every": retry_every},
                      {"pld": rated(100.0), "jacobi": rated(50.0)})
    chosen = []
    for step in range(12):
        name, reason = drafter._choose()
        chosen.append(reason if name == "jacobi" else name)
        arm = drafter.arms[name]
        arm.last_step = drafter.steps_taken  # what observe records of the step
        drafter.steps_taken += 1
    assert chosen == ["pld"] * 12 if not retry_every else \
        ["pld"] * 5 + ["retry"] + ["pld"] * 4 + ["retry"] + ["pld"]


@pytest.mark.parametrize("laggard, peeked_rounds", [(0.0, 8), (0.85, 2)])
def test_every_peekable_arm_is_peeked_at_every_round_unless_a_laggard_share_is_set(laggard, peeked_rounds):
    """A slow-rated arm needs its peeks most (its draft length comes from them): by default it gets every round."""
    drafter = started({"candidates": "ar,pld,ngram", "laggard": laggard},
                      {"ar": rated(100.0), "pld": rated(200.0), "ngram": rated(50.0)})
    state = DecodeState(tokens=[2, 3, 4, 2, 3], prompt_len=3, sampling=SamplingConfig(), rng=torch.Generator(),
                        max_draft=8)
    for _ in range(8):
        drafter._peek(state, "pld")
    assert sum(peek.arm == "ngram" for peek in drafter.peeks) == peeked_rounds
    assert sum(peek.arm == "ar" for peek in drafter.peeks) == peeked_rounds  # also under 0.85 x pld's rate
    assert not any(peek.arm == "pld" for peek in drafter.peeks)  # the chosen arm runs, it is not peeked at


@pytest.mark.parametrize("keep, others, period", [(True, None, 4), (True, 0, 4), (True, 3, 16), (False, 3, 4)])
def test_requests_that_share_passes_and_estimates_take_turns_at_the_peeks(keep, others, period):
    """Requests decoding together (their passes shared, ``DecodeState.load``) share the kept estimates too, and their
    steps run one after another between passes: each peeks every probe_every x (1 + the others) steps, so together
    they still give the estimates a round every probe_every passes. A request that keeps no estimates peeks as
    often as alone."""
    from paradecode.backends.base import Load

    drafter = started({"candidates": "ar,pld,ngram", "keep": keep}, {})
    load = None if others is None else (lambda: Load(rows=float(others), tokens=float(others), requests=others))
    state = DecodeState(tokens=[2, 3, 4, 2, 3, 4, 2, 3], prompt_len=3, sampling=SamplingConfig(),
                        rng=torch.Generator(), max_draft=8, load=load)
    assert drafter._probe_period(state) == period
    for _ in range(2 * period):
        drafter.propose(state)
        drafter.steps_taken += 1  # what observe counts
    assert drafter.peek_rounds == 2


def test_a_request_starts_from_a_share_of_the_kept_weight():
    kept = auto_module._Estimate(discounted_tokens=40.0, discounted_seconds=0.25, steps=30)
    drafter = started({"candidates": "ar,pld"}, {"ar": kept, "pld": auto_module._Estimate(8.0, 0.1, steps=4)})
    assert drafter.arms["ar"].estimate is kept
    carry = auto_module.AutoOptions().carry
    assert 0 < carry < 1
    assert kept.discounted_tokens == pytest.approx(40.0 * carry)  # a share of the weight, the same rate
    assert kept.rate == pytest.approx(160.0) and kept.steps == 30


def test_a_scored_peek_costs_its_drafting_a_fitted_step_over_its_rows_and_its_arms_excess():
    drafter = started({"candidates": "ar,pld"}, {})
    for _ in range(5):
        drafter.curve.add(1, 0.010)
        drafter.curve.add(3, 0.013)
    pld = drafter.arms["pld"].estimate
    pld.excess_sum, pld.excess_weight = 3.0, 10.0  # pld's own steps took 20% longer than the curve
    assert pld.excess == pytest.approx(3.0 / (10.0 + auto_module.EXCESS_PRIOR))
    drafter.peeks = [auto_module._Peek("pld", 3, Proposal(tokens=[7, 8]), seconds=0.001)]
    state = DecodeState(tokens=[2, 3, 4, 7, 9], prompt_len=3, sampling=SamplingConfig(), rng=torch.Generator(),
                        max_draft=8)
    drafter._score_peeks(state, drafter.curve.predictions(3))  # the text after position 3 is 7, 9: one draft token accepted, then the bonus
    assert drafter.peeks == [] and drafter.arms["pld"].peeks == 1
    assert pld.discounted_tokens == 2 and pld.steps == 1
    assert pld.discounted_seconds == pytest.approx(0.001 + drafter.curve.predictions(3)[-1] * 1.2)
    assert drafter.curve.predictions(3)[-1] == pytest.approx(0.013, rel=0.1)


def test_an_arms_excess_is_what_its_own_steps_take_beyond_the_fitted_curve(monkeypatch):
    drafter = started({"candidates": "ar,pld-tree"}, {})
    for _ in range(10):
        drafter.curve.add(3, 0.010)
    ticks = iter([0.0, 0.0, 0.016])  # propose: start, drafted; observe: end (16 ms against a 10 ms step)
    monkeypatch.setattr(auto_module.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr(drafter, "_choose", lambda: ("pld-tree", "best"))
    drafter.probing = False
    arm = drafter.arms["pld-tree"]
    monkeypatch.setattr(arm.drafter, "propose", lambda state: Proposal(tokens=[7, 8], parents=[-1, -1]))
    state = DecodeState(tokens=[2, 3, 4], prompt_len=3, sampling=SamplingConfig(), rng=torch.Generator(),
                        max_draft=8)
    drafter.propose(state)
    state.tokens.append(5)
    drafter.observe(state, Verdict([], [], next_token=5, bonus=False, committed_tokens=[5]))
    assert arm.estimate.excess_weight == 1  # one sample, against a prior of none worth EXCESS_PRIOR steps
    share = 0.016 / drafter.curve.predictions(3)[-1] - 1
    assert share == pytest.approx(0.6, abs=0.15)  # the step also moved the curve a little
    assert arm.estimate.excess == pytest.approx(share / (1 + auto_module.EXCESS_PRIOR), abs=1e-9)
    for _ in range(400):  # the arm does not run for a few hundred steps: its excess fades back to none
        arm.estimate.excess_sum *= drafter.options.decay
        arm.estimate.excess_weight *= drafter.options.decay
    assert abs(arm.estimate.excess) < 0.25 * share / (1 + auto_module.EXCESS_PRIOR)


def test_a_preempted_step_counts_as_a_few_modelled_steps_whatever_the_arm_did_before(monkeypatch):
    """A step that took 1 s (the process was descheduled) against a fitted 10 ms: it counts as at most OUTLIER
    times its drafting plus the fitted step, and its sample of the arm's excess is at most one fitted step, worth
    one step against the prior's EXCESS_PRIOR. (The bound was the arm's fastest step ever: for a new arm that is
    this step, counted in full; and an excess set outright by a first slow step priced every later peek of an arm
    that seldom runs, such as plain decoding.)"""
    drafter = started({"candidates": "ar,pld"}, {})
    for _ in range(10):
        drafter.curve.add(1, 0.010)
    ticks = iter([0.0, 0.001, 1.001])  # propose: start, drafted (1 ms); observe: end
    monkeypatch.setattr(auto_module.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr(drafter, "_choose", lambda: ("ar", "best"))
    drafter.probing = False
    state = DecodeState(tokens=[2, 3, 4], prompt_len=3, sampling=SamplingConfig(), rng=torch.Generator(),
                        max_draft=8)
    drafter.propose(state)
    state.tokens.append(5)
    drafter.observe(state, Verdict([], [], next_token=5, bonus=False, committed_tokens=[5]))
    ar = drafter.arms["ar"]
    assert ar.seconds == pytest.approx(1.001)  # the report keeps the raw time
    fitted = drafter.curve.predictions(1)[0]
    assert fitted < 0.04  # the curve's own clipping kept the step from moving it much
    assert ar.estimate.discounted_seconds <= auto_module.OUTLIER * (0.001 + fitted) + 1e-9
    assert 0 < ar.estimate.excess <= 1.0 / (1 + auto_module.EXCESS_PRIOR) + 1e-9


def test_bad_auto_options_are_clear_errors():
    from paradecode.errors import ParadecodeError

    for options, message in (({"margin": -0.1}, "margin must be >= 0"), ({"carry": 0}, "carry must be in"),
                             ({"probe_every": -1}, "probe_every must be >= 0"),
                             ({"laggard": 1.0}, "laggard must be in"),
                             ({"quiet_doublings": -1}, "quiet_doublings must be in"),
                             ({"retry_every": -1}, "retry_every must be >= 0")):
        with pytest.raises(ParadecodeError, match=message):
            get_method("auto").create(options)


def test_auto_rejects_bad_candidates():
    from paradecode.errors import ParadecodeError

    with pytest.raises(ParadecodeError, match="unknown method"):
        get_method("auto").create({"candidates": "ar,nope"})
    with pytest.raises(ParadecodeError, match="own candidate"):
        get_method("auto").create({"candidates": "ar,auto"})


# -- estimates kept across requests of one loaded model ------------------------------------------------------
class _Tokenizer:
    """Just enough tokenizer for a Model fed token ids."""

    chat_template = None
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"t{int(t)} " for t in ids)


def tiny_model(tmp_path, seed: int = 1):
    from paradecode.api import Model

    return Model(tiny_backend(seed, sharp=4.0), _Tokenizer(), name="tiny", model_dir=tmp_path, chat=False,
                 cache_dir=tmp_path / "cache")


def kept_estimates(model) -> dict:
    (key, kept), = model.method_state.items()
    assert key[0] == "auto"
    return {name: dataclasses.replace(e) for name, e in kept["estimates"].items()}  # copies


def test_auto_keeps_its_estimates_across_requests_of_one_model(tmp_path):
    model = tiny_model(tmp_path)
    reference = [model.generate(p, method="ar", max_new_tokens=30).token_ids for p in PROMPTS[:2]]
    first = model.generate(PROMPTS[0], method="auto", max_new_tokens=30)
    assert first.token_ids == reference[0] and first.stats.info["auto"]["warm"] is False
    after_first = kept_estimates(model)
    assert all(e.steps >= 1 and e.discounted_seconds > 0 for e in after_first.values())  # every arm warmed up

    second = model.generate(PROMPTS[1], method="auto", max_new_tokens=30)
    assert second.token_ids == reference[1]  # lossless, warm
    report = second.stats.info["auto"]
    assert report["warm"] is True
    assert all(s.info["auto_reason"] != "warmup" for s in second.stats.steps)  # no warm-up again
    # The second request went on from the first's numbers: each arm's count is the first's plus the second's
    # own steps and scored peeks of that arm
    after_second = kept_estimates(model)
    for name, before in after_first.items():
        own = report["candidates"][name]
        assert after_second[name].steps == before.steps + own["steps"] + own["peeks"]

    fresh = tiny_model(tmp_path)  # another loaded model: cold without the kept file
    again = fresh.generate(PROMPTS[1], method="auto", max_new_tokens=30, options=dict(persist=False))
    assert again.token_ids == reference[1] and again.stats.info["auto"]["warm"] is False
    assert any(s.info["auto_reason"] == "warmup" for s in again.stats.steps)


def test_auto_keep_false_starts_every_request_cold(tmp_path):
    model = tiny_model(tmp_path)
    for _ in range(2):
        result = model.generate(PROMPTS[0], method="auto", max_new_tokens=12, options=dict(keep=False))
        assert result.stats.info["auto"]["warm"] is False
    assert model.method_state == {}  # nothing stored
    model.generate(PROMPTS[0], method="auto", max_new_tokens=12, options=dict(candidates="ar,pld", persist=False))
    other = model.generate(PROMPTS[0], method="auto", max_new_tokens=12)
    assert other.stats.info["auto"]["warm"] is False  # other options: a store of their own
    assert sorted(key[1].candidates for key in model.method_state) == ["", "ar,pld"]


# -- estimates kept across processes, in the cache folder ---------------------------------------------------
def kept_file(model):
    (path,) = (model.cache_dir / "kept").glob("auto-*.json")
    return path


def test_a_fresh_process_starts_from_the_estimates_the_last_one_kept(tmp_path):
    first = tiny_model(tmp_path)
    cold = first.generate(PROMPTS[0], method="auto", max_new_tokens=30)
    assert cold.stats.info["auto"]["warm"] is False and cold.stats.info["auto"]["warm_from"] is None
    written = json.loads(kept_file(first).read_text())
    estimates = kept_estimates(first)
    assert written["identity"]["model"] == str(tmp_path.resolve()) and "machine" in written["identity"]
    assert written["payload"]["estimates"] == {name: dataclasses.asdict(e) for name, e in estimates.items()}

    later = tiny_model(tmp_path)  # a new Model, as a new process loads it: nothing in memory
    warm = later.generate(PROMPTS[0], method="auto", max_new_tokens=30)
    assert warm.token_ids == cold.token_ids  # lossless either way
    report = warm.stats.info["auto"]
    assert report["warm"] is True and report["warm_from"] == "cache"
    assert all(s.info["auto_reason"] != "warmup" for s in warm.stats.steps)
    assert set(kept_estimates(later)) == set(estimates)
    shares = [c["step_share"] for c in report["candidates"].values()]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    assert sum(c["token_share"] for c in report["candidates"].values()) == pytest.approx(1.0, abs=1e-3)
    again = later.generate(PROMPTS[1], method="auto", max_new_tokens=30)
    assert again.stats.info["auto"]["warm_from"] == "request"


@pytest.mark.parametrize("damage,reason", [
    (lambda kept: kept["identity"].update(machine="another CPU"), "measured with machine 'another CPU'"),
    (lambda kept: kept["identity"].update(dtype="bf16"), "measured with dtype 'bf16'"),
    (lambda kept: kept["payload"]["estimates"]["pld"].update(steps=-3), "estimate for 'pld' is not one"),
    (lambda kept: kept["payload"]["estimates"]["ar"].pop("excess_sum"), "estimate for 'ar' is not one"),
    (lambda kept: kept.update(version=99), f"not a version-{kept_module.VERSION} kept file"),
    ("truncated", "not valid JSON"),
])
def test_a_kept_file_that_cannot_be_used_is_ignored_with_a_warning_and_replaced(tmp_path, damage, reason):
    first = tiny_model(tmp_path)
    reference = first.generate(PROMPTS[0], method="auto", max_new_tokens=20).token_ids
    path = kept_file(first)
    if damage == "truncated":
        path.write_text(path.read_text()[:40])
    else:
        kept = json.loads(path.read_text())
        damage(kept)
        path.write_text(json.dumps(kept))
    later = tiny_model(tmp_path)
    with pytest.warns(UserWarning, match=reason):
        result = later.generate(PROMPTS[0], method="auto", max_new_tokens=20)
    assert result.token_ids == reference and result.stats.info["auto"]["warm"] is False
    assert any(s.info["auto_reason"] == "warmup" for s in result.stats.steps)
    identity = later.kept_file("auto", auto_module.AutoOptions()).identity
    assert json.loads(path.read_text())["identity"] == identity  # replaced, usable again
    assert tiny_model(tmp_path).generate(PROMPTS[0], method="auto", max_new_tokens=20).stats.info["auto"]["warm"]


def test_each_set_of_options_keeps_its_own_file(tmp_path):
    """Two option sets of auto on one model, as a benchmark's variants run them: neither replaces the other's."""
    model = tiny_model(tmp_path)
    model.generate(PROMPTS[0], method="auto", max_new_tokens=20)
    only_two = dict(candidates="ar,pld")
    model.generate(PROMPTS[0], method="auto", max_new_tokens=20, options=only_two)
    files = sorted((tmp_path / "cache" / "kept").glob("auto-*.json"))
    arms = sorted(sorted(json.loads(path.read_text())["payload"]["estimates"]) for path in files)
    assert len(files) == 2 and ["ar", "pld"] in arms and any(len(names) > 2 for names in arms)
    later = tiny_model(tmp_path)
    for options in ({}, only_two):
        result = later.generate(PROMPTS[0], method="auto", max_new_tokens=20, options=options)
        assert result.stats.info["auto"]["warm_from"] == "cache"


def test_persist_false_or_keep_false_writes_nothing(tmp_path):
    model = tiny_model(tmp_path)
    model.generate(PROMPTS[0], method="auto", max_new_tokens=12, options=dict(persist=False))
    model.generate(PROMPTS[0], method="auto", max_new_tokens=12, options=dict(keep=False))
    assert not (tmp_path / "cache" / "kept").exists()


def test_an_unwritable_cache_costs_only_the_warm_start(tmp_path):
    model = tiny_model(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kept").write_text("a file where the folder would go")
    with pytest.warns(UserWarning, match="could not keep measurements"):
        result = model.generate(PROMPTS[0], method="auto", max_new_tokens=12)
    assert len(result.token_ids) == 12


def test_auto_is_the_default_method_of_the_api_the_cli_and_the_server():
    import inspect

    from paradecode import arguments
    from paradecode.api import Model
    from paradecode.registry import DEFAULT_METHOD
    from paradecode.server.inputs import ServerDefaults, decoding_method

    assert DEFAULT_METHOD == "auto"
    assert inspect.signature(Model._start).parameters["method"].default == "auto"
    parser = __import__("argparse").ArgumentParser()
    arguments.add_decoding_arguments(parser)
    assert parser.parse_args([]).method == "auto"
    assert decoding_method(None, ServerDefaults(model_name="m"))[0] == "auto"


def test_concurrent_requests_of_one_process_keep_the_file_without_a_warning(tmp_path):
    """Batched requests each end by writing the kept file; each writes its own temporary file (a shared one was
    renamed away under another thread: "could not keep measurements ... No such file or directory")."""
    import threading
    import warnings

    from paradecode.kept import KeptFile

    kept = KeptFile(tmp_path / "kept" / "auto-x.json", {"model": "m"})
    start = threading.Barrier(8)

    def write(i):
        start.wait()
        for j in range(40):
            kept.write({"i": i, "j": j})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not caught and not kept._warned and kept.read()["j"] == 39
    assert list((tmp_path / "kept").iterdir()) == [tmp_path / "kept" / "auto-x.json"]  # no temporary left behind



def test_peek_rounds_that_find_nothing_to_accept_stretch_the_period_until_one_does(monkeypatch):
    """With ``quiet_doublings`` (1 by default), each round of peeks that would have had nothing accepted doubles
    the period (up to 2^quiet_doublings x), while plain decoding runs (a drafting arm that drafts nothing included); a
    peek with an accepted token, or a step that drafted, sets it back."""
    assert auto_module.AutoOptions().quiet_doublings == 1  # one doubling by default (see the module's docstring)
    drafter = started({"candidates": "ar,pld,ngram", "quiet_doublings": 3}, {})
    for name in ("pld", "ngram"):  # what the arms learn from a peek is not under test here
        monkeypatch.setattr(drafter.arms[name].drafter, "peeked", lambda proposal, accepted: None)
    state = DecodeState(tokens=[2, 3, 4, 2, 3, 4, 2, 3], prompt_len=3, sampling=SamplingConfig(),
                        rng=torch.Generator(), max_draft=8)
    base = drafter.options.probe_every
    costs = [0.01] * 16

    def round_scored(accepted: bool) -> None:
        at = len(state.tokens)
        drafter.peeks = [auto_module._Peek(arm, at, Proposal(tokens=[7, 8]), seconds=0.0) for arm in ("pld", "ngram")]
        state.tokens.extend([7 if accepted else 9, 5])
        drafter._score_peeks(state, costs)

    periods = []
    for _ in range(5):
        round_scored(False)
        periods.append(drafter._probe_period(state))
    assert periods == [2 * base, 4 * base, 8 * base, 8 * base, 8 * base]
    round_scored(True)
    assert drafter._probe_period(state) == base
    round_scored(False)
    assert drafter._probe_period(state) == 2 * base
    drafter.current = "pld"  # a drafting arm's step that drafted nothing (no match): plain decoding all the same
    drafter.step_start = drafter.draft_seconds = 0.0
    drafter.rows = 1
    drafter.observe(state, Verdict(accepted=[], accepted_tokens=[], next_token=5, bonus=False, committed_tokens=[5]))
    assert drafter._probe_period(state) == 2 * base
    drafter.rows = 3  # a step that drafted two tokens
    drafter.observe(state, Verdict(accepted=[], accepted_tokens=[], next_token=5, bonus=False, committed_tokens=[5]))
    assert drafter._probe_period(state) == base


@pytest.mark.parametrize("candidates, fallback, ngram_rate, ngram_drafts, expected", [
    ("ar,pld,ngram", True, 110.0, [7, 8], ("ngram", [7, 8], "fallback")),
    ("ar,pld,ngram", False, 110.0, [7, 8], ("pld", [], "best")),  # the option off: a plain step of the chosen arm
    ("ar,pld,ngram", True, 102.0, [7, 8], ("pld", [], "best")),  # ngram not above plain decoding by the margin
    ("ar,pld,ngram", True, 110.0, [], ("pld", [], "best")),  # no other arm drafts either
    ("pld,ngram", True, 110.0, [7, 8], ("pld", [], "best")),  # no plain decoding to rate a step without a draft
])
def test_a_chosen_arm_that_drafts_nothing_hands_the_step_to_the_next_arm_that_does(monkeypatch, candidates, fallback,
                                                                                    ngram_rate, ngram_drafts, expected):
    """pld rated best but finding no match in the text: the step goes to ngram, rated above plain decoding, if its
    own schedule drafts now; its verdict is ngram's, and the step counts for ngram."""
    kept = {"ar": rated(100.0), "pld": rated(120.0), "ngram": rated(ngram_rate)}
    drafter = started({"candidates": candidates, "exploration": 0.0, "probe_every": 0, "fallback": fallback},
                      {name: kept[name] for name in candidates.split(",")})
    monkeypatch.setattr(drafter.arms["pld"].drafter, "propose", lambda state: Proposal(tokens=[]))
    monkeypatch.setattr(drafter.arms["ngram"].drafter, "propose", lambda state: Proposal(tokens=list(ngram_drafts)))
    observed = []
    for name in ("pld", "ngram"):
        monkeypatch.setattr(drafter.arms[name].drafter, "observe",
                            lambda state, verdict, name=name: observed.append(name))
    state = DecodeState(tokens=[2, 3, 4, 5], prompt_len=3, sampling=SamplingConfig(), rng=torch.Generator(),
                        max_draft=8)
    proposal = drafter.propose(state)
    name, tokens, reason = expected
    assert (proposal.info["auto"], proposal.tokens, proposal.info["auto_reason"]) == (name, tokens, reason)
    steps_before = drafter.arms[name].estimate.steps
    drafter.observe(state, Verdict(accepted=[], accepted_tokens=[], next_token=5, bonus=False, committed_tokens=[5]))
    assert observed == [name] and drafter.arms[name].steps == 1
    assert drafter.arms[name].estimate.steps == steps_before + 1


def test_every_step_counts_once_in_the_shared_step_curve(monkeypatch):
    """``auto`` adds each step to the curve its arms' cost schedules share (``DecodeState.step_cost``); a schedule
    that also added its own steps counted a step twice, and its first step after other arms' steps as long as all
    of them."""
    from paradecode.drafters.schedule import CostCurve

    added = []
    original = CostCurve.add
    monkeypatch.setattr(CostCurve, "add", lambda self, tokens, seconds: (added.append(self), original(self, tokens,
                                                                                                  seconds))[1])
    backend = tiny_backend(0, sharp=4.0)
    _, stats = run(backend, "auto", PROMPTS[2], max_new_tokens=60, candidates="ar,pld,ngram")
    drafting = [s for s in stats.steps if s.info["auto"] in ("pld", "ngram")]
    assert drafting and len(drafting) < stats.forward_passes  # the drafting arms' schedules ran, between other arms
    assert len(added) == stats.forward_passes and len({id(curve) for curve in added}) == 1
    _, stats = run(backend, "pld", PROMPTS[0], max_new_tokens=40)  # alone, a schedule still fits its own curve
    assert len(added) > 40


def test_auto_under_sampling_draws_from_the_targets_distribution(monkeypatch):
    """The chi-squared test: the first two tokens of many seeded requests, the first drafted by ``pld`` (the
    prompt ends with a bigram seen before) and verified by speculative sampling, follow the target's exact joint
    p(a, b); a verifier that resamples from p after a rejection, not from the residual, fails it."""
    from scipy.stats import chisquare

    import paradecode.engine
    from paradecode.verify.base import Verdict as Verdict_
    from paradecode.verify.sampling import sample, uniform
    from tiny import two_token_joint

    vocab, prompt = 8, [1, 5, 2, 1, 5]
    backend = tiny_backend(2, vocab=vocab, sharp=3.0)
    expected = two_token_joint(backend, prompt, vocab).flatten()

    def pvalue(draws: int) -> float:
        counts = torch.zeros(vocab * vocab)
        drafted = 0
        for seed in range(draws):
            out, stats = run(backend, "auto", prompt, max_new_tokens=2, temperature=1.0, seed=seed,
                             candidates="pld,ngram,ar")
            drafted += bool(stats.steps[0].drafted)
            counts[out[0] * vocab + out[1]] += 1
        assert drafted == draws  # every first token was drawn against pld's draft
        keep = expected * draws >= 5  # enough expected counts per cell; the rest pooled into one
        obs, exp = counts[keep], expected[keep] * draws
        if not keep.all():
            obs = torch.cat([obs, counts[~keep].sum()[None]])
            exp = torch.cat([exp, expected[~keep].sum()[None] * draws])
        return float(chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue)

    assert pvalue(2000) > 1e-3

    def resample_from_p(drafts, parents, q, p, rng):  # pld's drafts are deterministic: q is one-hot (None)
        for i, token in enumerate(drafts):
            if uniform(rng) >= float(p[i][token]):
                return Verdict_(list(range(i)), list(drafts[:i]), sample(p[i], rng), bonus=False)
        return Verdict_(list(range(len(drafts))), list(drafts), sample(p[len(drafts)], rng), bonus=True)

    monkeypatch.setattr(paradecode.engine, "verify_speculative", resample_from_p)
    assert pvalue(1000) < 1e-3  # the test can fail
