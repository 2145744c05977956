"""Constrained decoding benchmark: every method answers every task of the JSON-schema task set
(benchmarks/structured/tasks.jsonl, 34 schemas with prompts) under its schema, greedy, in one process.

Reported per method: tokens per second (generated tokens over wall time, prefill included), tokens per target
forward, speed against constrained ``ar``, how many outputs parse and validate against their schema (jsonschema),
how many equal ``ar``'s token for token, and the grammar mask's cost: time per mask (one per verified row) and
per generated token, against the time of a one-token forward measured in the same run.

    nice -n 0 python benchmarks/structured_bench.py --methods ar,ngram,pld --max-new-tokens 128 \\
        --out results/structured

Methods run interleaved per task after an untimed warm-up, so a machine that slows down mid-run slows all of
them alike. Writes results.json (every answer) and report.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

TASKS = Path(__file__).resolve().parent / "structured" / "tasks.jsonl"


def one_token_forward_s(model, repeats: int = 50) -> float:
    """Median time of a one-token forward after a 64-token context (what plain decoding pays per token)."""
    import torch

    backend = model.backend
    backend.reset()
    backend.forward(torch.arange(64, dtype=torch.long))
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        backend.forward(torch.tensor([100 + i]))
        times.append(time.perf_counter() - start)
        backend.rollback(64)
    return statistics.median(times)


def validate(text: str, schema: dict) -> str | None:
    """None when ``text`` is JSON valid under ``schema``, else what is wrong."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--methods", default="ar,ngram,pld", help="comma-separated; ar first is the reference")
    parser.add_argument("--tasks", default=str(TASKS))
    parser.add_argument("--limit", type=int, help="first N tasks only")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="results/structured")
    args = parser.parse_args(argv)

    import torch

    import paradecode

    methods = args.methods.split(",")
    tasks = [json.loads(line) for line in Path(args.tasks).read_text().splitlines() if line.strip()]
    tasks = tasks[: args.limit] if args.limit else tasks
    model = paradecode.load(args.model, dtype=args.dtype)
    for method in methods:  # warm-up: kernels, the cost curve, the grammar compiler
        model.generate(tasks[0]["prompt"], method=method, max_new_tokens=8, json_schema=tasks[0]["schema"])
    forward_s = one_token_forward_s(model)
    rows = []
    for task in tasks:
        for method in methods:
            out = model.generate(task["prompt"], method=method, max_new_tokens=args.max_new_tokens,
                                 json_schema=task["schema"])
            info = out.stats.info
            rows.append(dict(task=task["id"], method=method, text=out.text, token_ids=out.token_ids,
                             tokens=out.stats.new_tokens, wall_time_s=out.stats.wall_time_s,
                             forward_passes=out.stats.forward_passes, stop_reason=out.stats.stop_reason,
                             invalid=validate(out.text, task["schema"]), masks=info["grammar_masks"],
                             mask_time_s=info["grammar_mask_time_s"], forced_tokens=info["grammar_forced_tokens"]))
        print(f"{task['id']:<16} " + " ".join(f"{r['method']}={r['tokens'] / r['wall_time_s']:.0f}" for r in rows[-len(methods):]),
              file=sys.stderr)
    summary = summarize(rows, methods, forward_s)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(model=args.model, dtype=model.dtype, tasks=len(tasks), max_new_tokens=args.max_new_tokens,
                one_token_forward_ms=1e3 * forward_s, torch_threads=torch.get_num_threads(),
                command=" ".join(["python", "benchmarks/structured_bench.py", *(argv or sys.argv[1:])]))
    (out_dir / "results.json").write_text(json.dumps(dict(meta=meta, summary=summary, answers=rows), indent=1))
    report = render(meta, summary)
    (out_dir / "report.md").write_text(report)
    print(report)
    return 0


def summarize(rows: list[dict], methods: list[str], forward_s: float) -> list[dict]:
    reference = {r["task"]: r["token_ids"] for r in rows if r["method"] == methods[0]}
    base = None
    summary = []
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        tokens, wall = sum(r["tokens"] for r in mine), sum(r["wall_time_s"] for r in mine)
        masks, mask_time = sum(r["masks"] for r in mine), sum(r["mask_time_s"] for r in mine)
        speed = tokens / wall
        base = base or speed
        summary.append(dict(
            method=method, tokens=tokens, tokens_per_second=speed, speedup=speed / base,
            tokens_per_forward=tokens / sum(r["forward_passes"] for r in mine),
            valid=sum(r["invalid"] is None for r in mine), answers=len(mine),
            complete=sum(r["stop_reason"] == "eos" for r in mine),
            identical_to_reference=sum(r["token_ids"] == reference[r["task"]] for r in mine),
            forced_tokens=sum(r["forced_tokens"] for r in mine),
            mask_us=1e6 * mask_time / masks, mask_us_per_token=1e6 * mask_time / tokens,
            mask_share_of_forward=mask_time / masks / forward_s))
    return summary


def render(meta: dict, summary: list[dict]) -> str:
    lines = [f"# Constrained decoding: {meta['tasks']} JSON-schema tasks, {meta['max_new_tokens']} tokens, greedy",
             "", f"{meta['model']} ({meta['dtype']}); one-token forward {meta['one_token_forward_ms']:.2f} ms; "
             f"`{meta['command']}`", "",
             "| method | tok/s | vs ar | tokens/forward | valid | complete | identical to ar | forced drafts "
             "| mask us (per mask / per token) | mask / forward |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| `{s['method']}` | {s['tokens_per_second']:.1f} | {s['speedup']:.2f}x | "
                     f"{s['tokens_per_forward']:.2f} | {s['valid']}/{s['answers']} | {s['complete']}/{s['answers']} | "
                     f"{s['identical_to_reference']}/{s['answers']} | {s['forced_tokens']} | {s['mask_us']:.0f} / "
                     f"{s['mask_us_per_token']:.0f} | {100 * s['mask_share_of_forward']:.1f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
