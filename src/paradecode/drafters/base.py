"""The drafter interface: ``propose(state) -> Proposal`` and ``observe(verdict)``.

A drafter sees the request through ``DecodeState`` and proposes draft tokens as a chain or a tree. It never
runs the target model: the engine scores the proposal in one target forward pass, verifies it, commits the
accepted path and hands the ``Verdict`` back to ``observe``. New needs become optional fields of
``DecodeState`` or ``Proposal``, not new arguments. What a drafter may use of the loaded model it drafts for
(a draft model's backend, the model's folder) is its ``DrafterContext``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

import torch

from paradecode.backends.base import Backend
from paradecode.config import SamplingConfig
from paradecode.kept import KeptFile
from paradecode.registry import build_options, resolve_drafter  # noqa: F401  (build_options: re-exported)
from paradecode.verify.base import Verdict
from paradecode.verify.sampling import draw_draft_token


class DrafterContext(Protocol):
    """The loaded model a drafter drafts for (``api.Model`` is one). A drafter reads only what it needs:
    ``draft`` and ``draft-tree`` load their draft model's backend, the head drafters read the target's folder."""

    name: str  # the model's name as loaded (a built-in name, a path)
    model_dir: Path  # its Hugging Face model folder

    def load_draft_backend(self, model: str) -> Backend:
        """The backend of a draft model sharing the target's tokenizer, loaded once per model."""

    def kept_file(self, method: str, options: Any) -> KeptFile | None:
        """Where ``method`` with these ``options`` may keep what it learned of this model on this machine for later
        processes (one per method and options, as ``Drafter.kept_state``; ``auto`` keeps its speed estimates
        there); None: nowhere."""


@dataclass
class DecodeState:
    tokens: list[int]  # prompt + committed output; the last one is the root the next proposal grows from
    prompt_len: int
    sampling: SamplingConfig
    rng: torch.Generator
    max_draft: int  # most draft tokens worth proposing (what is left of the token budget)
    eos_ids: frozenset[int] = frozenset()
    supports_tree: bool = True  # False: the target backend verifies chains only
    target: Backend | None = None  # only self-speculative drafters (layer skip) run it, by design
    prompt_hidden: torch.Tensor | None = None  # [P-1, D] target hidden states of the prefill (needs_hidden)
    # The target's forward time over T tokens relative to T = 1 (``paradecode.profile``), given when the drafter
    # asked for it (``Drafter.wants_cost_curve``); the ``cost`` draft schedule starts from it.
    cost_curve: dict[int, float] | None = None
    # The request's step time by tokens scored, fitted online (``drafters.schedule.CostCurve``), where a drafter
    # that runs others (``auto``) shares one fit between them and adds every step to it itself (the cost schedules
    # read it, and add nothing); None: each cost schedule fits its own.
    step_cost: Any = None
    # What drafters keep across requests on the loaded model, per (method, options) (``Model.method_state``);
    # None: nothing outlives the request.
    method_state: dict[tuple[str, Any], dict] | None = None
    # What the other requests sharing the target's passes put into each pass (``Backend.load``, a callable
    # returning ``backends.base.Load``); None: the request runs alone. The ``cost`` schedule drafts less under load.
    load: Callable[[], Any] | None = None

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)  # draft nodes: a chain, or a tree in parent-first order
    parents: list[int] | None = None  # tree: parent index of each node (-1 = root); None = chain
    draft_probs: torch.Tensor | None = None  # [N, V] q for each node (sampling); None = deterministic draft
    confidences: list[float] | None = None  # drafter's probability of each node given its parent (head trees)
    # Extra inputs that ride along in the same forward pass without being verified (lookahead's Jacobi
    # window): token ids, absolute positions, and a [E, 1 + N + E] mask over root + nodes + extras (the cache
    # is always visible); their logits come back in ``Verdict.extra_logits``.
    extra_tokens: list[int] | None = None
    extra_positions: list[int] | None = None
    extra_mask: torch.Tensor | None = None
    info: dict | None = None  # recorded in the step's trace

    @property
    def is_chain(self) -> bool:
        return self.parents is None

    @property
    def node_parents(self) -> list[int]:
        """Each node's parent index (-1 = root), a chain's included."""
        return list(range(-1, len(self.tokens) - 1)) if self.parents is None else self.parents

    def keep(self, nodes: list[int]) -> None:
        """Keep only ``nodes`` (ascending, each with its ancestors): their tokens, parents (re-indexed), q rows
        and the columns of the extra inputs' mask."""
        n = len(self.tokens)
        if self.parents is not None:
            where = {old: new for new, old in enumerate(nodes)}
            self.parents = [where.get(self.parents[i], -1) for i in nodes]
        self.tokens = [self.tokens[i] for i in nodes]
        if self.draft_probs is not None:
            self.draft_probs = self.draft_probs[nodes]
        if self.extra_mask is not None:  # [E, 1 + N + E]: drop the columns of the dropped nodes
            columns = [0] + [1 + i for i in nodes] + list(range(1 + n, self.extra_mask.shape[1]))
            self.extra_mask = self.extra_mask[:, columns]


class Drafter:
    """Base class: holds validated options; subclasses implement ``propose``."""

    method_name: ClassVar[str] = ""
    Options: ClassVar[type] = type("NoOptions", (), {})
    # Every built-in method samples exactly (its drafts are verified by the engine's exact verifiers); a method
    # that could not would set this False, and ``registry.MethodChoice.check_sampling`` then refuses temperature > 0.
    lossless_sampling: ClassVar[bool] = True
    needs_hidden: ClassVar[bool] = False  # True: the engine hands over the target's hidden states (trained heads)
    training_free: ClassVar[bool] = False  # True: a default ``auto`` candidate (no trained weights or draft model)
    # True: the drafter follows ``state.tokens`` by itself, so it may miss verdicts (``auto`` then skips re-syncing
    # it with ``begin`` after steps another drafter took).
    observe_optional: ClassVar[bool] = False
    draft_forward_passes: int = 0  # forward passes of the drafter's own model (a draft model, a head, layer skip)
    # seconds of the last ``propose`` spent catching up on text it did not draft itself (a head feeding the prompt's
    # pairs, or those of steps it ``witness``-ed): ``auto`` leaves them out of the arm's rate
    foreign_seconds: float = 0.0
    renamed_options: ClassVar[dict[str, str]] = {}  # old option name -> new one, still accepted (with a warning)
    drafts: ClassVar[bool] = True  # False: never proposes (ar), and gets no grammar-forced drafts either
    # True: under sampling, drafting draws from the request's random stream (a draft model's sampled chain, a
    # sampled tree). False: drafts are a function of the tokens, so each emitted token is one draw from p in
    # turn (``verify/speculative.py``), the very draws plain decoding makes: a seed gives the same text as ``ar``.
    draws_from_rng: ClassVar[bool] = False
    # True: drafts on a backend shared by every request on the model (a draft model's), so concurrent requests
    # (``backends.sequences``) take turns running this method.
    exclusive: ClassVar[bool] = False

    def __init__(self, options: Any = None, context: DrafterContext | None = None) -> None:
        self.options = options
        self.context = context

    @classmethod
    def create(cls, options: dict[str, Any] | None = None, context: DrafterContext | None = None) -> "Drafter":
        return resolve_drafter(cls, options).create(context)

    @classmethod
    def kept_across_requests(cls, options: Any) -> bool | None:
        """Whether the method, with these options, carries what it learns over to the next request on the same
        model (see ``kept_state``); None for a method that keeps nothing."""
        return None

    def wants_cost_curve(self) -> bool:
        """Whether ``begin`` reads ``state.cost_curve``; the model then measures the curve (once per machine)
        before the request starts, since measuring runs the target."""
        return False

    def begin(self, state: DecodeState) -> None:
        """Called once per request, after prefill, before the first step."""

    def propose(self, state: DecodeState) -> Proposal:
        raise NotImplementedError

    def peek(self, state: DecodeState) -> Proposal | None:
        """What ``propose`` would give now, without changing the drafter's state (no verdict follows it); None
        where the drafter cannot say without running a step of its own (a draft model, Jacobi iterations).
        ``auto`` scores peeks against the text that follows, so it knows every peekable arm's rate on the same
        text, not only the chosen one's. A drafter whose draft length follows what its verdicts taught it may put
        a longer draft in ``info["probe"]`` (a chain that starts with the proposal's tokens): ``peeked`` is then
        told that one's verdict. A peek costs no verify rows, so it can judge drafts the drafter would not dare
        to propose; without that, a drafter whose estimates fell until it drafted nothing learnt nothing more."""
        return None

    def peeked(self, proposal: Proposal, accepted: int) -> None:
        """Greedy verification would have accepted ``accepted`` tokens of ``proposal``, an earlier ``peek``'s or
        its ``info["probe"]`` (the text that followed decided it): a drafter that learns from its verdicts may
        learn from this one too."""

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        """Called after the engine committed ``verdict``; ``state.tokens`` already includes it."""

    def witness(self, state: DecodeState, verdict: Verdict) -> bool:
        """Called instead of ``observe`` after a step another drafter proposed (``auto``'s other arms): follow the
        committed text without learning from the verdict (it judged another's draft). False (the default): this
        drafter cannot, and ``auto`` re-syncs it with ``begin`` before it drafts again (a trained head cannot be
        re-synced: ``begin`` has no features of the text generated so far)."""
        return False

    def end(self, state: DecodeState) -> None:
        """Called once per request after its last step (not when the caller abandons the request midway)."""

    def summary(self) -> dict:
        """Method-level notes for ``DecodeStats.info``."""
        return {}

    def kept_state(self, state: DecodeState) -> dict | None:
        """A dict that outlives the request: one per (method, options) on the loaded model, for whatever the
        method learns that should carry over to the next request (``auto`` keeps its speed estimates there).
        None when the request keeps no state (``state.method_state`` is None)."""
        store = state.method_state
        return None if store is None else store.setdefault((self.method_name, self.options), {})


def draft_chain(next_logits: Callable[[list[int]], torch.Tensor], feed: list[int], length: int,
                state: DecodeState) -> Proposal:
    """A chain of up to ``length`` tokens from a drafting model, one token per call: ``next_logits(feed)``
    runs the model on ``feed`` (the tokens it has not seen yet; then each drafted token in turn) and returns
    the logits [V] after the last one. Greedy drafts take the argmax; sampled drafts are drawn from
    q = probabilities(logits), and q goes back with the proposal for speculative sampling. Stops after EOS."""
    drafts: list[int] = []
    q_rows: list[torch.Tensor] = []
    for _ in range(length):
        token, q = draw_draft_token(next_logits(feed), state.sampling, state.rng)
        if q is not None:
            q_rows.append(q)
        drafts.append(token)
        if token in state.eos_ids:
            break
        feed = [token]
    return Proposal(tokens=drafts, draft_probs=torch.stack(q_rows) if q_rows else None)

