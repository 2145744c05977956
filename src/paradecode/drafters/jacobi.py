"""Jacobi fixed-point decoding (Santilli et al., 2023): guess a window of future tokens and iterate to convergence.

Greedy decoding is the fixed point of y_i = argmax p(. | prompt, y_<i) for every future position i. Jacobi
decoding keeps a window of ``window`` guesses for the next positions and, each step, scores them all in one
target forward pass (proposed as a chain draft). The engine's verifier accepts the prefix of guesses that
already equal the target's prediction (the converged part) plus the target's own next token, so the output
is exactly greedy decoding. Then ``observe`` applies one Jacobi update: every unconverged guess becomes the
target's prediction at its position (row i of ``verdict.target_logits`` predicts the token after guess i),
shifted past what was committed, and the tail the shift emptied is refilled by ``init``:

- ``pad``: token id 0 (the papers' PAD initialisation; id 0 is a special token in most vocabularies);
- ``repeat-last``: the last token of the committed text plus the kept guesses;
- ``ngram``: the tokens that followed an earlier occurrence of the text's suffix (prompt lookup, with
  ``drafters.ngram_index``), padded with ``repeat-last`` when there is no match.

``variant``:
- ``jacobi``: a sliding window, refilled to ``window`` guesses every step;
- ``gs``: Santilli's Gauss-Seidel-Jacobi, block by block: a block of ``window`` guesses is iterated without
  refilling, shrinking as its prefix converges; only when the whole block has converged does the next block
  start, conditioned on the finished ones (the Gauss-Seidel part). Fewer tokens per forward, fewer guesses.

Under sampling the guesses are deterministic tokens (no q), so the engine's verifier draws every emitted
token from p and only moves on while the draw equals the guess: exact. The update still uses the argmax,
the guess most likely to match a draw. On LLMs a guess rarely converges before its prefix does (expect
about one token per forward with ``pad``/``repeat-last``); ``ngram`` adds prompt-lookup guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

from paradecode.backends.native import row_argmax
from paradecode.drafters.base import DecodeState, Drafter, Proposal
from paradecode.drafters.ngram_index import NgramIndex
from paradecode.errors import ParadecodeError
from paradecode.registry import register
from paradecode.verify.base import Verdict

INITS = ("pad", "repeat-last", "ngram")
VARIANTS = ("jacobi", "gs")
PAD_ID = 0


@dataclass(frozen=True)
class JacobiOptions:
    # Defaults: what measured fastest on a small model on CPU (docs/methods.md); the papers' method is
    # variant=jacobi, init=pad.
    window: int = 3  # guesses scored per step (block size for variant=gs)
    init: str = "ngram"  # how new guesses start: pad | repeat-last | ngram
    variant: str = "gs"  # jacobi (sliding window) | gs (Gauss-Seidel-Jacobi blocks)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ParadecodeError(f"jacobi option window must be >= 1, got {self.window}.")
        if self.init not in INITS:
            raise ParadecodeError(f"jacobi option init must be one of {', '.join(INITS)}, got {self.init!r}.")
        if self.variant not in VARIANTS:
            raise ParadecodeError(f"jacobi option variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}.")


@register("jacobi")
class JacobiDrafter(Drafter):
    Options = JacobiOptions

    def begin(self, state: DecodeState) -> None:
        self.index = NgramIndex(1, 3)
        self.guesses: list[int] = self._fill(state.tokens, [], self.options.window)

    def propose(self, state: DecodeState) -> Proposal:
        return Proposal(tokens=self.guesses[: state.max_draft])

    def observe(self, state: DecodeState, verdict: Verdict) -> None:
        scored = verdict.target_logits.shape[0] - 1  # guesses actually scored (the engine may trim)
        predicted = row_argmax(verdict.target_logits)  # [1+scored]: token after root, guess 0, ...
        accepted_len = len(verdict.accepted)
        # Guess i sits i + 1 positions after the root and row i predicts the position after it. The new root
        # took guess accepted_len's position, so rows after it are the updated guesses for the positions that
        # follow it (the last row one position past the window); unscored guesses keep their old values.
        kept = predicted[accepted_len + 1 :] + self.guesses[scored + 1 :]
        if self.options.variant == "gs":
            kept = kept[: len(self.guesses) - accepted_len - 1]  # the block's remaining positions only
            if kept:  # the block has not converged yet: iterate it again, without refilling
                self.guesses = kept
                return
        self.guesses = kept + self._fill(state.tokens, kept, self.options.window - len(kept))

    def _fill(self, committed: list[int], kept: list[int], length: int) -> list[int]:
        """``length`` new guesses for the positions after ``committed + kept``."""
        if length <= 0:
            return []
        fresh: list[int] = []
        if self.options.init == "pad":
            return [PAD_ID] * length
        if self.options.init == "ngram":
            # committed tokens only enter the index: guesses are never looked up as text
            fresh = self.index.continuation(committed, length, context=committed + kept)
        last = (committed + kept + fresh)[-1]
        return fresh + [last] * (length - len(fresh))

