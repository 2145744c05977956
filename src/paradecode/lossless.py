"""Checking a run against plain autoregressive decoding: greedy output must be the same tokens, for every method.

``compare_with_ar`` decodes the same prompt with ``ar`` and the same settings and says whether the token ids
are identical and, when they are not, where they first differ (``paradecode generate --verify``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class ArComparison:
    identical: bool
    first_difference: int | None  # index of the first output token that differs; None when identical
    ar_tokens_per_second: float

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length when one is a prefix of the
    other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_with_ar(model: Any, prompt: Any, result: Any, **generate_kwargs) -> ArComparison:
    """Decode ``prompt`` with ``ar`` and ``generate_kwargs`` (those that gave ``result``, method and options
    aside) and compare the token ids with ``result``'s."""
    reference = model.generate(prompt, **{**generate_kwargs, "method": "ar", "options": {}})
    difference = first_difference(reference.token_ids, result.token_ids)
    return ArComparison(difference is None, difference, reference.stats.tokens_per_second)
