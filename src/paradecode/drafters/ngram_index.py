"""Where each n-gram of a growing token list last occurred: the lookup behind ``pld``, ``pld-tree`` and
``jacobi``'s n-gram guesses.

The index is updated incrementally (only the n-grams ending at positions not yet indexed), so a step costs
O(max_n) dictionary operations, not a scan of the context. A continuation is what followed an earlier
occurrence of the longest suffix that occurred before; the suffix is never matched against itself.
"""

from __future__ import annotations


class NgramOccurrences:
    """Maps each n-gram (min_n <= n <= max_n) of a growing token list to the ends of its latest ``keep``
    occurrences."""

    def __init__(self, min_n: int, max_n: int, keep: int = 1) -> None:
        self.min_n, self.max_n, self.keep = min_n, max_n, keep
        self.ends: dict[tuple[int, ...], list[int]] = {}  # oldest first, at most `keep`
        self.indexed = 0  # n-grams ending before this position are indexed

    def update(self, tokens: list[int], upto: int) -> None:
        """Index the n-grams ending at positions [indexed, upto)."""
        for end in range(self.indexed, upto):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                ends = self.ends.setdefault(tuple(tokens[end - n + 1 : end + 1]), [])
                ends.append(end)
                if len(ends) > self.keep:
                    del ends[0]
        self.indexed = max(self.indexed, upto)

    def continuations(self, tokens: list[int], length: int, limit: int,
                      context: list[int] | None = None) -> list[list[int]]:
        """Up to ``limit`` distinct continuations (of up to ``length`` tokens of ``tokens``) of the suffix of
        ``context`` (default: ``tokens`` itself), best first: longest suffix, then latest occurrence."""
        self.update(tokens, len(tokens) - 1)  # never match the suffix against itself
        context = tokens if context is None else context
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            for end in reversed(self.ends.get(tuple(context[-n:]), ())):
                continuation = tuple(tokens[end + 1 : end + 1 + length])
                if continuation and continuation not in seen:
                    seen.add(continuation)
                    found.append(list(continuation))
                    if len(found) == limit:
                        return found
        return found


class NgramIndex(NgramOccurrences):
    """The latest occurrence of each n-gram only, and the one continuation it gives."""

    def __init__(self, min_n: int, max_n: int) -> None:
        super().__init__(min_n, max_n, keep=1)

    def continuation(self, tokens: list[int], length: int, context: list[int] | None = None) -> list[int]:
        """Tokens that followed the latest earlier occurrence of the longest matching suffix of ``context``
        (default: ``tokens``)."""
        found = self.continuations(tokens, length, 1, context)
        return found[0] if found else []
