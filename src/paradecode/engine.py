"""The decoding loop: propose -> verify -> commit -> observe, one target forward pass per step.

Invariant: the backend's cache holds every token of ``state.tokens`` except the last one, the *root*. A step
feeds the root followed by the drafted nodes (and any extra inputs) in one forward pass, so row 0 of the
logits predicts the token after the root and row 1+i the token after node i. Verification picks the accepted
path; the cache keeps the root plus that path, and the target's own next token becomes the new root.
Plain autoregressive decoding is the same loop with an empty proposal. A drafter with ``needs_hidden`` (trained
heads) also gets the target's last hidden states: the prefill's on ``DecodeState.prompt_hidden`` and each
step's rows (root, then nodes) on ``Verdict.target_hidden``; a drafter with ``aux_layers`` (EAGLE-3 heads) gets
the inputs of those target layers there instead, side by side (``ForwardOutput.aux``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from paradecode.backends.base import ARGMAX, Backend, Logits, causal_mask
from paradecode.config import GenerationConfig
from paradecode.constraints.speculative import Constraint
from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.errors import ParadecodeError
from paradecode.stats import DecodeStats, StepRecord
from paradecode.text import IncrementalText, stop_cut
from paradecode.tree_layout import tree_depths, tree_mask
from paradecode.verify import Verdict, verify_greedy, verify_speculative
from paradecode.verify.sampling import probabilities


def decode(
    backend: Backend,
    drafter: Drafter,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    *,
    eos_ids: frozenset[int] = frozenset(),
    text_of: Callable[[list[int]], str] | None = None,  # decodes output tokens; needed for stop strings
    stats: DecodeStats | None = None,
    cost_curve: dict[int, float] | None = None,  # see DecodeState.cost_curve
    method_state: dict | None = None,  # see DecodeState.method_state
    on_commit: Callable[[list[int], torch.Tensor], None] | None = None,
    constraint: Constraint | None = None,
) -> Iterator[list[int]]:
    """Yield the tokens each step commits; fills ``stats`` (pass one in to read it afterwards). ``on_commit``
    (e.g. ``logprobs.LogprobReader``) gets each step's committed tokens and the target logits that predicted
    them ([K, V]: the verify pass's rows of the root and of each accepted node). ``constraint`` (structured
    output) masks the target's logits before verification; see ``constraints.speculative``."""
    stats = stats if stats is not None else DecodeStats()
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ParadecodeError("the prompt is empty: give at least one token of text.")
    if len(prompt) >= backend.max_length:
        raise ParadecodeError(
            f"the prompt has {len(prompt)} tokens but the model's context holds {backend.max_length}: "
            "shorten the prompt."
        )
    if config.stop and text_of is None:
        raise ValueError("stop strings need text_of to decode the output")
    output_text = IncrementalText(text_of) if config.stop else None  # the output's text, for the stop strings
    sampling = config.sampling
    rng = torch.Generator().manual_seed(sampling.seed if sampling.seed is not None else int(time.time_ns() % 2**63))
    stats.method = stats.method or drafter.method_name
    stats.prompt_tokens = len(prompt)

    start = time.perf_counter()
    backend.reset()
    hidden = Features.of(drafter)  # trained heads read the target's hidden states (prefill and every step)
    prompt_hidden = None
    if len(prompt) > 1:  # the prompt's last token is fed by the first step
        prompt_hidden = hidden.read(backend.forward(torch.tensor(prompt[:-1], dtype=torch.long), logits=False,
                                                    **hidden.arguments))
    state = DecodeState(
        tokens=list(prompt),
        prompt_len=len(prompt),
        sampling=sampling,
        rng=rng,
        max_draft=0,
        eos_ids=frozenset(eos_ids) if config.stop_on_eos else frozenset(),
        supports_tree=backend.supports_tree,
        target=backend,
        prompt_hidden=prompt_hidden,
        cost_curve=cost_curve,
        method_state=method_state,
        load=getattr(backend, "load", None),  # shared passes (backends.sequences): the others' rows and tokens
    )
    drafter.begin(state)
    stats.prefill_time_s = time.perf_counter() - start
    # greedy verification (and the drafters that look at the target's predictions) reads each row's argmax only,
    # unless the grammar masks the logits or the caller reads their log-probabilities
    verify_logits = ARGMAX if sampling.greedy and constraint is None and on_commit is None else True

    while True:
        step_start = time.perf_counter()
        remaining = config.max_new_tokens - state.output_len
        room = backend.max_length - len(state.tokens)  # tokens that still fit in the context
        state.max_draft = max(0, min(remaining, room) - 1)
        proposal = drafter.propose(state)
        if constraint is not None and drafter.drafts:
            proposal = constraint.with_forced(proposal, state.max_draft)
        proposal = _fit(proposal, state.max_draft, room, backend.supports_tree)
        allowed = constraint.masks(proposal) if constraint is not None else None  # [1+N, V]
        verdict = _score_and_verify(backend, proposal, state, hidden, allowed, verify_logits)
        new_tokens = verdict.accepted_tokens + [verdict.next_token]
        new_tokens, stop_reason = _cut(new_tokens, state, config, output_text, room)
        if output_text is not None:
            output_text.extend(new_tokens)
        if on_commit is not None:
            rows = [0] + [1 + i for i in verdict.accepted]
            on_commit(new_tokens, verdict.target_logits[rows[: len(new_tokens)]])
        state.tokens.extend(new_tokens)
        if constraint is not None:
            constraint.commit(new_tokens)
        verdict.committed_tokens = new_tokens
        drafter.observe(state, verdict)

        stats.forward_passes += 1
        stats.new_tokens += len(new_tokens)
        stats.drafted_tokens += len(proposal.tokens)
        stats.accepted_tokens += len(verdict.accepted)
        stats.steps.append(
            StepRecord(
                drafted=list(proposal.tokens),
                parents=None if proposal.parents is None else list(proposal.parents),
                accepted=list(verdict.accepted),
                next_token=verdict.next_token,
                bonus=verdict.bonus,
                committed=len(new_tokens),
                time_s=time.perf_counter() - step_start,
                info=proposal.info,
            )
        )
        stats.wall_time_s = time.perf_counter() - start
        yield new_tokens
        if stop_reason is not None:
            break

    stats.stop_reason = stop_reason
    drafter.end(state)
    stats.draft_forward_passes = drafter.draft_forward_passes
    stats.info.update(drafter.summary())
    if constraint is not None:
        stats.info.update(constraint.summary())
    stats.wall_time_s = time.perf_counter() - start


def _fit(proposal: Proposal, max_draft: int, room: int, supports_tree: bool) -> Proposal:
    """Trim a proposal to the token budget and the cache; refuse trees the backend cannot verify."""
    n = len(proposal.tokens)
    if proposal.parents is not None and not supports_tree:
        raise RuntimeError(f"drafter proposed a tree, but the backend verifies chains only")
    if proposal.parents is None:
        keep = list(range(min(n, max_draft)))
    else:
        depths = tree_depths(proposal.parents)
        keep = [i for i in range(n) if depths[i] <= max_draft][:room]  # a wide tree may outgrow the cache
    if len(keep) < n:
        proposal.keep(keep)  # parents come first: ancestors are kept too
    extras = len(proposal.extra_tokens or ())
    if len(proposal.tokens) + extras > room:
        if extras:
            proposal.extra_tokens = proposal.extra_positions = proposal.extra_mask = None
        if len(proposal.tokens) > room:
            raise RuntimeError(f"proposal of {len(proposal.tokens)} tokens exceeds the {room} cache slots left")
    return proposal


@dataclass(frozen=True)
class Features:
    """What of the target's hidden states a drafter reads: none, the last (``needs_hidden``), or the inputs of
    its ``aux_layers`` (EAGLE-3); the forward's arguments and where the output holds them."""

    wanted: bool = False
    aux_layers: tuple[int, ...] = ()

    @classmethod
    def of(cls, drafter) -> "Features":
        return cls(drafter.needs_hidden, tuple(getattr(drafter, "aux_layers", ())) if drafter.needs_hidden else ())

    @property
    def arguments(self) -> dict:
        return dict(aux_layers=self.aux_layers) if self.aux_layers else dict(return_hidden=self.wanted)

    def read(self, out) -> torch.Tensor | None:
        return out.aux if self.aux_layers else out.hidden if self.wanted else None


def _score_and_verify(backend: Backend, proposal: Proposal, state: DecodeState, hidden: Features = Features(),
                      allowed: torch.Tensor | None = None, logits: Logits = True) -> Verdict:
    cache_len = len(state.tokens) - 1
    root = state.tokens[-1]
    n = len(proposal.tokens)
    parents = proposal.parents
    ids = [root] + list(proposal.tokens)
    if parents is None:
        positions: Sequence[int] = range(cache_len, cache_len + 1 + n)
        mask = None
    else:
        positions = [cache_len] + [cache_len + d for d in tree_depths(parents)]
        mask = tree_mask([-1] + [p + 1 for p in parents], cache_len)  # nodes' parents shift by the root
    extras = proposal.extra_tokens or []
    if extras:
        ids += list(extras)
        positions = list(positions) + list(proposal.extra_positions)
        base = mask if mask is not None else causal_mask(cache_len, 1 + n)
        extra_rows = torch.ones(len(extras), cache_len + len(ids), dtype=torch.bool)  # [E, C + 1 + N + E]
        extra_rows[:, cache_len:] = proposal.extra_mask
        mask = torch.cat([torch.cat([base, torch.zeros(1 + n, len(extras), dtype=torch.bool)], dim=1), extra_rows])
    # a chain's positions follow the cache (the backends' default, None: the native pass sets them without a torch
    # call, which cost ~1% of a SmolLM2-135M step here, paid right after the forward has emptied the caches)
    position_ids = None if isinstance(positions, range) else torch.tensor(positions, dtype=torch.long)
    out = backend.forward(torch.tensor(ids, dtype=torch.long), position_ids, mask, logits=logits, **hidden.arguments)
    logits = out.logits if not extras else out.logits[: 1 + n]  # [1+N, V] (a slice is a torch call a step)
    if allowed is not None:  # structured output: verify against the grammar's share of the distribution
        logits = logits.masked_fill(~allowed, float("-inf"))
    if state.sampling.greedy:
        verdict = verify_greedy(proposal.tokens, parents, logits)
    else:
        target_probs = probabilities(logits, state.sampling)  # [1+N, V]
        draft_probs = proposal.draft_probs
        if draft_probs is not None and draft_probs.shape[-1] != target_probs.shape[-1]:
            draft_probs = _match_vocab(draft_probs, target_probs.shape[-1])
        verdict = verify_speculative(proposal.tokens, parents, draft_probs, target_probs, state.rng)
    backend.commit(cache_len, [0] + [1 + i for i in verdict.accepted])
    verdict.target_logits = logits
    verdict.extra_logits = out.logits[1 + n :] if extras else None
    features = hidden.read(out)
    verdict.target_hidden = features[: 1 + n] if features is not None else None  # [1+N, D] (or [1+N, A*D])
    return verdict


def _match_vocab(probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """Pad or cut q's vocabulary to the target's (tokenizers match; embedding tables may be padded)."""
    if probs.shape[-1] > vocab:
        return probs[..., :vocab]
    return torch.nn.functional.pad(probs, (0, vocab - probs.shape[-1]))


def _cut(
    new_tokens: list[int],
    state: DecodeState,
    config: GenerationConfig,
    output_text: IncrementalText | None,
    room: int,
) -> tuple[list[int], str | None]:
    """Cut the step's tokens at EOS, the token budget, the context or a stop string, whichever comes first."""
    reason = None
    for i, token in enumerate(new_tokens):
        if token in state.eos_ids:
            new_tokens, reason = new_tokens[: i + 1], "eos"
            break
    remaining = config.max_new_tokens - state.output_len
    if len(new_tokens) >= remaining:
        new_tokens, reason = new_tokens[:remaining], reason or "max_new_tokens"
    if len(new_tokens) >= room:
        new_tokens, reason = new_tokens[:room], reason or "context"
    if config.stop:
        cut = stop_cut(output_text, config.stop, new_tokens)
        if cut is not None:
            return new_tokens[:cut], "stop"
    return new_tokens, reason
