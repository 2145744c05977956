"""How much `auto` loses to its start: a fresh process's first request, cold and from the kept file, against a
warm request of a process that has already run, and `auto` against `ar`, on a copying prompt, free text and a
prompt of random tokens.

Each round, for each prompt:
  - cold:  a new process, its model's kept file removed, one `paradecode generate` (auto's warm-up in full);
  - cache: a new process with the kept file the cold run left: the first request starts from it;
  - warm:  in this process, the same request after one untimed request on the same loaded model;
  - ar:    in this process, plain decoding.
The new processes are timed by their own `--json` stats (decode time, load excluded). Rounds interleave the
variants, so drift in the machine's speed falls on all of them. Greedy, 128 tokens by default:

    python benchmarks/auto_start.py --rounds 3 --out results/auto-start.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

PROMPTS = {  # (label, prompt, chat)
    "copy": ("Rewrite this list as a numbered list, keeping every word: apples, green pears, ripe bananas, "
             "sweet cherries, dark plums, wild strawberries, red grapes, fresh figs, yellow lemons.", True),
    "free": ("Write a short story about a lighthouse keeper who finds a message in a bottle.", True),
}


def random_prompt(tokenizer, n: int = 96, seed: int = 0) -> str:
    """Text of random tokens (raw, no chat template): nothing in the prompt repeats. The answer may: SmolLM2-135M
    repeats itself after it (2026-12-02: drafting paid 2.4-4.3x), so it is no case of "no drafter pays"."""
    rng = random.Random(seed)
    ids = [rng.randrange(1000, tokenizer.vocab_size) for _ in range(n)]
    return tokenizer.decode(ids)


def run_process(model: str, prompt: str, chat: bool, tokens: int, cache: str) -> dict:
    args = [sys.executable, "-m", "paradecode.cli", "generate", "--model", model, "--cache-dir", cache, "--json",
            "--temperature", "0", "--max-new-tokens", str(tokens)] + ([] if chat else ["--raw"]) + [prompt]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"paradecode generate failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def speed(stats: dict) -> float:
    """Tokens per second of the decode (after prefill), as `bench` reports them."""
    return stats["new_tokens"] / max(stats["wall_time_s"] - stats["prefill_time_s"], 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache-dir", default=None, help="the model cache (default: paradecode's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    import paradecode
    from paradecode.models import cache_root

    cache = str(cache_root(args.cache_dir))
    model = paradecode.load(args.model, cache_dir=cache)
    prompts = dict(PROMPTS, random=(random_prompt(model.tokenizer), False))
    from paradecode.drafters.auto import AutoOptions

    kept = model.kept_file("auto", AutoOptions()).path
    figures: dict[str, dict[str, list[float]]] = {label: {} for label in prompts}
    outputs: dict[str, set] = {label: set() for label in prompts}
    for round_ in range(args.rounds):
        for label, (prompt, chat) in prompts.items():
            row = figures[label]
            kept.unlink(missing_ok=True)
            cold = run_process(args.model, prompt, chat, args.max_new_tokens, cache)
            cached = run_process(args.model, prompt, chat, args.max_new_tokens, cache)
            if cached["stats"]["info"]["auto"]["warm_from"] != "cache":
                raise SystemExit(f"the second process did not start from {kept}")
            here = dict(chat=chat, max_new_tokens=args.max_new_tokens, temperature=0.0)
            model.generate(prompt, method="auto", **here)  # untimed: the in-process warm-up
            warm = model.generate(prompt, method="auto", **here)
            plain = model.generate(prompt, method="ar", **here)
            for name, stats in (("cold", cold["stats"]), ("cache", cached["stats"]),
                                ("warm", warm.stats.to_dict()), ("ar", plain.stats.to_dict())):
                row.setdefault(name, []).append(speed(stats))
            outputs[label].update(tuple(ids) for ids in (cold["token_ids"], cached["token_ids"], warm.token_ids,
                                                           plain.token_ids))
            print(f"round {round_ + 1}/{args.rounds} {label}: " + ", ".join(
                f"{name} {values[-1]:.1f}" for name, values in row.items()) + " tok/s", file=sys.stderr, flush=True)

    from paradecode.profile import cpu_name

    report = dict(cpu=cpu_name(), model=args.model, max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                  identical={label: len(seen) == 1 for label, seen in outputs.items()}, prompts={})
    print(f"CPU: {report['cpu']}; median tok/s over {args.rounds} rounds (ratio to warm auto; to ar)")
    for label, row in figures.items():
        medians = {name: statistics.median(values) for name, values in row.items()}
        report["prompts"][label] = dict(medians=medians, runs=row)
        print(f"{label:>7}: " + ", ".join(f"{name} {value:.1f} ({value / medians['warm']:.2f}; "
                                          f"{value / medians['ar']:.2f})" for name, value in medians.items())
              + ("" if report["identical"][label] else "  OUTPUTS DIFFER"))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
