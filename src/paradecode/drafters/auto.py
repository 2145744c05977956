"""Pick the fastest drafter for this request while decoding: a bandit over the registered training-free methods.

Each step ``auto`` hands the step to one candidate drafter (an *arm*) and measures, itself, what the step
gave: committed tokens and seconds from its ``propose`` to the end of its ``observe`` (drafting, the target's
forward pass, verification and the arm's bookkeeping; not the caller's time between steps). Its estimate of
an arm's speed is the ratio of discounted sums, rate = sum(gamma^age * tokens) / sum(gamma^age * seconds), so
it follows the text as it changes (copying phases favour lookup drafters, free text favours plain decoding).
A step slower than ``OUTLIER`` times the arm's fastest step so far counts as that long: on a shared CPU a
preempted step can take 100 times its cost, and one such step must not condemn an arm (the raw totals are
reported unclipped).

Choice: every arm first gets ``warmup`` steps in turn; after that the arm with the largest
    rate_a * (1 + exploration * sqrt(ln(sum_b n_b) / n_a))
where n_a is the arm's discounted step count (UCB1 with a multiplicative, scale-free bonus); the bookkeeping
is a few float operations a step. The discount's memory (1 / (1 - decay) steps, ~200 by default: a few
requests, since the estimates carry over) is long because one step's time is noisy (a step's tokens vary
2x, a shared CPU stalls) while the arms' true rates differ by a few tens of per cent: with 0.98 (~50 steps)
the estimates jittered past each other and ``auto`` spread its steps over arms up to 20% slower (Spec-Bench,
26 questions: 0.91x of ``ngram`` against 0.94x with 0.995).
The warm-up is the larger cost on short requests (one step of each arm, some of them slow).

Candidates: the ``candidates`` option, or every registered method in ``DEFAULT_CANDIDATES`` plus any class
that declares ``training_free = True``; methods that need a draft model join only when ``draft_model`` is
given. Every arm gets ``begin`` at the start of the request. Only the arm that proposed a step sees its
verdict; an arm that missed verdicts is re-synced with ``begin`` before it drafts again, unless it declares
``observe_optional = True`` (its state follows ``state.tokens`` by itself) or has no ``observe`` at all.
Output is exact whatever the choice: every arm is a lossless method verified by the engine. Under sampling
only the arms whose drafts draw nothing from the random stream run (not ``layerskip`` or a draft model's
sampled chains): each emitted token is then one draw from the target's distribution in turn, the draws plain
decoding makes, so a seed repeats the same text whatever arms the timings pick.

Across requests: with ``keep`` (the default) the estimates live in the loaded model's drafter store
(``Model.method_state``, one per set of auto options), so the next request on the same model starts from the
last one's discounted estimates and skips the warm-up for every arm that already has ``warmup`` measured
steps. Across processes: with ``persist`` (the default, with ``keep``) they are also written after every
request to a kept file in the cache folder (``paradecode.kept``: one per model, backend, dtype, set of auto
options and machine, like the in-process store), and the first request of a fresh process with the same model,
options and machine starts from them. ``summary()["auto"]`` says whether a request started warm and from where
(``"request"``: an earlier request of this process, ``"cache"``: the kept file), and each arm's share of the
steps and of the tokens.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.errors import ParadecodeError
from paradecode.kept import KeptFile
from paradecode.registry import get_method, method_names, register, resolve_drafter, takes_draft_model
from paradecode.verify.base import Verdict

DEFAULT_CANDIDATES = ("ar", "pld", "pld-tree", "ngram", "lookahead", "jacobi", "layerskip")
OUTLIER = 4.0  # a step counts as at most this many times the arm's fastest step (steps vary ~2x in tokens)


@dataclass(frozen=True)
class AutoOptions:
    candidates: str = ""  # comma-separated methods; "": the registered training-free methods
    draft_model: str = ""  # also try the methods that need a draft model, with this one
    warmup: int = 1  # steps each candidate gets before the bandit chooses
    exploration: float = 0.25  # scale of the UCB bonus (0: always the best measured rate)
    decay: float = 0.995  # per-step discount of old measurements (a memory of ~200 steps)
    keep: bool = True  # keep the estimates for the next request on the same loaded model
    persist: bool = True  # with keep: also in the cache folder, for later processes on this model and machine

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ParadecodeError(f"auto option warmup must be >= 1, got {self.warmup}.")
        if self.exploration < 0:
            raise ParadecodeError(f"auto option exploration must be >= 0, got {self.exploration}.")
        if not 0 < self.decay <= 1:
            raise ParadecodeError(f"auto option decay must be in (0, 1], got {self.decay}.")


@dataclass
class _Estimate:
    """What the bandit knows of one arm; kept across requests when the model keeps drafter state."""

    n: float = 0.0  # discounted totals, for the choice
    discounted_tokens: float = 0.0
    discounted_seconds: float = 0.0
    fastest: float = math.inf  # fastest step so far, in seconds
    steps: int = 0  # steps measured, over every request that shared this estimate

    @property
    def rate(self) -> float:
        return self.discounted_tokens / self.discounted_seconds if self.discounted_seconds > 0 else 0.0


@dataclass
class _Arm:
    drafter: Drafter
    needs_resync: bool  # must see every verdict, so it re-begins after steps other arms took
    estimate: _Estimate = field(default_factory=_Estimate)
    steps: int = 0  # raw totals over the request, for the report
    tokens: int = 0
    seconds: float = 0.0
    stale: bool = False

    @property
    def rate(self) -> float:
        return self.estimate.rate


@register("auto")
class AutoDrafter(Drafter):
    Options = AutoOptions

    def __init__(self, options: AutoOptions, context) -> None:
        super().__init__(options, context)
        self.arms: dict[str, _Arm] = {}
        self.exact: set[str] = set()  # candidates that sample exactly
        self.skipped: dict[str, str] = {}  # candidate -> why it is not used
        for name in _candidate_names(options):
            cls = get_method(name)
            if takes_draft_model(cls) and not options.draft_model:
                self.skipped[name] = "needs a draft model (auto option draft_model)"
                continue
            try:
                choice = resolve_drafter(cls, draft_model=options.draft_model)
                drafter = choice.create(context)
            except ParadecodeError as error:
                self.skipped[name] = str(error)
                continue
            resync = not cls.observe_optional and cls.observe is not Drafter.observe
            self.arms[name] = _Arm(drafter, resync)
            if choice.samples_exactly:
                self.exact.add(name)
        if not self.arms:
            raise ParadecodeError(f"auto has no candidate to run: {self.skipped}.")

    @property
    def draft_forward_passes(self) -> int:
        return sum(arm.drafter.draft_forward_passes for arm in self.arms.values())

    @classmethod
    def kept_across_requests(cls, options: AutoOptions) -> bool:
        return options.keep

    def wants_cost_curve(self) -> bool:
        return any(arm.drafter.wants_cost_curve() for arm in self.arms.values())

    def begin(self, state: DecodeState) -> None:
        # Under sampling: the exact arms whose drafts take nothing from the random stream, so a seed gives the
        # text plain decoding gives, whichever arms run (see Drafter.draws_from_rng).
        self.active = [name for name in self.arms if state.sampling.greedy or name in self.exact]
        if not state.sampling.greedy:
            self.active = [name for name in self.active if not self.arms[name].drafter.draws_from_rng]
        if not self.active:
            raise ParadecodeError(f"auto: no candidate samples exactly without drawing its drafts from the random "
                                  f"stream; candidates were {', '.join(self.arms)}: add ar (auto option candidates).")
        kept = self.kept_state(state) if self.options.keep else None
        self.kept_file = None
        source = "request"
        if kept is not None and self.options.persist and self.context is not None:
            self.kept_file = self.context.kept_file(self.method_name, self.options)
        if kept is not None and "estimates" not in kept:
            kept["estimates"] = _read_estimates(self.kept_file)
            source = "cache"
        estimates = kept["estimates"] if kept is not None else {}
        self.warm = any(name in estimates and estimates[name].steps > 0 for name in self.active)
        self.warm_from = source if self.warm else None
        for name, arm in self.arms.items():
            self.arms[name] = _Arm(arm.drafter, arm.needs_resync, estimates.setdefault(name, _Estimate()))
        for name in self.active:
            self.arms[name].drafter.begin(state)
        self.current, self.switches, self.step_start = "", 0, 0.0

    def propose(self, state: DecodeState) -> Proposal:
        self.step_start = time.perf_counter()
        name, reason = self._choose()
        arm = self.arms[name]
        if arm.stale:
            arm.drafter.begin(state)
            arm.stale = False
        self.switches += bool(self.current) and name != self.current
        self.current = name
        proposal = arm.drafter.propose(state)
        proposal.info = {**(proposal.info or {}), "auto": name, "auto_reason": reason}
        return proposal

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        chosen = self.arms[self.current]
        chosen.drafter.observe(state, verdict)
        seconds = time.perf_counter() - self.step_start
        tokens = len(verdict.committed_tokens)
        gamma = self.options.decay
        for name in self.active:
            arm = self.arms[name]
            arm.estimate.n *= gamma
            arm.estimate.discounted_tokens *= gamma
            arm.estimate.discounted_seconds *= gamma
            if arm is not chosen and arm.needs_resync:
                arm.stale = True
        chosen.steps += 1
        chosen.tokens += tokens
        chosen.seconds += seconds
        estimate = chosen.estimate
        estimate.steps += 1
        estimate.fastest = min(estimate.fastest, seconds)
        estimate.n += 1.0
        estimate.discounted_tokens += tokens
        estimate.discounted_seconds += min(seconds, OUTLIER * estimate.fastest)

    def end(self, state: DecodeState) -> None:
        if self.kept_file is not None:
            estimates = {name: arm.estimate for name, arm in self.arms.items() if arm.estimate.steps > 0}
            self.kept_file.write({"estimates": {name: dataclasses.asdict(e) for name, e in estimates.items()}})

    def _choose(self) -> tuple[str, str]:
        for name in self.active:
            if self.arms[name].estimate.steps < self.options.warmup:
                return name, "warmup"
        arms = [self.arms[name] for name in self.active]
        log_total = math.log(max(sum(arm.estimate.n for arm in arms), 1.0))
        c = self.options.exploration

        def ucb(name: str) -> float:
            arm = self.arms[name]
            return arm.rate * (1.0 + c * math.sqrt(log_total / max(arm.estimate.n, 1e-9)))

        best = max(self.active, key=lambda name: self.arms[name].rate)
        pick = max(self.active, key=ucb)
        return pick, "best" if pick == best else "explore"

    def summary(self) -> dict:
        candidates = {}
        all_steps = sum(self.arms[name].steps for name in self.active)
        all_tokens = sum(self.arms[name].tokens for name in self.active)
        for name in self.active:
            arm = self.arms[name]
            candidates[name] = dict(steps=arm.steps, tokens=arm.tokens, time_s=round(arm.seconds, 6),
                                    tokens_per_s=round(arm.tokens / arm.seconds, 3) if arm.seconds > 0 else 0.0,
                                    estimate=round(arm.rate, 3),  # the bandit's discounted, clipped rate
                                    step_share=round(arm.steps / all_steps, 4) if all_steps else 0.0,
                                    token_share=round(arm.tokens / all_tokens, 4) if all_tokens else 0.0)
            notes = arm.drafter.summary()
            if notes:
                candidates[name]["info"] = notes
        choice = max(self.active, key=lambda name: self.arms[name].rate)
        skipped = dict(self.skipped)
        skipped.update({name: "cannot sample exactly" if name not in self.exact else "draws its drafts at random"
                        for name in self.arms if name not in self.active})
        return {"auto": dict(choice=choice, switches=self.switches, warm=self.warm, warm_from=self.warm_from,
                             candidates=candidates, skipped=skipped)}


def _read_estimates(kept_file: KeptFile | None) -> dict[str, _Estimate]:
    """The estimates a kept file holds (empty without one, or when it cannot be used: ``KeptFile.read`` warns)."""
    payload = kept_file.read() if kept_file is not None else None
    estimates: dict[str, _Estimate] = {}
    fields = {f.name for f in dataclasses.fields(_Estimate)}
    for name, values in ((payload or {}).get("estimates") or {}).items():
        try:
            if set(values) != fields:
                raise ValueError(f"fields {sorted(values)}")
            estimate = _Estimate(**{key: float(values[key]) for key in fields})
            estimate.steps = int(values["steps"])
            if min(estimate.n, estimate.discounted_tokens, estimate.discounted_seconds, estimate.steps) < 0:
                raise ValueError("a negative count")
        except (TypeError, ValueError) as error:
            kept_file.ignore(f"its estimate for {name!r} is not one ({error})")
            return {}
        estimates[name] = estimate
    return estimates


def _candidate_names(options: AutoOptions) -> list[str]:
    registered = method_names()
    if options.candidates:
        names = [name.strip() for name in options.candidates.split(",") if name.strip()]
        for name in names:
            get_method(name)  # a clear error for an unknown name
        if "auto" in names:
            raise ParadecodeError("auto cannot be its own candidate.")
        return list(dict.fromkeys(names))
    names = [name for name in DEFAULT_CANDIDATES if name in registered]
    names += [name for name in registered if get_method(name).training_free and name not in names]
    names += [name for name in registered if name not in names and takes_draft_model(get_method(name))]
    return [name for name in names if name != "auto"]  # draft-model methods are skipped without draft_model
