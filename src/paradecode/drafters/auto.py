"""Pick the fastest drafter while decoding: a bandit over `ar`, `pld`, `ngram`, a shipped `eagle` head, or those listed.

Each step ``auto`` hands the step to one candidate drafter (an *arm*) and measures, itself, what the step
gave: committed tokens and seconds from its ``propose`` to the end of its ``observe`` (drafting, the target's
forward pass, verification and the arm's bookkeeping; not the caller's time between steps). Its estimate of
an arm's speed is the ratio of discounted sums, rate = sum(gamma^age * tokens) / sum(gamma^age * seconds), so
it follows the text as it changes (copying phases favour lookup drafters, free text favours plain decoding).
A step slower than ``OUTLIER`` times what it should have taken (its drafting, plus the fitted time of a step
of its rows scaled by the arm's excess, below) counts as that long: on a shared CPU a preempted step can take 100 times
its cost, and one such step must not condemn an arm (the raw totals are reported unclipped). The bound follows
the machine as it is now, as the peeks' prices do: a bound from the arm's fastest step ever, kept across
processes, let an arm chosen on a busy machine count its slow steps as fast while the arms it peeked at paid
the full time, and ``auto`` kept drafting at 0.75x plain decoding on short chat answers.

Peeks (greedy): measured only on its own steps, an arm is judged on the text it happened to run on, and the
arms' rates are not comparable (the one chosen in a copying phase looks fast). So every ``probe_every`` steps
each other *peekable* arm (one whose ``Drafter.peek`` says what it would propose without changing its state:
``ar``, ``pld``, ``ngram``, ``pld-tree``) is asked for its draft as well. Once the text after it is committed,
the peek is scored exactly as greedy verification would have scored it (the deepest draft node whose path
matches the text; ``_accepted``) and counts for its arm as a step: accepted + 1 tokens, in the peek's own
drafting time plus the time of a step over its rows, read from a cost curve fitted to this process's steps
(``schedule.CostCurve``, shaped by the measured curve), times 1 + the arm's *excess*: the share by which its
own steps took longer than that curve (a tree's mask and bookkeeping; negative for an arm cheaper than the
average). It is a ratio, so it holds when the machine speeds up or slows down, and a discounted mean like the
rates, each own step's sample within [-1/2, +1], with a prior of none worth ``EXCESS_PRIOR`` steps: the excess of
an arm that has not run for a few hundred steps fades back to none. (It was an absolute moving mean set outright
by the arm's first own step: one preempted step priced every later peek of an arm seldom chosen, plain decoding
above all, at several steps, and nothing ever corrected it.) So
every peekable arm is measured on the same text, and the arm learns from the peek's verdict
(``Drafter.peeked``: n-gram tag and draft-length statistics). The arms' cost schedules share the same curve
(``DecodeState.step_cost``). Peeks run every ``probe_every`` (4) steps, at every peekable arm. Requests that
share their passes (and the kept estimates) take turns: each peeks every ``probe_every`` x their number of steps
(``_probe_period``). Where no drafter pays (free text the model does not repeat), peeking is most of what
``auto`` adds to plain decoding. Its Python is cheap hot (a round of peeks ~10 us) but runs right after a
forward, whose weight stream has pushed every Python object out of the caches: on the Intel Xeon (SmolLM2-135M
q4, 4.2 ms steps, 2026-12-05) a step that peeked took ~300 us more than one of ``ar``, any other ~100 us more.
So with ``quiet_doublings`` = k > 0 (1 by default) each round of peeks that would all have had nothing accepted,
while plain decoding runs (a drafting arm's step that drafted nothing is plain decoding too), doubles the period,
up to 2^k x, and a peek with an accepted token, or a step that drafted, sets it back. Measured there on the
prompt where no drafter pays (16 rounds of one request of each variant in one process, median of the per-round
ratios to ``ar``): k = 0 0.967x, k = 1 0.992x, no peeks at all 1.011x; on the 65 Spec-Bench questions in one
paired run k = 1 gave 215.7 tok/s against 215.3 for k = 0 (``ngram`` 223.3). k = 3 took the no-drafter prompt to
0.984x ``ar`` (``benchmarks/auto_start.py --rounds 3``) but, in a paired
65-question run, cost 1.3% overall and noticed copying phases late (math_reasoning 0.89x the best fixed method in
both runs with it, 0.93x without). With
``laggard`` > 0 an arm under ``laggard`` times
the best rate is peeked at only every ``LAGGARD_EVERY``-th round; that saved time over seven arms but starved
the arm that most needed its peeks. An arm's draft length comes from what its peeks taught it (``ngram`` drafts
a token or two until its acceptance estimates rise), so on text the model repeats (128 tokens after a prompt of
random tokens, AMD EPYC Zen 4, 2026-12-04) ``ngram``, rated below ``pld`` after its first short peeks, was peeked
at 2-4 times a request, never learnt to draft long, and ``auto`` ran ``pld`` at 0.70-0.77x fixed ``ngram``;
peeked every round it learnt within the request and ``auto`` ran at 0.94-1.01x ``ngram``.
A peek that drafts nothing teaches nothing, so with ``probes`` (the default) an arm may hand a longer draft
with its peek (``Drafter.peek``'s ``info["probe"]``: ``ngram`` and ``pld`` give their whole candidate chain);
the arm learns from that one's verdict while its estimate counts what it would have proposed. Without it, on a
copying prompt both drafting arms' first peeks were rejected, their estimates fell until they drafted nothing,
and ``auto`` ran ``ar`` for all 128 tokens at 0.63-0.70x fixed ``ngram`` (now 0.94-1.07x); on 65 Spec-Bench
questions the two are alike (two paired runs: 0.950x and 0.959x ``ngram`` with probes, 0.954x and 0.956x without).

Choice: an arm with fewer than ``warmup`` measured steps (peeks count) gets the step; after that the arm with
the largest
    rate_a * (1 + exploration * sqrt(ln(sum_b n_b) / n_a))
where n_a is the arm's measured steps and peeks over its lifetime, kept across requests and processes
(UCB1 with a multiplicative, scale-free bonus): an arm that cannot be peeked at (``jacobi``, ``lookahead``,
``layerskip``) is tried again less and less often. An arm that is peeked at gets no bonus: its peeks measure it on
the text already, and a step given to it to explore is a step of drafting where the estimates say nothing pays
(not timed apart from the change to ``quiet_doublings`` it came with). Under sampling, where nothing is peeked
at, every arm has its bonus. The bookkeeping is a few float operations a step. The discount's memory
(1 / (1 - decay) steps, ~200 by default: a few requests, since the estimates carry over) is long because one
step's time is noisy (a step's tokens vary 2x, a shared CPU stalls) while the arms' true rates differ by a few
tens of per cent: with 0.98 (~50 steps) the estimates jittered past each other and ``auto`` spread its steps over
arms up to 20% slower (Spec-Bench, 26 questions: 0.91x of ``ngram`` against 0.94x with 0.995).
The warm-up is the larger cost on short requests (one step of each arm that cannot be peeked at).
Plain decoding wins ties: a drafting arm is chosen only when its rate beats ``ar``'s by ``margin`` (3%), so
where no drafter pays, noise in the estimates does not keep ``auto`` drafting at a loss; likewise an arm that
cannot be peeked at (its estimate rests on fewer, noisier steps) must beat the peekable ones by the margin.
With ``fallback`` (the default), a chosen drafting arm that finds nothing to draft (``pld`` with no match) hands
the step to the best other drafting arm rated above plain decoding that drafts now (``_fall_back``).

Candidates: the ``candidates`` option, or every registered method in ``DEFAULT_CANDIDATES`` plus any class
that declares ``training_free = True``; methods that need a draft model join only when ``draft_model`` is
given. The default arms are the methods that were the fastest fixed method in some Spec-Bench category on a
machine measured, and plain decoding: ``ar``, ``pld``, ``ngram``. The other training-free methods join by the
``candidates`` option only, since every arm costs: on 65 Spec-Bench questions (SmolLM2-135M q4, 128 tokens, AMD
EPYC Zen 4, 2026-12-04, one run) ``auto`` over all seven ran at 0.90x ``ngram``, without ``pld-tree`` at 0.94x,
over the three at 0.96x. ``pld-tree`` was the worst: 1.05x ``ar`` as a fixed method, but its peeks (many nodes, a
long accepted path) rated it above ``ngram`` on question after question and it took 30% of the tokens; ``jacobi``,
``lookahead`` and ``layerskip`` (1.08x, 0.71x, 0.94x ``ar``) cost their warm-up and exploration steps and were
never the best in a category. Where a trained head ships for the model (``DEFAULT_HEADS``: ``eagle``, with its
copies of repeated text), its drafter is a default arm too; ``auto`` then asks the target for its hidden states at
every step, whichever arm proposed it (arms reading different features, EAGLE's last hidden state and EAGLE-3's
layer inputs, cannot share a request: the later candidate is skipped). Every arm gets ``begin`` at the start of
the request. Only the arm that proposed a step sees its verdict (``observe``); the others ``witness`` it: a head
arm takes the step's features and tokens to feed its head when it next drafts (``begin`` could not re-sync it:
it has no features of the text generated since the prompt). An arm that cannot witness a step is re-synced with
``begin`` before it drafts again, unless it declares ``observe_optional = True`` (its state follows
``state.tokens`` by itself) or has no ``observe`` at all.
Output is exact whatever the choice: every arm is a lossless method verified by the engine. Under sampling
only the arms whose drafts draw nothing from the random stream run (not ``layerskip`` or a draft model's
sampled chains): each emitted token is then one draw from the target's distribution in turn, the draws plain
decoding makes, so a seed repeats the same text whatever arms the timings pick.

Across requests: with ``keep`` (the default) the estimates live in the loaded model's drafter store
(``Model.method_state``, one per set of auto options), so the next request on the same model starts from the
last one's discounted estimates and skips the warm-up for every arm that already has ``warmup`` measured
steps. A request starts from ``carry`` (half) of the kept weight: the estimates come from other text, and
this request's own steps and peeks should soon outweigh them. Across processes: with ``persist`` (the default,
with ``keep``) they are also written after every request to a kept file in the cache folder
(``paradecode.kept``: one per model, backend, dtype, set of auto options and machine, like the in-process
store), and the first request of a fresh process with the same model, options and machine starts from them.
``summary()["auto"]`` says whether a request started warm and from where (``"request"``: an earlier request of
this process, ``"cache"``: the kept file), and each arm's share of the steps and of the tokens.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field

from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.drafters.schedule import CostCurve
from paradecode.errors import ParadecodeError
from paradecode.heads.store import shipped_head
from paradecode.kept import KeptFile
from paradecode.registry import get_method, method_names, register, resolve_drafter, takes_draft_model
from paradecode.verify.base import Verdict

DEFAULT_CANDIDATES = ("ar", "pld", "ngram")  # the rest by the candidates option (see "Candidates" above)
DEFAULT_HEADS = ("eagle",)  # default candidates too, on a model a head of theirs ships for
LAGGARD_EVERY = 4  # an arm under the laggard option's share of the best rate is peeked at every 4th round
EXCESS_PRIOR = 5.0  # steps' worth of weight for "no excess" in an arm's discounted mean excess
OUTLIER = 4.0  # a step counts as at most this many times its modelled time (steps vary ~2x in tokens)


@dataclass(frozen=True)
class AutoOptions:
    candidates: str = ""  # comma-separated methods; "": ar, pld, ngram, eagle where its head ships, training_free ones
    draft_model: str = ""  # also try the methods that need a draft model, with this one
    warmup: int = 1  # steps each candidate gets before the bandit chooses
    exploration: float = 0.25  # scale of the UCB bonus (0: always the best measured rate)
    decay: float = 0.995  # per-step discount of old measurements (a memory of ~200 steps)
    margin: float = 0.03  # a drafting arm beats plain decoding (and an arm auto cannot peek at, a peekable one)
    # only when its rate is this much higher
    carry: float = 0.5  # share of the kept estimates' weight a new request starts from (its own text counts more)
    probe_every: int = 4  # greedy: every this many steps, peek at each other peekable arm's draft (0: never)
    laggard: float = 0.0  # an arm under this share of the best rate is peeked at every 4th round only (0: none)
    probes: bool = True  # peeks teach an arm by its longer probe draft where it offers one (Drafter.peek)
    quiet_doublings: int = 1  # peek rounds that found nothing to accept stretch the period up to 2^this x (0: never)
    fallback: bool = True  # a chosen drafting arm that drafts nothing hands the step to the best one above ar that does
    retry_every: int = 64  # a drafting arm auto cannot peek at gets a step after this many without one (0: never)
    keep: bool = True  # keep the estimates for the next request on the same loaded model
    persist: bool = True  # with keep: also in the cache folder, for later processes on this model and machine

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ParadecodeError(f"auto option warmup must be >= 1, got {self.warmup}.")
        if self.exploration < 0:
            raise ParadecodeError(f"auto option exploration must be >= 0, got {self.exploration}.")
        if not 0 < self.decay <= 1:
            raise ParadecodeError(f"auto option decay must be in (0, 1], got {self.decay}.")
        if self.margin < 0:
            raise ParadecodeError(f"auto option margin must be >= 0, got {self.margin}.")
        if not 0 < self.carry <= 1:
            raise ParadecodeError(f"auto option carry must be in (0, 1], got {self.carry}.")
        if self.probe_every < 0:
            raise ParadecodeError(f"auto option probe_every must be >= 0, got {self.probe_every}.")
        if not 0 <= self.quiet_doublings <= 10:
            raise ParadecodeError(f"auto option quiet_doublings must be in 0..10, got {self.quiet_doublings}.")
        if not 0 <= self.laggard < 1:
            raise ParadecodeError(f"auto option laggard must be in [0, 1), got {self.laggard}.")
        if self.retry_every < 0:
            raise ParadecodeError(f"auto option retry_every must be >= 0, got {self.retry_every}.")


@dataclass
class _Estimate:
    """What the bandit knows of one arm; kept across requests when the model keeps drafter state."""

    discounted_tokens: float = 0.0  # discounted totals, for the choice
    discounted_seconds: float = 0.0
    steps: int = 0  # steps and scored peeks measured, over every request that shared this estimate
    # by what share the arm's own steps (less their drafting) took longer than the fitted time of a step of their
    # rows (a tree's mask and bookkeeping; negative for an arm cheaper than the average): discounted sums
    excess_sum: float = 0.0
    excess_weight: float = 0.0

    @property
    def rate(self) -> float:
        return self.discounted_tokens / self.discounted_seconds if self.discounted_seconds > 0 else 0.0

    @property
    def excess(self) -> float:
        """The discounted mean excess, pulled towards none by a prior worth ``EXCESS_PRIOR`` steps."""
        return self.excess_sum / (self.excess_weight + EXCESS_PRIOR)


@dataclass
class _Arm:
    drafter: Drafter
    needs_resync: bool  # must see every verdict, so it re-begins after steps other arms took
    estimate: _Estimate = field(default_factory=_Estimate)
    steps: int = 0  # raw totals over the request, for the report
    tokens: int = 0
    seconds: float = 0.0
    stale: bool = False
    peekable: bool = False  # its drafter's peek says what it would propose (auto scores that against the text)
    peeks: int = 0  # peeks scored over the request, for the report
    last_step: int = 0  # the request's step count when it last took a step (``retry_every``)

    @property
    def rate(self) -> float:
        return self.estimate.rate


@dataclass
class _Peek:
    """An arm's draft at ``at`` tokens that no forward verified: scored once the text after ``at`` decides it."""

    arm: str
    at: int
    proposal: Proposal
    seconds: float  # the peek's own time: the arm's drafting
    probe: "_Peek | None" = None  # the longer draft the arm learns from (``Drafter.peek``'s "probe"), if any

    @property
    def tokens(self) -> list[int]:
        return self.proposal.tokens

    @property
    def parents(self) -> list[int]:  # parent node of each token (-1: the root), parents first
        return self.proposal.node_parents


def _accepted(peek: _Peek, text: list[int]) -> int | None:
    """How many of the peek's tokens greedy verification would have accepted, given the ``text`` that followed
    (the deepest node whose path matches it); None while the text is too short to tell."""
    depth: list[int] = []
    matched: list[bool] = []
    best, open_ = 0, False
    for token, parent in zip(peek.tokens, peek.parents):
        d = 1 if parent < 0 else depth[parent] + 1
        depth.append(d)
        reachable = parent < 0 or matched[parent]
        if reachable and d > len(text):
            open_ = True  # this node's turn in the text has not come yet
        hit = reachable and d <= len(text) and text[d - 1] == token
        matched.append(hit)
        if hit:
            best = max(best, d)
    return None if open_ else best


@register("auto")
class AutoDrafter(Drafter):
    Options = AutoOptions

    def __init__(self, options: AutoOptions, context) -> None:
        super().__init__(options, context)
        self.arms: dict[str, _Arm] = {}
        self.exact: set[str] = set()  # candidates that sample exactly
        self.skipped: dict[str, str] = {}  # candidate -> why it is not used
        self.aux_layers: tuple[int, ...] = ()  # the target features the head arms read (engine.Features)
        heads = ""  # the first head arm: the others must read the same features
        for name in _candidate_names(options, getattr(context, "name", None)):
            cls = get_method(name)
            if takes_draft_model(cls) and not options.draft_model:
                self.skipped[name] = "needs a draft model (auto option draft_model)"
                continue
            try:
                choice = resolve_drafter(cls, draft_model=options.draft_model)
                drafter = choice.create(context)
            except ParadecodeError as error:  # e.g. eagle on a model no head ships for
                self.skipped[name] = str(error)
                continue
            if drafter.needs_hidden:
                layers = tuple(getattr(drafter, "aux_layers", ()))
                if heads and layers != self.aux_layers:
                    self.skipped[name] = (f"reads other target features than {heads} (auto hands its arms one "
                                          f"kind: pick one of the two)")
                    continue
                heads, self.aux_layers = heads or name, layers
            resync = not cls.observe_optional and cls.observe is not Drafter.observe
            self.arms[name] = _Arm(drafter, resync, peekable=_peekable(cls))
            if choice.samples_exactly:
                self.exact.add(name)
        if not self.arms:
            raise ParadecodeError(f"auto has no candidate to run: {self.skipped}.")

    @property
    def draft_forward_passes(self) -> int:
        return sum(arm.drafter.draft_forward_passes for arm in self.arms.values())

    @property
    def needs_hidden(self) -> bool:  # the engine hands every step's target features over where a head arm reads them
        return any(arm.drafter.needs_hidden for arm in self.arms.values())

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
        # the time of a step verifying T tokens (shaped by the measured curve), what a peeked draft would have
        # cost: a copy of the last request's fit (concurrent requests each fit their own; the last one to
        # end leaves its fit for the next)
        self.kept = kept
        last = kept.get("curve") if kept is not None else None
        self.curve = copy.deepcopy(last) if last is not None else CostCurve(state.cost_curve)
        self.kept_file = None
        source = "request"
        if kept is not None and self.options.persist and self.context is not None:
            self.kept_file = self.context.kept_file(self.method_name, self.options)
        if kept is not None and "estimates" not in kept:
            kept["estimates"] = _read_estimates(self.kept_file)
            source = "cache"
        estimates = kept["estimates"] if kept is not None else {}
        self.warm = any(name in estimates and estimates[name].steps > 0 for name in self.active)
        for estimate in estimates.values():  # another text's rates: a prior this request's own steps soon outweigh
            estimate.discounted_tokens *= self.options.carry
            estimate.discounted_seconds *= self.options.carry
        self.warm_from = source if self.warm else None
        for name, arm in self.arms.items():
            self.arms[name] = _Arm(arm.drafter, arm.needs_resync, estimates.setdefault(name, _Estimate()),
                                   peekable=arm.peekable)
        state.step_cost = self.curve  # the arms' cost schedules fit the same step times
        for name in self.active:
            self.arms[name].drafter.begin(state)
        self.current, self.switches, self.step_start, self.draft_seconds, self.rows = "", 0, 0.0, 0.0, 1
        self.foreign = 0.0  # the chosen arm's catch-up seconds this step (Drafter.foreign_seconds)
        self.warmed = False  # every active arm has had its warm-up steps
        # Peeks score an arm's drafts on the text the chosen arms produce; greedy only (under sampling what is
        # accepted is a draw, not a match with the text)
        self.probing = state.sampling.greedy and self.options.probe_every > 0
        # Each active arm's factor on its rate in the choice, the margin in favour of the surer choice: plain
        # decoding over any drafting, a peeked arm (measured on the same text) over one that is not.
        margin = 1.0 + self.options.margin
        self.favour = [(1.0 if arm.drafter.drafts else margin) / (1.0 if arm.peekable else margin)
                       for arm in (self.arms[name] for name in self.active)]
        # whether an active arm gets the exploration bonus: not one that peeks measure
        self.explored = [not (self.probing and self.arms[name].peekable) for name in self.active]
        self.exploring = any(self.explored)
        self.peeks: list[_Peek] = []
        self.steps_taken = self.peek_rounds = 0
        self.quiet = 0  # peeks scored in a row that would have had nothing accepted, while plain decoding ran
        self.peeked_arms = max(sum(self.arms[name].peekable for name in self.active) - 1, 1)  # peeks a round

    def propose(self, state: DecodeState) -> Proposal:
        name, reason = self._choose()
        if self.probing and self.steps_taken % self._probe_period(state) == 0:
            self._peek(state, name)
        self.step_start = time.perf_counter()
        arm = self.arms[name]
        proposal = self._propose(arm, state)
        if not proposal.tokens and arm.drafter.drafts and self.options.fallback and reason != "warmup":
            name, arm, proposal, reason = self._fall_back(state, name, arm, proposal, reason)
        self.switches += bool(self.current) and name != self.current
        self.current = name
        # a head's catch-up on text other arms drafted is the price of switching, not of its steps: left out of
        # its rate (the prompt's feed on a long prompt made one step ~10x a normal one, and the arm, rated on its
        # own steps only, was never chosen again)
        self.foreign = arm.drafter.foreign_seconds
        self.draft_seconds = time.perf_counter() - self.step_start - self.foreign
        self.rows = 1 + len(proposal.tokens)
        proposal.info = {**(proposal.info or {}), "auto": name, "auto_reason": reason}
        return proposal

    def _fall_back(self, state: DecodeState, name: str, arm: _Arm, proposal: Proposal, reason: str):
        """The chosen drafting arm found nothing to draft (``pld`` with no match in the text): the step goes to the
        best other drafting arm rated above plain decoding (within the margins of the choice; so only where ``ar`` is
        an arm) that drafts now, if any; else it stays a plain step of the chosen arm (as it does in an arm's warm-up
        step, which measures that arm). Each arm's own schedule decided that its draft pays. The arm that drafted
        nothing misses this step's verdict, and re-syncs as after any step another arm took (the case it was made
        for: docs/specbench-65q-amd-1206/README.md)."""
        rates = dict(zip(self.active, self._favoured_rates()))
        plain = max((rates[other] for other in self.active if not self.arms[other].drafter.drafts), default=None)
        if plain is None:  # no plain decoding among the arms to say what a step is worth without a draft
            return name, arm, proposal, reason
        for other in sorted(self.active, key=rates.__getitem__, reverse=True):
            candidate = self.arms[other]
            if other == name or not candidate.drafter.drafts or rates[other] <= plain:
                continue
            drafted = self._propose(candidate, state)
            if drafted.tokens:
                return other, candidate, drafted, "fallback"
        return name, arm, proposal, reason

    @staticmethod
    def _propose(arm: _Arm, state: DecodeState) -> Proposal:
        """The arm's draft, its state first re-synced with ``begin`` if other arms' steps left it stale."""
        if arm.stale:
            arm.drafter.begin(state)
            arm.stale = False
        return arm.drafter.propose(state)

    def _favoured_rates(self) -> list[float]:
        """Each active arm's rate, within the margin in favour of the surer choice (``favour``)."""
        return [self.arms[name].estimate.rate * f for name, f in zip(self.active, self.favour)]

    def _probe_period(self, state: DecodeState) -> int:
        """Steps between peek rounds: ``probe_every``, times the requests that share this one's passes and its kept
        estimates (``Load.requests`` + 1). Their steps run one after another between passes, under the GIL, and
        a step of ``auto`` cost more Python than one of ``ar``: 32 chat questions 16 at a time (``generate_batch``,
        SmolLM2-135M q4, Intel Xeon, 2 cores), 0.41-0.42 ms of CPU against 0.25-0.28 (0.27-0.31 without peeks in
        that run; as much as with them in a later one, whose steps went to ``pld`` and ``ngram``). Taking turns:
        14.46 against 14.02 requests/s (six alternating processes). Together the requests still give the
        estimates a round every ``probe_every`` passes."""
        base = self.options.probe_every if self.kept is None or state.load is None else \
            self.options.probe_every * (1 + state.load().requests)
        return base << min(self.quiet // self.peeked_arms, self.options.quiet_doublings)

    def _peek(self, state: DecodeState, chosen: str) -> None:
        """What every other peekable arm would draft now, scored later against the text (``_score_peeks``). An
        arm under ``laggard`` x the best rate is peeked at on every ``LAGGARD_EVERY``-th round only."""
        self.peek_rounds += 1
        floor = self.options.laggard * max(self.arms[name].rate for name in self.active)
        for name in self.active:
            arm = self.arms[name]
            if name == chosen or not arm.peekable or arm.stale:  # a stale arm's state lags the text
                continue
            if arm.rate < floor and self.peek_rounds % LAGGARD_EVERY:
                continue
            start = time.perf_counter()
            proposal = arm.drafter.peek(state)
            seconds = time.perf_counter() - start
            if proposal is not None:
                at = len(state.tokens)
                longer = (proposal.info or {}).get("probe")  # a probe no longer than the draft teaches the same
                learns = self.options.probes and longer is not None and len(longer.tokens) > len(proposal.tokens)
                self.peeks.append(_Peek(name, at, proposal, seconds, _Peek(name, at, longer, 0.0) if learns else None))

    def _score_peeks(self, state: DecodeState, costs: list[float]) -> None:
        """Each peek the text has decided counts for its arm as a step: its tokens, and the time of its
        drafting plus ``costs[T - 1]``, the fitted time of a step verifying its T rows."""
        waiting = []
        for peek in self.peeks:
            learner = peek.probe or peek  # what the arm learns from: its probe, else the draft it would propose
            text = state.tokens[peek.at : peek.at + max(len(peek.tokens), len(learner.tokens))]
            accepted = _accepted(peek, text)
            learnt = accepted if learner is peek else _accepted(learner, text)
            if accepted is None or learnt is None:
                waiting.append(peek)
                continue
            arm = self.arms[peek.arm]
            arm.peeks += 1
            self.quiet = 0 if accepted else self.quiet + 1
            arm.drafter.peeked(learner.proposal, learnt)
            _add(arm.estimate, accepted + 1, peek.seconds + costs[len(peek.tokens)] * (1 + arm.estimate.excess))
        self.peeks = waiting

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        chosen = self.arms[self.current]
        chosen.drafter.observe(state, verdict)
        if self.rows > 1:
            self.quiet = 0  # a step drafted: the others are peeked at as often as ever, to compare
        seconds = time.perf_counter() - self.step_start - self.foreign
        tokens = len(verdict.committed_tokens)
        gamma = self.options.decay
        for name in self.active:
            arm = self.arms[name]
            arm.estimate.discounted_tokens *= gamma
            arm.estimate.discounted_seconds *= gamma
            arm.estimate.excess_sum *= gamma
            arm.estimate.excess_weight *= gamma
            if arm is not chosen and arm.needs_resync and not arm.stale:
                arm.stale = not arm.drafter.witness(state, verdict)  # a head arm follows the text's features
        chosen.steps += 1
        chosen.last_step = self.steps_taken
        chosen.tokens += tokens
        chosen.seconds += seconds
        estimate = chosen.estimate
        verify = seconds - self.draft_seconds  # the verify pass and bookkeeping
        self.curve.add(self.rows, max(verify, 1e-6))
        fitted = self.curve.at(self.rows)
        _add(estimate, tokens, min(seconds, OUTLIER * (self.draft_seconds + fitted * (1 + estimate.excess))))
        estimate.excess_sum += min(max(verify / fitted - 1, -0.5), 1.0)  # noise kept within bounds
        estimate.excess_weight += 1
        self.steps_taken += 1
        if self.peeks:  # one fit prices this step and every pending peek
            self._score_peeks(state, self.curve.predictions(max(1 + len(peek.tokens) for peek in self.peeks)))

    def end(self, state: DecodeState) -> None:
        if self.kept is not None:
            self.kept["curve"] = self.curve
        if self.kept_file is not None:
            estimates = {name: arm.estimate for name, arm in self.arms.items() if arm.estimate.steps > 0}
            self.kept_file.write({"estimates": {name: dataclasses.asdict(e) for name, e in estimates.items()}})

    def _choose(self) -> tuple[str, str]:
        if not self.warmed:  # an arm's count only grows within a request: once all are warm they stay so
            for name in self.active:
                if self.arms[name].estimate.steps < self.options.warmup:
                    return name, "warmup"
            self.warmed = True
        if self.options.retry_every:  # an arm rated on its own steps only: its rate is proven wrong by steps alone
            for name, explored in zip(self.active, self.explored):
                arm = self.arms[name]
                if explored and arm.drafter.drafts and self.steps_taken - arm.last_step >= self.options.retry_every:
                    return name, "retry"
        # Each arm's rate, within the margin in favour of the surer choice (``favour``); then the UCB bonus, which
        # shrinks with the arm's lifetime count (peeks included).
        rates = self._favoured_rates()
        best = rates.index(max(rates))  # the first of equals, as max(key=) gives
        if not self.exploring:  # no bonus for any arm: the best rate
            return self.active[best], "best"
        counts = [self.arms[name].estimate.steps for name in self.active]
        log_total = math.log(max(sum(counts), 1))
        c = self.options.exploration
        ucbs = [r * (1.0 + c * math.sqrt(log_total / max(n, 1))) if explore else r
                for r, n, explore in zip(rates, counts, self.explored)]
        pick = ucbs.index(max(ucbs))
        return self.active[pick], "best" if pick == best else "explore"

    def summary(self) -> dict:
        candidates = {}
        all_steps = sum(self.arms[name].steps for name in self.active)
        all_tokens = sum(self.arms[name].tokens for name in self.active)
        for name in self.active:
            arm = self.arms[name]
            candidates[name] = dict(steps=arm.steps, peeks=arm.peeks, tokens=arm.tokens, time_s=round(arm.seconds, 6),
                                    tokens_per_s=round(arm.tokens / arm.seconds, 3) if arm.seconds > 0 else 0.0,
                                    estimate=round(arm.rate, 3),  # the bandit's discounted, clipped rate
                                    excess=round(arm.estimate.excess, 4),  # its steps' share beyond the curve
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


def _peekable(cls: type[Drafter]) -> bool:
    """Whether ``cls.peek`` says what ``cls.propose`` does: both defined by the same class (a subclass that
    changes ``propose`` alone is measured on its own steps only)."""
    owner = lambda attr: next(c for c in cls.__mro__ if attr in vars(c))  # noqa: E731
    return owner("peek") is not Drafter and owner("peek") is owner("propose")


def _add(estimate: _Estimate, tokens: float, seconds: float) -> None:
    estimate.steps += 1
    estimate.discounted_tokens += tokens
    estimate.discounted_seconds += seconds


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
            if min(estimate.discounted_tokens, estimate.discounted_seconds, estimate.steps) < 0:
                raise ValueError("a negative count")
        except (TypeError, ValueError) as error:
            kept_file.ignore(f"its estimate for {name!r} is not one ({error})")
            return {}
        estimates[name] = estimate
    return estimates


def _candidate_names(options: AutoOptions, model_name: str | None = None) -> list[str]:
    registered = method_names()
    if options.candidates:
        names = [name.strip() for name in options.candidates.split(",") if name.strip()]
        for name in names:
            get_method(name)  # a clear error for an unknown name
        if "auto" in names:
            raise ParadecodeError("auto cannot be its own candidate.")
        return list(dict.fromkeys(names))
    names = [name for name in DEFAULT_CANDIDATES if name in registered]
    names += [name for name in DEFAULT_HEADS if name in registered and shipped_head(name, model_name) is not None]
    names += [name for name in registered if get_method(name).training_free and name not in names]
    names += [name for name in registered if name not in names and takes_draft_model(get_method(name))]
    return [name for name in names if name != "auto"]  # draft-model methods are skipped without draft_model
