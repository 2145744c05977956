"""Verification: pure functions (draft, q or None, target logits/probabilities, RNG) -> ``Verdict``.

Notation, fixed for the whole package: **p** is the target model's distribution, **q** the drafter's.
"""

from paradecode.verify.base import Verdict
from paradecode.verify.greedy import verify_greedy
from paradecode.verify.speculative import verify_speculative

__all__ = ["Verdict", "verify_greedy", "verify_speculative"]
