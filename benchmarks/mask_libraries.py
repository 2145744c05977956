"""Time per token of the grammar-mask libraries paradecode could use, on a model's own vocabulary.

For each JSON schema of the structured task set (benchmarks/structured/tasks.jsonl), the task's example answer
is tokenized with the model's tokenizer; each library compiles the schema, then for every token computes the
mask of allowed next tokens (a bitmask over the whole vocabulary) and accepts the token. Reported per library:
compile time per schema, mask time per token (mean and 95th percentile), accept time per token, and whether it
accepted every example (a library that rejects a valid answer is wrong for that schema). Libraries that are
not installed are skipped with a note, so this runs wherever any of them is:

    pip install llguidance xgrammar outlines-core   # xgrammar: add --no-deps apache-tvm-ffi on a CPU machine
    nice -n 0 python benchmarks/mask_libraries.py --model smollm2-135m --out results/mask-libraries.json

Single-threaded (torch.set_num_threads(1)). ``--with-forward`` runs a one-token forward of the model before each
mask, as decoding does, which cools the caches: the mask's time as decoding sees it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

TASKS = Path(__file__).resolve().parent / "structured" / "tasks.jsonl"
SEPARATORS = (", ", ": ")  # how the examples are written, as paradecode's JSON grammars write them


def example_tokens(tokenizer, example) -> list[int]:
    return tokenizer.encode(json.dumps(example, separators=SEPARATORS, ensure_ascii=False), add_special_tokens=False)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, eos: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll, self.torch_ops = llguidance, llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=eos)
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, self.tokenizer.vocab_size)

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": SEPARATORS[0],
                              "key_separator": SEPARATORS[1]})
        matcher = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def mask(self, matcher) -> None:
        self.torch_ops.fill_next_token_bitmask(matcher, self.bitmask, 0)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, eos: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                     separators=SEPARATORS)
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, matcher) -> None:
        matcher.fill_next_token_bitmask(self.bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer, eos: int) -> None:
        import outlines_core
        import torch
        from outlines_core.json_schema import build_regex_from_schema

        self.oc, self.build_regex = outlines_core, build_regex_from_schema
        from paradecode.logprobs import TokenText

        byte_of = TokenText(tokenizer).byte_of  # byte-level BPE: token text -> bytes
        vocabulary: dict[bytes, list[int]] = {}
        for text, token in tokenizer.get_vocab().items():
            if token == eos or token in tokenizer.all_special_ids:
                continue
            vocabulary.setdefault(bytes(byte_of[c] for c in text), []).append(token)
        self.vocabulary = outlines_core.Vocabulary(eos, vocabulary)
        self.bitmask = torch.zeros((len(tokenizer) + 31) // 32, dtype=torch.int32)

    def compile(self, schema: dict):
        # outlines-core writes "," and ":" with a whitespace pattern around them: one optional space
        regex = self.build_regex(json.dumps(schema), whitespace_pattern="[ ]?")
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary), max_rollback=64)

    def mask(self, guide) -> None:
        guide.write_mask_into(self.bitmask.data_ptr(), self.bitmask.numel(), 4)

    def accept(self, guide, token: int) -> bool:
        try:
            guide.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False


def measure(library, tasks, tokenizer, forward=None) -> dict:
    """``forward``: a one-token model forward to run before each mask, as decoding does (it evicts the
    matcher's data from the caches)."""
    compile_s, mask_s, accept_s, rejected = [], [], [], []
    for task in tasks:
        start = time.perf_counter()
        matcher = library.compile(task["schema"])
        compile_s.append(time.perf_counter() - start)
        for token in example_tokens(tokenizer, task["example"]):
            if forward is not None:
                forward(token)
            start = time.perf_counter()
            library.mask(matcher)
            mid = time.perf_counter()
            ok = library.accept(matcher, token)
            accept_s.append(time.perf_counter() - mid)
            mask_s.append(mid - start)
            if not ok:
                rejected.append(task["id"])
                break
    mask_s.sort()
    return dict(library=library.name, schemas=len(tasks), tokens=len(mask_s),
                compile_ms_mean=1e3 * statistics.mean(compile_s), compile_ms_max=1e3 * max(compile_s),
                mask_us_mean=1e6 * statistics.mean(mask_s), mask_us_p50=1e6 * mask_s[len(mask_s) // 2],
                mask_us_p95=1e6 * mask_s[int(0.95 * (len(mask_s) - 1))],
                accept_us_mean=1e6 * statistics.mean(accept_s), rejected_examples=rejected)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="built-in model or HF directory (its tokenizer)")
    parser.add_argument("--tasks", default=str(TASKS), help="structured task set (.jsonl with schema and example)")
    parser.add_argument("--libraries", default="llguidance,xgrammar,outlines-core")
    parser.add_argument("--with-forward", action="store_true",
                        help="run a one-token forward of the model (paradecode, its default dtype) before each "
                             "mask, as decoding does: the mask's time in decoding, caches cooled by the forward")
    parser.add_argument("--out", help="write the rows as JSON here too")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from paradecode.models import resolve

    torch.set_num_threads(1)
    model_dir, _ = resolve(args.model, None)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tasks = [json.loads(line) for line in Path(args.tasks).read_text().splitlines() if line.strip()]
    eos = tokenizer.eos_token_id
    forward = None
    if args.with_forward:
        import paradecode

        backend = paradecode.load(args.model).backend
        backend.reset()
        backend.forward(torch.arange(32, dtype=torch.long))

        def forward(token: int) -> None:  # one decoding step's forward, then forget it (the cache stays short)
            backend.forward(torch.tensor([token]))
            backend.rollback(32)
    classes = {c.name: c for c in (LLGuidance, XGrammar, OutlinesCore)}
    rows = []
    print(f"{len(tasks)} schemas, vocabulary {len(tokenizer)} ({args.model})")
    print(f"{'library':<14} {'compile ms':>11} {'mask us mean':>13} {'p50':>8} {'p95':>8} {'accept us':>10}  rejected")
    for name in args.libraries.split(","):
        try:
            library = classes[name](tokenizer, eos)
        except ImportError as error:
            print(f"{name:<14} not installed ({error})")
            continue
        row = measure(library, tasks, tokenizer, forward)
        rows.append(row)
        print(f"{name:<14} {row['compile_ms_mean']:>11.1f} {row['mask_us_mean']:>13.1f} {row['mask_us_p50']:>8.1f} "
              f"{row['mask_us_p95']:>8.1f} {row['accept_us_mean']:>10.1f}  {row['rejected_examples'] or 'none'}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(dict(model=args.model, vocab=len(tokenizer), rows=rows,
                                                  with_forward=args.with_forward), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
