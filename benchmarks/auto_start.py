"""How much `auto` loses to its start: a fresh process's first request, cold and from the kept file, against a
warm request of a process that has already run, and `auto` against `ar`, on a copying prompt, free text, a prompt
where no drafter pays (``nodraft``) and a prompt of random tokens.

Each round, for each prompt, three new processes (``--child``), one after another:
  - cold:  the model's kept file removed, then one request (auto's warm-up in full);
  - cache: the kept file the cold run left: the first request of the process starts from it;
  - warm and ar: one untimed request of each, then ``--pairs`` pairs of the same request with auto (warm from
    the requests before) and with plain decoding, alternating; each is tokens over decode time summed over its
    requests, so the two share the machine's drift and auto / ar is read within one process.
Every first request runs in a process of its own, timed by its own stats (decode time, load and prefill
excluded). Rounds interleave the variants; the report gives each variant's median and, per round, the ratios
to warm and to ar of that round. Greedy, 128 tokens by default:

    python benchmarks/auto_start.py --rounds 5 --out results/auto-start.json
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
    # no drafter pays here: on SmolLM2-135M q4 (AMD EPYC Zen 4, 2026-12-02, best of 2) ar 220.4 tok/s, ngram
    # 213.0, pld 207.8
    "nodraft": ("Tell me one surprising fact about octopuses.", True),
}


def random_prompt(tokenizer, n: int = 96, seed: int = 0) -> str:
    """Text of random tokens (raw, no chat template): nothing in the prompt repeats. The answer may: SmolLM2-135M
    repeats itself after it (2026-12-02: drafting paid 2.4-4.3x), so it is no case of "no drafter pays"."""
    rng = random.Random(seed)
    ids = [rng.randrange(1000, tokenizer.vocab_size) for _ in range(n)]
    return tokenizer.decode(ids)


VARIANTS = ("cold", "cache", "warm")


def run_child(args, variant: str, label: str) -> dict:
    command = [sys.executable, __file__, "--child", variant, label, "--model", args.model,
               "--max-new-tokens", str(args.max_new_tokens), "--pairs", str(args.pairs)]
    command += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"the {variant} run on {label!r} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(args) -> None:
    """One variant in this fresh process; prints its stats and output as one JSON line."""
    import paradecode
    from paradecode.drafters.auto import AutoOptions

    variant, label = args.child
    model = paradecode.load(args.model, cache_dir=args.cache_dir)
    prompt, chat = PROMPTS[label] if label in PROMPTS else (random_prompt(model.tokenizer), False)
    kept = model.kept_file("auto", AutoOptions()).path
    if variant == "cold":
        kept.unlink(missing_ok=True)
    elif variant == "cache" and not kept.exists():
        raise SystemExit(f"no kept file at {kept}: run cold first")
    here = dict(chat=chat, max_new_tokens=args.max_new_tokens, temperature=0.0)
    if variant != "warm":
        result = model.generate(prompt, method="auto", **here)
        stats = result.stats.to_dict()
        want = {"cold": None, "cache": "cache"}[variant]
        if stats["info"]["auto"]["warm_from"] != want:
            raise SystemExit(f"{variant}: auto started from {stats['info']['auto']['warm_from']!r}, not {want!r}")
        print(json.dumps(dict(speeds={variant: speed(stats)}, token_ids=[result.token_ids])))
        return
    for method in ("auto", "ar"):
        model.generate(prompt, method=method, **here)  # untimed: the process's warm-up
    tokens, seconds, outputs = {"warm": 0, "ar": 0}, {"warm": 0.0, "ar": 0.0}, []
    for _ in range(args.pairs):
        for name, method in (("warm", "auto"), ("ar", "ar")):
            result = model.generate(prompt, method=method, **here)
            tokens[name] += result.stats.new_tokens
            seconds[name] += result.stats.wall_time_s - result.stats.prefill_time_s
            outputs.append(result.token_ids)
    print(json.dumps(dict(speeds={name: tokens[name] / seconds[name] for name in tokens}, token_ids=outputs)))


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
    parser.add_argument("--pairs", type=int, default=4, help="auto / ar pairs timed in the warm process")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "PROMPT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    labels = [*PROMPTS, "random"]
    figures: dict[str, dict[str, list[float]]] = {label: {} for label in labels}
    outputs: dict[str, set] = {label: set() for label in labels}
    for round_ in range(args.rounds):
        for label in labels:
            row = figures[label]
            for variant in VARIANTS:
                run = run_child(args, variant, label)
                for name, value in run["speeds"].items():
                    row.setdefault(name, []).append(value)
                outputs[label].update(tuple(ids) for ids in run["token_ids"])
            print(f"round {round_ + 1}/{args.rounds} {label}: " + ", ".join(
                f"{name} {values[-1]:.1f}" for name, values in row.items()) + " tok/s", file=sys.stderr, flush=True)

    from paradecode.profile import cpu_name

    report = dict(cpu=cpu_name(), model=args.model, max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                  identical={label: len(seen) == 1 for label, seen in outputs.items()}, prompts={})
    print(f"CPU: {report['cpu']}; median tok/s over {args.rounds} rounds (ratio to warm auto; to ar)")
    for label, row in figures.items():
        medians = {name: statistics.median(values) for name, values in row.items()}
        ratios = {f"{name}/warm": statistics.median(v / w for v, w in zip(row[name], row["warm"]))
                  for name in ("cold", "cache")}
        ratios["warm/ar"] = statistics.median(w / a for w, a in zip(row["warm"], row["ar"]))
        report["prompts"][label] = dict(medians=medians, median_ratios_within_rounds=ratios, runs=row)
        print(f"{label:>7}: within a round, median " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
        print(f"{label:>7}: " + ", ".join(f"{name} {value:.1f} ({value / medians['warm']:.2f}; "
                                          f"{value / medians['ar']:.2f})" for name, value in medians.items())
              + ("" if report["identical"][label] else "  OUTPUTS DIFFER"))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
