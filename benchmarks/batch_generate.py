"""In-process batching: ``Model.generate_batch`` at several batch sizes against ``Model.generate`` one prompt
after another, on the same prompts; every batched output must equal its solo one.

    python benchmarks/batch_generate.py --methods ar,ngram --batch 4,16 --max-new-tokens 64

Prompts: the short chat questions of ``server_load.py`` (``--prompts N`` of them, cycled), or the first turns of
``--specbench FILE`` (question.jsonl). Prints tokens/s per method and batch size, the speed-up over one after
another (before any batch, and again after: a batcher must not slow the process's later solo runs), and how
many requests shared each forward pass; writes it all with ``--out``. Run it on an idle
machine: on 2 cores any other process skews the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paradecode  # noqa: E402
from paradecode.profile import machine_report  # noqa: E402
from server_load import QUESTIONS  # noqa: E402


def timed(run) -> tuple[list, float]:
    start = time.perf_counter()
    results = run()
    return results, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default="ar,ngram", help="comma list (default: ar,ngram)")
    parser.add_argument("--batch", default="4,16", help="batch sizes > 1, comma list (default: 4,16)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per run (default: 16)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--specbench", help="question.jsonl: use its first turns instead of the short questions")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch.split(",")]
    if min(sizes) < 2:
        parser.error("--batch sizes must be 2 or more (1 is the one-after-another run each size is compared with)")
    if args.specbench:
        pool = [json.loads(line)["turns"][0] for line in Path(args.specbench).read_text().splitlines() if line]
    else:
        pool = QUESTIONS
    prompts = [pool[i % len(pool)] for i in range(args.prompts)]
    model = paradecode.load(args.model)
    batcher = model.batcher()
    if batcher is None:
        print("this model's backend cannot batch (only the native int8 forward does)", file=sys.stderr)
        return 2
    methods = args.methods.split(",")
    # one after another first, for every method: the batcher's thread, once started, slows the model's own
    # forwards in this process (a second OpenMP team: see backends/sequences.py), so these are a fresh process's
    solo = {}
    for method in methods:
        model.generate(prompts[0], method=method, max_new_tokens=8)  # untimed warm-up
        results, seconds = timed(lambda: [model.generate(p, method=method, max_new_tokens=args.max_new_tokens)
                                          for p in prompts])
        solo[method] = (results, sum(len(r.token_ids) for r in results) / seconds)
    rows = []
    for method in methods:
        results, solo_rate = solo[method]
        for size in sizes:
            before = dict(batcher.sequences_histogram)
            batched, batch_s = timed(lambda: model.generate_batch(prompts, method=method, max_batch=size,
                                                                  max_new_tokens=args.max_new_tokens))
            shared = {k: v - before.get(k, 0) for k, v in batcher.sequences_histogram.items() if v > before.get(k, 0)}
            passes = sum(shared.values())
            rate = sum(len(r.token_ids) for r in batched) / batch_s
            row = dict(method=method, batch=size, solo_tokens_per_s=solo_rate, batch_tokens_per_s=rate,
                       speedup=rate / solo_rate, identical=[r.token_ids for r in batched] == [r.token_ids for r in results],
                       mean_requests_per_pass=sum(k * v for k, v in shared.items()) / passes if passes else 0.0)
            rows.append(row)
            print(f"{method:8s} batch {size:3d}: {rate:7.1f} tok/s vs {solo_rate:6.1f} one after another "
                  f"({row['speedup']:.2f}x), {row['mean_requests_per_pass']:.1f} requests per pass, "
                  f"identical {row['identical']}", flush=True)
    # one after another again, now that the batcher's thread has run: its OpenMP team must not slow them
    for method in methods:
        results, seconds = timed(lambda: [model.generate(p, method=method, max_new_tokens=args.max_new_tokens)
                                          for p in prompts])
        rate = sum(len(r.token_ids) for r in results) / seconds
        for row in rows:
            if row["method"] == method:
                row["solo_after_tokens_per_s"] = rate
        print(f"{method:8s} one after another again, after batching: {rate:6.1f} tok/s "
              f"({rate / solo[method][1]:.2f}x the first run)", flush=True)
    machine = machine_report()
    print(f"machine: {json.dumps(machine)}; {args.prompts} prompts, {args.max_new_tokens} tokens, greedy")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(machine=machine, settings=vars(args), rows=rows), indent=1))
    return 0 if all(row["identical"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
