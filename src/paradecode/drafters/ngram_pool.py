"""An LRU-bounded pool of n-grams keyed by their first token (lookahead decoding's candidate store).

``add((k, t1, ..., tm))`` stores the continuation ``(t1, ..., tm)`` under key ``k``; ``candidates(k, g)`` returns
up to ``g`` stored continuations of ``k``, most recently added or used first. Both bounds are LRU: each key keeps
at most ``per_key`` continuations, and the pool keeps at most ``max_keys`` keys, so memory stays bounded however
long the generation runs. Pure Python, no model: lookahead fills it from the prompt, the output and the Jacobi
window's trajectories.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class NgramPool:
    def __init__(self, per_key: int, max_keys: int = 4096) -> None:
        if per_key < 1 or max_keys < 1:
            raise ValueError(f"NgramPool needs per_key >= 1 and max_keys >= 1, got {per_key}, {max_keys}")
        self.per_key, self.max_keys = per_key, max_keys
        # key -> continuations in LRU order (least recent first); the outer dict is LRU over keys too
        self._pool: OrderedDict[int, OrderedDict[tuple[int, ...], None]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(continuations) for continuations in self._pool.values())

    def __contains__(self, ngram: Sequence[int]) -> bool:
        return tuple(ngram[1:]) in self._pool.get(ngram[0], ())

    def add(self, ngram: Sequence[int]) -> None:
        """Store (or refresh) an n-gram of at least two tokens."""
        if len(ngram) < 2:
            raise ValueError(f"an n-gram needs at least two tokens, got {list(ngram)}")
        key, continuation = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        continuations = self._pool.get(key)
        if continuations is None:
            continuations = self._pool[key] = OrderedDict()
            if len(self._pool) > self.max_keys:
                self._pool.popitem(last=False)
        self._pool.move_to_end(key)
        continuations[continuation] = None
        continuations.move_to_end(continuation)
        if len(continuations) > self.per_key:
            continuations.popitem(last=False)

    def add_all(self, tokens: Sequence[int], n: int, start: int = 0) -> None:
        """Store every n-gram of ``tokens`` that begins at index ``start`` or later."""
        for begin in range(max(0, start), len(tokens) - n + 1):
            self.add(tokens[begin : begin + n])

    def candidates(self, key: int, limit: int) -> list[tuple[int, ...]]:
        """Up to ``limit`` continuations of ``key``, most recent first."""
        continuations = self._pool.get(key)
        if not continuations:
            return []
        return list(reversed(continuations))[:limit]
