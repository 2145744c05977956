"""The AR twin as a chain-only ``Backend``, so paradecode's lossless methods (``pld``, ``ngram``, ...) run on it.

``TinyLM`` writes each token's keys at its absolute position in a ``KVCache`` and, being causal, lets a query at
position p attend keys at positions <= p only. The adapter keeps the cache length ``cache_len``: a forward takes
the next T positions, ``rollback`` shrinks the cache (entries after it are cut off the attended keys and, with the
causal mask, could not be seen by earlier positions anyway; the next forward overwrites them). Verification keeps
an accepted prefix of the chain, so ``commit`` only takes ``keep == [0, 1, ..., n-1]`` and is a rollback.
``ar_engine_generate`` decodes one prompt with a registered method through ``paradecode.engine.decode``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from paradecode.backends.base import ForwardOutput, causal_mask
from paradecode.dllm.model import TinyLM
from paradecode.errors import ParadecodeError
from paradecode.stats import DecodeStats


class TwinBackend:
    """A causal ``TinyLM`` behind the backend protocol: chains only, no hidden states, no early exit."""

    supports_tree = False
    dtype = "fp32"
    kernels = "tinylm-fp32"

    def __init__(self, model: TinyLM):
        if not model.config.causal:
            raise ParadecodeError("TwinBackend needs the autoregressive twin (a causal TinyLM), not a dLLM.")
        self.model = model
        self.vocab_size = len(model.config.vocab)
        self.max_length = model.max_length
        self.num_layers = model.config.n_layers
        self.reset()

    @property
    def cache_len(self) -> int:
        return self._len

    def reset(self) -> None:
        self._cache = self.model.new_cache()
        self._len = 0

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, return_hidden: bool = False, exit_layer: int | None = None,
                layers: Sequence[int] | None = None, logits: bool = True) -> ForwardOutput:
        t = token_ids.shape[0]  # token_ids [T]
        expected = torch.arange(self._len, self._len + t)  # [T]
        if positions is not None and not torch.equal(positions.cpu(), expected):
            raise ValueError(f"the AR twin scores chains at the next positions {self._len}.."
                             f"{self._len + t - 1}, got {positions.tolist()}")
        if mask is not None and not torch.equal(mask.cpu(), causal_mask(self._len, t)):
            raise ValueError("the AR twin verifies chains only (a causal mask); it got a tree mask")
        if return_hidden or exit_layer is not None or layers is not None:
            raise ValueError("the AR twin backend returns no hidden states and runs every layer")
        if self._len + t > self.max_length:
            raise ValueError(f"{self._len + t} tokens exceed the twin's context of {self.max_length}")
        out = self.model(token_ids[None], index=expected, cache=self._cache)  # [1, T, V]
        self._len += t
        return ForwardOutput(logits=out[0].float() if logits else None)  # [T, V]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot roll back to {length} tokens; the cache holds {self._len}")
        self._len = length
        self._cache.size = length  # keys from `length` on are no longer attended; the next forward rewrites them

    def commit(self, start: int, keep: Sequence[int]) -> None:
        keep = list(keep)
        if keep != list(range(len(keep))):
            raise ValueError(f"the AR twin backend keeps chain prefixes only (keep = [0, 1, ..., n-1]), got {keep}")
        if start + len(keep) > self._len:
            raise ValueError(f"commit keeps {start + len(keep)} entries, the cache holds {self._len}")
        self.rollback(start + len(keep))


def ar_engine_generate(model: TinyLM, prompt_ids: list[int], max_new_tokens: int, method: str,
                       options: dict | None = None, backend: TwinBackend | None = None
                       ) -> tuple[list[int], DecodeStats]:
    """Answer token ids (end-of-text excluded) and stats from a registered method on the twin, greedy."""
    from paradecode.config import GenerationConfig, SamplingConfig
    from paradecode.engine import decode
    from paradecode.registry import resolve_method

    backend = backend or TwinBackend(model)
    if len(prompt_ids) + max_new_tokens > model.max_length:
        raise ParadecodeError(f"prompt ({len(prompt_ids)}) + {max_new_tokens} new tokens exceed the model's "
                              f"context of {model.max_length}.")
    drafter = resolve_method(method, options).create()  # no loaded model: methods with a draft model refuse
    config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature=0.0))
    stats = DecodeStats(method=f"ar-twin {method}")
    out = [t for step in decode(backend, drafter, prompt_ids, config, eos_ids=frozenset({model.eot_id}),
                                stats=stats) for t in step]
    if out and out[-1] == model.eot_id:
        out = out[:-1]
        stats.new_tokens -= 1  # count answer tokens as ar_generate does (end-of-text excluded)
    stats.forward_passes += len(prompt_ids) > 1  # and count the prefill (the engine counts verification passes)
    return out, stats
