"""The drafter interface: ``propose(state) -> Proposal`` and ``observe(verdict)``.

A drafter sees the request through ``DecodeState`` and proposes draft tokens as a chain or a tree. It never
runs the target model: the engine scores the proposal in one target forward pass, verifies it, commits the
accepted path and hands the ``Verdict`` back to ``observe``. New needs become optional fields of
``DecodeState`` or ``Proposal``, not new arguments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from paradecode.config import SamplingConfig
from paradecode.errors import ParadecodeError
from paradecode.verify.base import Verdict
from paradecode.verify.sampling import draw_draft_token


@dataclass
class DecodeState:
    tokens: list[int]  # prompt + committed output; the last one is the root the next proposal grows from
    prompt_len: int
    sampling: SamplingConfig
    rng: torch.Generator
    max_draft: int  # most draft tokens worth proposing (what is left of the token budget)
    eos_ids: frozenset[int] = frozenset()
    supports_tree: bool = True  # False: the target backend verifies chains only
    target: Any = None  # the target Backend; only self-speculative drafters (layer skip) run it, by design
    prompt_hidden: torch.Tensor | None = None  # [P-1, D] target hidden states of the prefill (needs_hidden)

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


def tree_parents(parents: list[int]) -> list[int] | None:
    """``parents`` as ``Proposal.parents`` wants them: None when the nodes form a chain (each the child of the
    one before)."""
    return None if all(parent == i - 1 for i, parent in enumerate(parents)) else parents


class Drafter:
    """Base class: holds validated options; subclasses implement ``propose``."""

    method_name: ClassVar[str] = ""
    Options: ClassVar[type] = type("NoOptions", (), {})
    lossless_sampling: ClassVar[bool] = True  # False: the method refuses temperature > 0
    needs_draft_probs_under_sampling: ClassVar[bool] = False
    needs_hidden: ClassVar[bool] = False  # True: the engine hands over the target's hidden states (trained heads)
    drafts: ClassVar[bool] = True  # False: never proposes (ar), and gets no grammar-forced drafts either

    def __init__(self, options: Any = None, context: Any = None) -> None:
        self.options = options
        self.context = context

    @classmethod
    def create(cls, options: dict[str, Any] | None = None, context: Any = None) -> "Drafter":
        return cls(build_options(cls, options or {}), context)

    def begin(self, state: DecodeState) -> None:
        """Called once per request, after prefill, before the first step."""

    def propose(self, state: DecodeState) -> Proposal:
        raise NotImplementedError

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        """Called after the engine committed ``verdict``; ``state.tokens`` already includes it."""

    def summary(self) -> dict:
        """Method-level notes for ``DecodeStats.info``."""
        return {}

    def kept_state(self) -> dict | None:
        """A dict that outlives the request: one per (method, options) on the loaded model the drafter runs
        for (``Model.method_state``), for whatever the method learns that should carry over to the next
        request (``auto`` keeps its speed estimates there). None when the context keeps no state."""
        store = getattr(self.context, "method_state", None)
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


def build_options(cls: type, raw: dict[str, Any]) -> Any:
    """Instantiate ``cls.Options`` (a frozen dataclass) from user-given values, with clear errors."""
    options_type = cls.Options
    if not dataclasses.is_dataclass(options_type):
        if raw:
            raise ParadecodeError(f"method {cls.method_name!r} takes no options, got {sorted(raw)}.")
        return None
    fields = {f.name: f for f in dataclasses.fields(options_type)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ParadecodeError(
            f"method {cls.method_name!r} has no option {', '.join(unknown)}; "
            f"its options are: {', '.join(fields) or 'none'}."
        )
    values = {}
    for name, value in raw.items():
        default = fields[name].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ParadecodeError(f"option {name} of {cls.method_name!r} takes true or false, got {value!r}.")
        if isinstance(default, int) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, int)
        ):
            raise ParadecodeError(f"option {name} of {cls.method_name!r} takes an integer, got {value!r}.")
        if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ParadecodeError(f"option {name} of {cls.method_name!r} takes a number, got {value!r}.")
        values[name] = float(value) if isinstance(default, float) else value
    try:
        return options_type(**values)
    except ParadecodeError:
        raise
    except (TypeError, ValueError) as error:
        raise ParadecodeError(f"bad options for method {cls.method_name!r}: {error}.") from None
