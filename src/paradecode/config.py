"""Explicit, frozen configuration for sampling and generation.

Temperature 0 means greedy decoding. The same ``SamplingConfig`` turns target logits into p and draft logits
into q (see ``paradecode.verify.sampling``), so both distributions are processed identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from paradecode.errors import ParadecodeError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise ParadecodeError(
                f"temperature must be a number >= 0 (0 means greedy), got {self.temperature!r}."
            )
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ParadecodeError(f"top-k must be an integer >= 0 (0 turns it off), got {self.top_k!r}.")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ParadecodeError(f"top-p must be in (0, 1] (1 turns it off), got {self.top_p!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()
    stop_on_eos: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ParadecodeError(f"max new tokens must be a positive integer, got {self.max_new_tokens!r}.")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ParadecodeError(f"stop strings must be non-empty strings, got {list(self.stop)!r}.")
