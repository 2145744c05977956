"""``pool``: threshold decoding that also fills a pool of interchangeable positions in one step, once the
model has confirmed that they are interchangeable; it backs off to plain threshold when it has not.

Threshold decoding stalls where several answers are right: when the answer is any arrangement of a multiset
(a shuffle), every open position spreads its probability over the same remaining tokens, no position is
confident, and decoding falls to one token per forward pass. The marginals alone cannot tell such a pool from
positions that must agree (the four cells of an ambiguous 2x2 Latin sub-square have the same marginals, but
diagonal cells must be equal), so the sampler tests the hypothesis on the model before it bets on it:

1. Pool: the open positions below τ whose distributions lie within total variation ``similar`` of their mean
   q (m positions, m >= 2). Every position at or above τ is committed as in ``threshold``.
2. Probe: commit the pool's most confident position with its token c (what one-token-per-step decoding does)
   and predict the model's next distributions if the pool is interchangeable: one copy of c is used up, so
   every other pool position should move to (m q - e_c) / (m - 1).
3. Test, at the next step: if each of those positions is within total variation ``check`` of its prediction,
   fill them all now. Token counts come from the expected counts E_c = sum_j p_j(c) by largest remainders,
   except that a near tie (a remainder within ``margin`` of the best one left out) is not guessed; tokens go
   to positions in descending p_j(c), never one below probability ``floor``; positions left without a token
   stay masked for a later probe. If any position is off its prediction, the pool was not interchangeable
   (committing one changed the others in another way): commit as ``threshold`` for the rest of this decode.

Why it is safe where it fills: if the model's joint over the pool is exchangeable (the same under any reordering
of the positions) and fixes the token counts, every filling with those counts has the probability of the one
that sequential decoding would reach. The probe and test check the first property on the model itself, the
count margin guards the second; both are measured, not assumed (``dllm bench``). The fill is deterministic:
at temperature > 0 only the model's tokens outside the pool are Gumbel samples.

Options: ``threshold`` τ (default 0.9), ``similar`` (0.2), ``check`` (0.15), ``floor`` (0.05), ``margin`` (0.15).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paradecode.dllm.samplers.base import Sampler, StepView, register_sampler, top_by
from paradecode.errors import ParadecodeError


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # [.., V], [.., V] -> [..]
    return 0.5 * (p - q).abs().sum(-1)


def sure_counts(expected: torch.Tensor, total: int, margin: float) -> torch.Tensor:  # [V] -> [V] integers
    """Token counts from expected counts, by largest remainders: each token gets floor(E_c), and the
    ``total - sum floor`` tokens with the largest remainders one more, but only those whose remainder beats
    the best left-out remainder by ``margin`` (a near tie is left for a later step, not guessed)."""
    counts = expected.floor().long()
    remainder = expected - counts
    spare = total - int(counts.sum())
    if spare <= 0:
        return counts
    order = torch.argsort(remainder, descending=True, stable=True)
    left_out = float(remainder[order[spare]]) if spare < order.numel() else float("-inf")
    extra = order[:spare]
    counts[extra[remainder[extra] >= left_out + margin]] += 1
    return counts


def fill_by_counts(probs: torch.Tensor, counts: torch.Tensor, floor: float) -> torch.Tensor:  # [m, V] -> [m]
    """A token for each row in descending p_j(c), at most counts[c] of token c, none below ``floor``;
    -1 for rows left without one."""
    counts, tokens = counts.clone(), torch.full((probs.shape[0],), -1, dtype=torch.long)
    rows, cols = torch.nonzero(probs >= floor, as_tuple=True)  # [k] each: the (row, token) pairs allowed
    order = torch.argsort(probs[rows, cols], descending=True, stable=True)
    for row, token in zip(rows[order].tolist(), cols[order].tolist()):
        if tokens[row] < 0 and counts[token] > 0:
            tokens[row], counts[token] = token, counts[token] - 1
    return tokens


@register_sampler("pool")
class Pool(Sampler):
    @dataclass(frozen=True)
    class Options:
        threshold: float = 0.9
        similar: float = 0.2
        check: float = 0.15
        floor: float = 0.05
        margin: float = 0.15

        def __post_init__(self) -> None:
            for name in ("threshold", "similar", "check", "floor", "margin"):
                if not 0.0 <= getattr(self, name) <= 1.0:
                    raise ParadecodeError(f"{name} must be in [0, 1], got {getattr(self, name)!r}.")

    def __init__(self, options: "Pool.Options"):
        super().__init__(options)
        self.reset()

    def reset(self) -> None:
        self.pending: tuple[list[int], torch.Tensor] | None = None  # probed pool: offsets, predictions [m-1, V]
        self.backed_off = False

    def choose(self, view: StepView) -> tuple[torch.Tensor, torch.Tensor]:
        confident = view.confidence >= self.options.threshold  # [n]
        tokens = view.x0.clone()  # [n]
        filled = self._test(view) if self.pending is not None else None
        if filled is not None:
            chosen = confident | (filled >= 0)
            tokens = torch.where(filled >= 0, filled, tokens)
        else:
            chosen = confident.clone()
            probe = None if self.backed_off else self._probe(view, confident)
            if probe is not None:
                chosen[probe] = True
        if not chosen.any():
            chosen[top_by(view.confidence, 1)] = True
        indices = torch.nonzero(chosen).flatten()
        return indices, tokens[indices]

    def _probe(self, view: StepView, confident: torch.Tensor) -> int | None:
        """Find the pool, commit its most confident position, remember the prediction for the rest."""
        open_ = torch.nonzero(~confident).flatten()  # [u]
        if open_.numel() < 2 or view.positions is None:
            return None
        members = open_
        for _ in range(2):  # the mean of all open positions, then of those near it
            mean = view.probs[members].mean(0)  # [V]
            members = open_[total_variation(view.probs[open_], mean) <= self.options.similar]
            if members.numel() < 2:
                return None
        mean, m = view.probs[members].mean(0), members.numel()  # [V]
        probe = int(members[torch.argmax(view.confidence[members])])
        rest = members[members != probe]
        used = torch.zeros_like(mean)
        used[view.x0[probe]] = 1.0
        predicted = ((m * mean - used).clamp_min(0) / (m - 1)).expand(rest.numel(), -1)  # [m-1, V]
        self.pending = (view.positions[rest].tolist(), predicted / predicted.sum(-1, keepdim=True))
        return probe

    def _test(self, view: StepView) -> torch.Tensor | None:
        """[n] tokens for the probed pool (-1 elsewhere) when the model confirmed the prediction, else None."""
        offsets, predicted = self.pending
        self.pending = None
        where = {p: i for i, p in enumerate(view.positions.tolist())}
        if not all(p in where for p in offsets):  # a new block, or positions decided otherwise
            return None
        rows = torch.tensor([where[p] for p in offsets])  # [m-1]
        probs = view.probs[rows]  # [m-1, V]
        if bool((total_variation(probs, predicted) > self.options.check).any()):
            self.backed_off = True
            return None
        counts = sure_counts(probs.sum(0), rows.numel(), self.options.margin)  # [V]
        filled = torch.full_like(view.x0, -1)
        filled[rows] = fill_by_counts(probs, counts, self.options.floor)
        return filled
