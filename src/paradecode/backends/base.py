"""The backend protocol: the only code that runs a model.

A backend owns a KV cache holding the keys/values of ``cache_len`` tokens. ``forward`` appends T new tokens at
given positions, each attending to the cache and to the new tokens its mask allows, so a chain or a whole tree
of drafts is scored in one pass. After verification the engine keeps one path with ``commit`` (or drops the
tail with ``rollback``).

Masks are boolean, ``True`` = may attend. A forward over T new tokens with ``cache_len`` C takes a mask of shape
``[T, C + T]``; ``None`` means ordinary causal attention.

A backend whose passes are shared with other requests (``backends.sequences.Sequence``) also has ``load()``:
what the others put into each shared pass (``Load``), so a draft schedule can weigh its own rows against the
whole pass (``drafters.schedule``). A backend without it runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, Sequence, Union

import torch

from paradecode.tree_layout import tree_depths, tree_mask  # noqa: F401  (backends import them from here)


# ``forward(logits=ARGMAX)``: the caller reads nothing of the logits but each row's argmax (greedy verification).
# A backend may then return logits whose argmax (index and value) is exact and whose other entries are close
# approximations (the native int8 LM head skips its residual rows for columns that cannot win); any other backend
# returns its full logits. Never for sampling, log-probabilities or masked logits.
ARGMAX = "argmax"
Logits = Union[bool, Literal["argmax"]]


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None  # [T, vocab] float32; None when the caller asked for none (a prefill)
    hidden: torch.Tensor | None = None  # [T, hidden] last hidden state (before the LM head), when asked
    aux: torch.Tensor | None = None  # [T, len(aux_layers) * hidden] the residual stream entering each aux layer


@dataclass(frozen=True)
class Load:
    """What the other requests sharing a backend's passes put into each pass, as moving means over their recent
    passes: ``rows`` scored and ``tokens`` committed. ``Load()``: the request runs alone."""

    rows: float = 0.0
    tokens: float = 0.0
    requests: int = 0  # how many other requests share the passes


class Backend(Protocol):
    vocab_size: int
    max_length: int  # most tokens the cache (and the model's context) can hold
    supports_tree: bool  # False: only causal masks, drafters must propose chains
    num_layers: int
    dtype: str  # the weights' format, one of paradecode.backends.DTYPES (or a torch dtype's name)

    @property
    def kernels(self) -> str:
        """Names what the forward runs on (dtype, kernels, build), so caches of measured speed re-measure when
        it changes."""

    @property
    def cache_len(self) -> int: ...

    def reset(self) -> None:
        """Empty the cache (start a new request)."""

    def forward(
        self,
        token_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor | None = None,  # [T] int64; None: cache_len .. cache_len+T-1
        mask: torch.Tensor | None = None,  # [T, cache_len+T] bool; None: causal
        *,
        return_hidden: bool = False,
        exit_layer: int | None = None,  # run only the first `exit_layer` layers, then norm + LM head
        layers: Sequence[int] | None = None,  # or run only these layers (ascending), then norm + LM head
        logits: Logits = True,  # False: skip the LM head (a prefill whose logits nobody reads); ARGMAX: see above
        aux_layers: Sequence[int] = (),  # ascending layer indices: output aux holds each one's input (EAGLE-3)
    ) -> ForwardOutput: ...

    def rollback(self, length: int) -> None:
        """Forget everything after the first ``length`` cached tokens."""

    def commit(self, start: int, keep: Sequence[int]) -> None:
        """Keep cache entries ``start + i`` for i in ``keep`` (ascending), moved to ``start, start+1, ...``;
        drop every other entry after ``start``."""


class SlotCache:
    """The bookkeeping of a cache whose first ``_len`` slots hold the sequence: ``cache_len``, ``reset``,
    ``rollback`` and ``commit``; a subclass says how kept entries move (``_move``)."""

    _len: int = 0

    @property
    def cache_len(self) -> int:
        return self._len

    def reset(self) -> None:
        self._len = 0

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot roll back to {length} tokens; the cache holds {self._len}")
        self._len = length

    def commit(self, start: int, keep: Sequence[int]) -> None:
        keep = list(keep)
        if keep and (start + keep[-1] >= self._len or keep[0] < 0):
            raise ValueError(f"commit keeps entries up to {start + keep[-1]}, the cache holds {self._len}")
        if keep != list(range(len(keep))):
            self._move(torch.tensor(keep, dtype=torch.long) + start, start)
        self._len = start + len(keep)

    def _move(self, kept: torch.Tensor, start: int) -> None:
        """Copy the entries of slots ``kept`` [K] (ascending, each >= its target) to ``start, start+1, ...``."""
        raise NotImplementedError


def causal_mask(cache_len: int, t: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[T, cache_len + T] mask: every new token sees the cache and the new tokens up to itself."""
    mask = torch.ones(t, cache_len + t, dtype=torch.bool, device=device)
    mask[:, cache_len:] = torch.tril(mask[:, cache_len:])
    return mask

def check_aux_layers(aux_layers: Sequence[int], run: Sequence[int]) -> None:
    """``aux_layers`` must be ascending indices of layers the pass runs (their inputs are what it returns)."""
    if any(b <= a for a, b in zip(aux_layers, aux_layers[1:])) or not set(aux_layers) <= set(run):
        raise ValueError(f"aux_layers must be ascending indices of layers the pass runs, got {list(aux_layers)}")
