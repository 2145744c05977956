"""Greedy autoregressive decoding of the AR twin, with its exact key/value cache, reporting ``DecodeStats``.

The twin is the same ``TinyLM`` with a causal mask, trained on the same examples; the benchmark puts this
plain greedy decoding (one token per forward pass) beside the diffusion samplers. It stops at end-of-text.
"""

from __future__ import annotations

import time

import torch

from paradecode.dllm.model import TinyLM
from paradecode.errors import ParadecodeError
from paradecode.stats import DecodeStats


@torch.no_grad()
def ar_generate(model: TinyLM, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], DecodeStats]:
    """Answer token ids (end-of-text excluded) and stats; forward passes count the prefill."""
    if not model.config.causal:
        raise ParadecodeError("ar_generate needs the autoregressive twin (a causal model).")
    if len(prompt_ids) + max_new_tokens > model.max_length:
        raise ParadecodeError(f"prompt ({len(prompt_ids)}) + {max_new_tokens} new tokens exceed the model's "
                              f"context of {model.max_length}.")
    start = time.perf_counter()
    cache = model.new_cache()
    tokens = torch.tensor(prompt_ids)[None]  # [1, P]
    index = torch.arange(len(prompt_ids))
    out: list[int] = []
    forwards, stop = 0, "max_new_tokens"
    while len(out) < max_new_tokens:
        logits = model(tokens, index=index, cache=cache)  # [1, S, V]
        forwards += 1
        token = int(logits[0, -1].argmax())
        if token == model.eot_id:
            stop = "eos"
            break
        out.append(token)
        tokens, index = torch.tensor([[token]]), index[-1:] + 1
    stats = DecodeStats(method="ar-twin", prompt_tokens=len(prompt_ids), new_tokens=len(out),
                        forward_passes=forwards, wall_time_s=time.perf_counter() - start, stop_reason=stop)
    return out, stats
