"""The child process the ``llamacpp`` peers run in: ``python llamacpp_worker.py`` (this file, as a script).

llama.cpp runs native code compiled for some CPU; a build for another CPU dies with SIGILL inside
``llama_decode``, and that would take the benchmark with it. So the peers (``paradecode.benchmark.llamacpp``)
load the GGUF in this separate process and talk to it in JSON lines, one request and one reply each:

    -> {"op": "load", "config": {"engine": "llamacpp", "model_path": ..., "n_ctx": ..., "n_threads": ...,
                                 "draft": null | {"num_pred_tokens": N, "max_ngram_size": M}}}
    <- {"ok": true}
    -> {"op": "generate", "prompt_ids": [...], "max_new_tokens": N, "stop_ids": [...]}
    <- {"ok": true, "token_ids": [...], "wall_time_s": t, "forward_passes": ..., "draft_lengths": [...], ...}
    <- {"ok": false, "error": "..."}   (a Python error; the worker keeps serving)

``wall_time_s`` is measured here, from just before the cache reset and prefill to the last token taken, so
the pipe and JSON overhead are not charged to llama.cpp: the same span the benchmark times for paradecode's
own methods (prompt token ids in, output token ids out). End of input ends the worker.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, TextIO


class LlamaCppEngine:
    """llama-cpp-python on a GGUF file: greedy, plain or with its prompt-lookup draft model."""

    def __init__(self, config: dict) -> None:
        import llama_cpp

        self.draft = None
        if config.get("draft"):
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            self.draft = _RecordedDraft(LlamaPromptLookupDecoding(**config["draft"]))
        # logits_all with a draft model: llama-cpp-python (0.3.36) verifies drafts from every position's logits
        # but sizes that buffer by this argument, so without it any context past n_batch (512) tokens fails
        # ("could not broadcast input array"). It costs memory: n_ctx x vocabulary floats, touched as the
        # context grows (see docs/benchmark.md)
        self.llm = llama_cpp.Llama(model_path=config["model_path"], n_ctx=config["n_ctx"], verbose=False,
                                   n_threads=config["n_threads"], seed=0, draft_model=self.draft,
                                   logits_all=self.draft is not None)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: list[int]) -> dict:
        stop = set(stop_ids) or {self.llm.token_eos()}
        if self.draft:
            self.draft.calls.clear()
        tokens: list[int] = []
        start = time.perf_counter()
        self.llm.reset()  # no prefix reuse from the previous request: every method pays its own prefill
        for token in self.llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if token in stop or len(tokens) >= max_new_tokens:
                break
        wall = time.perf_counter() - start
        reply = dict(token_ids=tokens, wall_time_s=wall)
        if self.draft is None:  # plain decoding: each token comes from one forward pass (the first: prefill)
            return dict(reply, forward_passes=len(tokens), draft_lengths=[0] * len(tokens),
                        accepted_lengths=[0] * len(tokens), accepted_per_step=[1] * len(tokens))
        return dict(reply, **self.draft.steps(len(prompt_ids), len(tokens)))


class _RecordedDraft:
    """Wraps llama-cpp-python's draft model and records each call: the context length it saw and how many
    tokens it drafted. ``Llama.generate`` calls it once before each verification forward pass (after the
    prefill's first token), so the calls give the passes, the draft lengths and the tokens each step kept."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int]] = []  # (context length incl. committed tokens, drafted tokens)

    def __call__(self, input_ids, /, **kwargs: Any):
        drafts = self.inner(input_ids, **kwargs)
        self.calls.append((int(len(input_ids)), int(len(drafts))))
        return drafts

    def steps(self, prompt_len: int, new_tokens: int) -> dict:
        # step 0 is the prefill (one token, nothing drafted); step k >= 1 verified call k's drafts and kept
        # the tokens up to the next call's context (the last step: up to where we stopped taking tokens)
        ends = [length for length, _ in self.calls[1:]] + [prompt_len + new_tokens]
        committed = [1] + [end - length for (length, _), end in zip(self.calls, ends)]
        drafted = [0] + [n for _, n in self.calls]
        return dict(forward_passes=1 + len(self.calls), draft_lengths=drafted,
                    accepted_lengths=[min(c - 1, d) for c, d in zip(committed, drafted)],
                    accepted_per_step=committed)


ENGINES: dict[str, Callable[[dict], Any]] = {"llamacpp": LlamaCppEngine}


def serve(engines: dict[str, Callable[[dict], Any]], requests: TextIO, replies: TextIO) -> None:
    """Answer JSON-line requests until end of input."""
    engine = None
    for line in requests:
        request = json.loads(line)
        try:
            if request["op"] == "load":
                engine = engines[request["config"]["engine"]](request["config"])
                reply: dict = {}
            else:
                reply = engine.generate(request["prompt_ids"], request["max_new_tokens"], request["stop_ids"])
        except Exception as error:  # reported to the parent, which records it; the worker serves on
            replies.write(json.dumps(dict(ok=False, error=f"{type(error).__name__}: {error}")) + "\n")
        else:
            replies.write(json.dumps(dict(reply, ok=True)) + "\n")
        replies.flush()


def main(engines: dict[str, Callable[[dict], Any]] = ENGINES) -> None:
    # the replies get a private copy of stdout; fd 1 itself goes to stderr, so native code that prints
    # cannot corrupt the protocol
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(engines, sys.stdin, replies)


if __name__ == "__main__":
    main()
