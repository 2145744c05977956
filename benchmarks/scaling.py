"""Speed at 0.5B-8B parameters, measured on random weights in real shapes, against llama.cpp on the same file.

No model larger than SmolLM2-135M can be downloaded here, but a one-token forward of a larger model is almost all
weight reading and a T-token forward's cost follows from the shapes, not the values. So this script:

1. writes, per size, a GGUF file of random weights in a real model's shapes, as ``llama-quantize Q4_0`` lays one
   out: every layer's projections Q4_0, the LM head Q6_K (Q8_0 where the hidden size is no multiple of 256, as
   llama-quantize falls back), norms F32, and a placeholder vocabulary llama.cpp loads;
2. times one forward pass over T = 1, 2, 4, 8, 16 new tokens after a 256-token context, in a fresh process each:
   ours on that file's own 4-bit blocks (``q4``) and on the same weights quantized per channel to int8 (``int8``),
   and llama.cpp's ``llama-bench`` (``-p T -d 256``) in the portable and, where built, the native build;
3. ``report`` writes the table, the plot, and what each lossless method would give at each size: its steps'
   widths and accepted tokens as measured on the real SmolLM2-135M (a ``paradecode bench`` run's records), each
   step priced by the size's measured curve.

    python benchmarks/scaling.py run --sizes 135m,0.5b,1b,3b,8b --out results/scaling      # resumes
    python benchmarks/scaling.py report results/scaling --records results/<bench run>/records.jsonl \\
        --doc docs/scaling.md

``135m`` is the real SmolLM2-135M-Instruct Q4_1 file, the anchor for the synthetic ones. The files go to
``~/.cache/paradecode/synthetic`` (8B: 4.7 GB). llama-bench comes from ``benchmarks/llama_server.py build
[--native]``. Nothing else should run meanwhile: on 2 cores any other job skews the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES_T = (1, 2, 4, 8, 16)
CONTEXT = 256
REAL = "135m"  # the shipped SmolLM2-135M-Instruct Q4_1 file: the anchor of the synthetic ones


def sizes() -> list[str]:
    from paradecode.synthetic import SHAPES

    return [REAL, *SHAPES]


def cache_dir() -> Path:
    from paradecode.models import cache_root

    return cache_root() / "synthetic"


def gguf_path(size: str) -> Path:
    if size == REAL:
        sys.path.insert(0, str(Path(__file__).parent))
        from llama_server import default_gguf

        return Path(default_gguf())
    return cache_dir() / f"synthetic-{size}-q4_0.gguf"


def measure_ours(size: str, dtype: str, repeats: int) -> dict:
    """One-token to 16-token forward times of ours, in this (fresh) process."""
    import torch

    from paradecode.profile import measure_curve

    torch.set_num_threads(int(os.environ.get("PARADECODE_THREADS", "2")))
    start = time.perf_counter()
    max_length = CONTEXT + max(SIZES_T) + 64
    if size == REAL:
        import paradecode

        backend = paradecode.load("smollm2-135m", dtype=dtype, max_length=max_length).backend
    else:
        from paradecode import synthetic

        backend = synthetic.load(gguf_path(size), synthetic.SHAPES[size], dtype, max_length, cache_dir() / "kernels")
    loaded = time.perf_counter() - start
    curve = measure_curve(backend, SIZES_T, CONTEXT, repeats)
    return dict(seconds={str(t): s for t, s in curve.items()}, load_s=loaded, weight_bytes=backend.weight_bytes,
                kernels=backend.kernel_report().get("choice"))


# -- llama.cpp ----------------------------------------------------------------------------------------------------
def llama_bench(binary: Path, path: Path, repeats: int, threads: int = 2) -> dict:
    """llama-bench's time of one pass over T prompt tokens after a CONTEXT-token depth, per T (median of its
    samples). Its prompt passes return the last token's logits only, where a verify pass needs every row's: at
    T > 1 this is a lower bound on a llama.cpp verify pass."""
    cmd = [str(binary), "-m", str(path), "-p", ",".join(map(str, SIZES_T)), "-n", "0", "-d", str(CONTEXT),
           "-r", str(repeats), "-t", str(threads), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-2000:]}")
    seconds = {}
    for test in json.loads(done.stdout):
        seconds[str(test["n_prompt"])] = statistics.median(test["samples_ns"]) / 1e9
    return dict(seconds=seconds, build=json.loads(done.stdout)[0].get("build_commit"))


def llama_binaries() -> dict[str, Path]:
    sys.path.insert(0, str(Path(__file__).parent))  # benchmarks/llama_server.py
    from llama_server import binary_path

    found = {}
    for native in (False, True):
        binary = binary_path(native, "llama-bench")
        if binary.exists():
            found["llama.cpp native" if native else "llama.cpp portable"] = binary
    return found


# -- orchestration --------------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    from paradecode.profile import machine_report
    from paradecode.synthetic import SHAPES, write_gguf

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    results.setdefault("machines", [])
    machine = machine_report()
    if machine not in results["machines"]:
        results["machines"].append(machine)
    rows = results.setdefault("rows", {})
    binaries = llama_binaries()
    if not binaries:
        print("no llama-bench found: build it with `python benchmarks/llama_server.py build`", file=sys.stderr)
    for size in args.sizes.split(","):
        if size not in sizes():
            raise SystemExit(f"unknown size {size!r}: choose from {', '.join(sizes())}")
        path = gguf_path(size)
        if size != REAL and not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            print(f"writing {path} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            staging = path.with_suffix(".part")
            write_gguf(SHAPES[size], staging)
            staging.replace(path)
            print(f"  written in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        engines = [("ours q4", None), ("ours int8", None), *binaries.items()]
        for engine, binary in engines:
            key = f"{size}|{engine}"
            if key in rows and not args.force:
                continue
            print(f"{size}: {engine} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            if binary is None:
                dtype = engine.split()[1]
                done = subprocess.run([sys.executable, __file__, "child", size, dtype, str(args.repeats)],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"  failed: {done.stderr[-1500:]}", file=sys.stderr)
                    rows[key] = dict(error=done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                                     f"exit {done.returncode}")
                    continue
                rows[key] = json.loads(done.stdout.strip().splitlines()[-1])
            else:
                rows[key] = llama_bench(binary, path, args.repeats)
            rows[key]["cpu"] = machine["cpu"]
            rows[key]["wall_s"] = time.perf_counter() - start
            ms = ", ".join(f"T={t} {1000 * s:.1f}" for t, s in rows[key]["seconds"].items())
            print(f"  {ms} ms", file=sys.stderr, flush=True)
            results_path.write_text(json.dumps(results, indent=1))
    results_path.write_text(json.dumps(results, indent=1))
    return 0


def child(args: argparse.Namespace) -> int:
    print(json.dumps(measure_ours(args.size, args.dtype, args.repeats)))
    return 0


# -- the report -----------------------------------------------------------------------------------------------------
def _interpolate(curve: dict[int, float], rows: int) -> float:
    """Seconds of a pass over ``rows`` tokens, linear between the measured T (beyond the last: its slope)."""
    ts = sorted(curve)
    if rows in curve:
        return curve[rows]
    for a, b in zip(ts, ts[1:]):
        if a < rows < b:
            return curve[a] + (curve[b] - curve[a]) * (rows - a) / (b - a)
    a, b = ts[-2], ts[-1]
    return curve[b] + (curve[b] - curve[a]) * (rows - b) / (b - a)


def method_steps(records: Path) -> dict[str, list[tuple[int, int]]]:
    """Per method, every decoding step of the bench run as (rows verified, tokens it committed)."""
    steps: dict[str, list[tuple[int, int]]] = {}
    for line in records.read_text().splitlines():
        record = json.loads(line)
        if record["method"] == "llamacpp":
            continue
        for turn in record["turns"]:
            widths = turn.get("draft_lengths") or [0] * len(turn["accepted_per_step"])
            pairs = [(w + 1, a) for w, a in zip(widths, turn["accepted_per_step"])]
            steps.setdefault(record["method"], []).extend(pairs)
    return steps


def projected(curve: dict[int, float], steps: list[tuple[int, int]]) -> float:
    """Tokens per second of decoding whose steps are ``steps``, each costing the curve at its width (forward
    passes only: drafting, sampling and the prefill are left out for every method alike)."""
    return sum(a for _, a in steps) / sum(_interpolate(curve, w) for w, _ in steps)


def report(args: argparse.Namespace) -> int:
    results = json.loads((Path(args.folder) / "results.json").read_text())
    rows = results["rows"]
    engines = sorted({key.split("|")[1] for key in rows}, key=lambda e: (not e.startswith("ours"), e))
    curves = {key: {int(t): s for t, s in row["seconds"].items()} for key, row in rows.items() if "seconds" in row}
    steps = method_steps(Path(args.records)) if args.records else {}
    lines = []
    machine = results["machines"][-1]
    lines.append(f"Machine: {machine['cpu']}, {machine['threads']} threads, ISA {' '.join(machine['isa'])}"
                 + (f", memory read {machine['read_gb_per_s']} GB/s" if "read_gb_per_s" in machine else "") + ".")
    lines.append("")
    lines.append("### Forward time, ms per pass over T new tokens (256-token context)")
    lines.append("")
    lines.append("| size | engine | weights read per token | " + " | ".join(f"T={t}" for t in SIZES_T)
                 + " | T=8 / T=1 |")
    lines.append("|---|---|---|" + "---|" * len(SIZES_T) + "---|")
    for size in sizes():
        for engine in engines:
            key = f"{size}|{engine}"
            if key not in rows:
                continue
            if key not in curves:
                lines.append(f"| {size} | {engine} | failed: {rows[key].get('error', '?')} |")
                continue
            c = curves[key]
            weights = f"{rows[key]['weight_bytes'] / 1e6:,.0f} MB" if "weight_bytes" in rows[key] else "–"
            lines.append(f"| {size} | {engine} | {weights} | " + " | ".join(f"{1000 * c[t]:.1f}" for t in SIZES_T)
                         + f" | {c[8] / c[1]:.2f}x |")
    lines.append("")
    lines.append("### Ours against the faster llama.cpp build, one-token forward")
    lines.append("")
    lines.append("| size | llama.cpp (faster build), ms | ours q4 | ours int8 | q4 speed vs llama.cpp | int8 vs llama.cpp |")
    lines.append("|---|---|---|---|---|---|")
    best_llama = {}
    for size in sizes():
        llama = {e: curves[f"{size}|{e}"] for e in engines if e.startswith("llama") and f"{size}|{e}" in curves}
        if not llama:
            continue
        name = min(llama, key=lambda e: llama[e][1])
        best_llama[size] = (name, llama[name])
        ours = {d: curves.get(f"{size}|ours {d}") for d in ("q4", "int8")}
        cells = [f"{1000 * ours[d][1]:.1f}" if ours[d] else "–" for d in ("q4", "int8")]
        ratios = [f"{llama[name][1] / ours[d][1]:.2f}x" if ours[d] else "–" for d in ("q4", "int8")]
        lines.append(f"| {size} | {1000 * llama[name][1]:.1f} ({name.split()[-1]}) | " + " | ".join(cells) + " | "
                     + " | ".join(ratios) + " |")
    if steps:
        methods = sorted(steps, key=lambda m: (m != "ar", m))
        lines.append("")
        lines.append("### Projected decoding speed per method, relative to llama.cpp's plain decoding (faster build)")
        lines.append("")
        lines.append("Each method's steps (rows verified, tokens committed) as measured on SmolLM2-135M, priced by "
                     "the size's measured forward curve of ours on q4; llama.cpp at one forward per token.")
        lines.append("")
        lines.append("| size | " + " | ".join(f"`{m}`" for m in methods) + " |")
        lines.append("|---|" + "---|" * len(methods))
        for size in sizes():
            ours = curves.get(f"{size}|ours q4")
            if ours is None or size not in best_llama:
                continue
            llama_rate = 1.0 / best_llama[size][1][1]
            cells = [f"{projected(ours, steps[m]) / llama_rate:.2f}x" for m in methods]
            lines.append(f"| {size} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.plot:
        plot(curves, Path(args.plot))
    if args.doc:
        doc = Path(args.doc)
        marker = "<!-- scaling tables -->"
        body = doc.read_text() if doc.is_file() else marker + "\n"
        head, _, _ = body.partition(marker)
        doc.write_text(head + marker + "\n\n" + text)
    return 0


def plot(curves: dict[str, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paradecode.synthetic import SHAPES

    shown = [s for s in sizes() if any(k.startswith(f"{s}|") for k in curves)]
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.4), squeeze=False)
    for ax, size in zip(axes[0], shown):
        for key, curve in sorted(curves.items()):
            if key.startswith(f"{size}|"):
                ax.plot(list(curve), [1000 * s for s in curve.values()], marker="o", label=key.split("|")[1])
        ax.set_xscale("log", base=2)
        ax.set_title(size if size == REAL else f"{size} ({SHAPES[size]['model']} shape)", fontsize=9)
        ax.set_xlabel("T (new tokens per pass)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("ms per pass")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="write the files (once) and time every engine on each size; resumes")
    r.add_argument("--sizes", default="135m,0.5b,1b,3b,8b", help="comma-separated, of 135m,0.5b,1b,3b,8b")
    r.add_argument("--out", default="results/scaling", help="folder for results.json")
    r.add_argument("--repeats", type=int, default=7, help="timed passes per T; the median is kept")
    r.add_argument("--force", action="store_true", help="time again what results.json already has")
    r.set_defaults(run=run)
    c = commands.add_parser("child", help=argparse.SUPPRESS)
    c.add_argument("size")
    c.add_argument("dtype", choices=("q4", "int8"))
    c.add_argument("repeats", type=int)
    c.set_defaults(run=child)
    p = commands.add_parser("report", help="tables (and a plot) from a run's results.json")
    p.add_argument("folder")
    p.add_argument("--records", help="a paradecode bench run's records.jsonl, for the projected speed per method")
    p.add_argument("--plot", help="PNG to write")
    p.add_argument("--doc", help="markdown file whose part after '<!-- scaling tables -->' is replaced")
    p.set_defaults(run=report)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
