"""Speed at 0.5B-8B parameters, measured on random weights in real shapes, against llama.cpp on the same file.

No model larger than SmolLM2-135M can be downloaded here, but a one-token forward of a larger model is almost all
weight reading and a T-token forward's cost follows from the shapes, not the values. So this script:

1. writes, per size, a GGUF file of random weights in a real model's shapes, as ``llama-quantize Q4_0`` lays one
   out: every layer's projections Q4_0, the LM head Q6_K (Q8_0 where the hidden size is no multiple of 256, as
   llama-quantize falls back), norms F32, and a placeholder vocabulary llama.cpp loads; with ``--quant q4_k_m`` as
   ``Q4_K_M`` lays one out (Q4_K projections, Q6_K v and down on its more-bits layers; 1b, 3b and 8b);
2. times one forward pass over T = 1, 2, 4, 8, 16 new tokens after a 256-token context, in rounds that take
   every engine in turn: ours (loaded once per size in a child process) on that file's own 4-bit blocks
   (``q4``) and on the same weights quantized per channel to int8 (``int8``), and llama.cpp's ``llama-bench``
   (``-p T -d 256``) in the portable and, where built, the native build;
3. ``report`` writes the table, the plot, and what each lossless method would give at each size: its steps'
   widths and accepted tokens as measured on the real SmolLM2-135M (a ``paradecode bench`` run's records), each
   step priced by the size's measured curve.

    python benchmarks/scaling.py run --sizes 135m,0.5b,1b,3b,8b --out results/scaling      # resumes
    python benchmarks/scaling.py run --sizes 1b,3b --quant q4_k_m --out results/scaling-q4km
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

SIZES_T = (1, 2, 4, 8, 16)
CONTEXT = 256
REAL = "135m"  # the shipped SmolLM2-135M-Instruct Q4_1 file: the anchor of the synthetic ones


def sizes() -> list[str]:
    from paradecode.synthetic import SHAPES

    return [REAL, *SHAPES]


def cache_dir() -> Path:
    from paradecode.models import cache_root

    return cache_root() / "synthetic"


def gguf_path(size: str, quant: str = "q4_0") -> Path:
    if size == REAL:
        from paradecode.models import BUILTIN_MODELS

        return BUILTIN_MODELS["smollm2-135m"].gguf()
    return cache_dir() / f"synthetic-{size}-{quant}.gguf"


def load_ours(size: str, dtype: str, quant: str = "q4_0"):
    """Our backend of ``size`` on ``dtype``, with a cache for the CONTEXT and the longest pass."""
    max_length = CONTEXT + max(SIZES_T) + 64
    if size == REAL:
        import paradecode

        return paradecode.load("smollm2-135m", dtype=dtype, max_length=max_length).backend
    from paradecode import synthetic

    return synthetic.load(gguf_path(size, quant), synthetic.SHAPES[size], dtype, max_length, cache_dir() / "kernels")


def serve(args: argparse.Namespace) -> int:
    """The child that holds one backend: a line of its facts once loaded, then per line of input its curves
    with full logits and in greedy verification's mode (``ARGMAX``: each row's argmax only), taking turns."""
    import torch

    from paradecode.backends.base import ARGMAX
    from paradecode.profile import measure_curves

    torch.set_num_threads(int(os.environ.get("PARADECODE_THREADS", "2")))
    start = time.perf_counter()
    backend = load_ours(args.size, args.dtype, args.quant)
    print(json.dumps(dict(load_s=time.perf_counter() - start, weight_bytes=backend.weight_bytes,
                          kernels=backend.kernel_report().get("choice"))), flush=True)
    for _ in sys.stdin:
        curves = measure_curves(backend, (True, ARGMAX), SIZES_T, CONTEXT, args.repeats)
        print(json.dumps({name: {str(t): s for t, s in curves[mode].items()}
                          for name, mode in (("full", True), ("greedy", ARGMAX))}), flush=True)
    return 0


class Ours:
    """A child process holding our backend of one size and dtype, timed on request (loaded once: a 3B model
    takes a minute to load, and the rounds alternate with llama.cpp's)."""

    def __init__(self, size: str, dtype: str, repeats: int, log: Path, quant: str = "q4_0") -> None:
        self.log = log.open("a")
        command = [sys.executable, __file__, "serve", size, dtype, str(repeats), quant]
        self.process = subprocess.Popen(command, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log)
        self.info = self._reply()

    def _reply(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"our child process ended (exit {code}); see {self.log.name}")
        return json.loads(line)

    # the rows of results.json an engine of ours fills, by the suffix after its name: its passes with full logits,
    # and the same passes in greedy verification's mode (each row's argmax only)
    ROWS = {"": "full", " greedy": "greedy"}

    def measure(self) -> dict[str, dict[str, float]]:
        """{"full": seconds per T, "greedy": the same passes reading each row's argmax only}."""
        self.process.stdin.write("measure\n")
        self.process.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()
        self.log.close()


def rows_of(name: str, engine: Any) -> list[str]:
    """The rows (engine names in results.json) that ``engine`` fills each round."""
    return [name + suffix for suffix in Ours.ROWS] if isinstance(engine, Ours) else [name]


def int8_fits(size: str) -> bool:
    """Whether the int8 backend of ``size`` fits in the memory now available: its int8 weights twice (ours and
    fbgemm's packed copy) and the fp32 embedding, with 10% to spare."""
    from paradecode.synthetic import SHAPES, parameters

    if size == REAL:
        return True
    layer, head = parameters(SHAPES[size])
    need = 1.1 * (2 * (SHAPES[size]["num_layers"] * layer + head) + 4 * head)
    available = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    return need < available


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
    return seconds


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
    """Per size: write the file once, load ours (q4, and int8 where it fits) in children, then ``--rounds``
    rounds, each timing every engine in turn, so that the machine's drift falls on all of them alike."""
    from paradecode.profile import machine_report
    from paradecode.synthetic import SHAPES, k_quant_shapes, write_gguf

    out = Path(args.out)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    earlier = results.get("quant", "q4_0") if results else args.quant  # runs before --quant were of q4_0 files
    if earlier != args.quant:
        raise SystemExit(f"{args.out} holds a run of --quant {earlier}: use another --out")
    results["quant"] = args.quant
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_report()
    results.setdefault("machines", [])
    if machine not in results["machines"]:
        results["machines"].append(machine)
    rows = results.setdefault("rows", {})
    binaries = llama_binaries()
    if not binaries:
        print("no llama-bench found: build it with `python benchmarks/llama_server.py build`", file=sys.stderr)
    for size in args.sizes.split(","):
        if size not in sizes():
            raise SystemExit(f"unknown size {size!r}: choose from {', '.join(sizes())}")
        if args.quant == "q4_k_m" and (size == REAL or not k_quant_shapes(SHAPES[size])):
            raise SystemExit(f"--quant q4_k_m: size {size} has rows that are no multiple of 256 (or is the real "
                             "135M file): choose from 1b, 3b, 8b")
        done = [key for key in rows if key.startswith(f"{size}|") and len(rows[key].get("rounds", [])) >= args.rounds]
        if done and not args.force:
            print(f"{size}: done already ({len(done)} engines)", file=sys.stderr)
            continue
        path = gguf_path(size, args.quant)
        if size != REAL and not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            print(f"writing {path} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            staging = path.with_suffix(".part")
            write_gguf(SHAPES[size], staging, quant=args.quant)
            staging.replace(path)
            os.sync()  # the file's pages reach the disk now, not while something is being timed
            print(f"  written in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        engines: dict[str, Any] = {}
        for dtype in ("q4", "int8"):
            key = f"{size}|ours {dtype}"
            if dtype == "int8" and not int8_fits(size):
                rows[key] = dict(error="does not fit in the memory left next to q4 (int8 weights twice: ours and "
                                       "fbgemm's packed copy)", cpu=machine["cpu"])
                print(f"{size}: ours int8 skipped: {rows[key]['error']}", file=sys.stderr)
                continue
            print(f"{size}: loading ours {dtype} ...", file=sys.stderr, flush=True)
            try:
                engines[f"ours {dtype}"] = Ours(size, dtype, args.repeats, out / "children.log", args.quant)
            except RuntimeError as error:
                rows[key] = dict(error=str(error), cpu=machine["cpu"])
                print(f"  failed: {error}", file=sys.stderr)
        engines.update(binaries)
        for name, engine in engines.items():
            info = engine.info if isinstance(engine, Ours) else {}
            for row in rows_of(name, engine):
                rows[f"{size}|{row}"] = dict(info, rounds=[], cpu=machine["cpu"])
        try:
            for round_ in range(args.rounds):
                for name, engine in engines.items():
                    row = rows[f"{size}|{name}"]
                    if "error" in row:
                        continue
                    try:
                        if isinstance(engine, Ours):
                            curves = engine.measure()
                            measured = {name + suffix: curves[mode] for suffix, mode in Ours.ROWS.items()}
                        else:
                            measured = {name: llama_bench(engine, path, args.repeats)}
                    except RuntimeError as error:
                        for key in rows_of(name, engine):
                            rows[f"{size}|{key}"]["error"] = str(error)
                        print(f"  {size} {name} failed: {error}", file=sys.stderr)
                        continue
                    for key, seconds in measured.items():
                        rows[f"{size}|{key}"]["rounds"].append(seconds)
                    ms = ", ".join(f"T={t} {1000 * s:.1f}" for t, s in measured[name].items())
                    print(f"{size} round {round_ + 1}/{args.rounds}: {name}: {ms} ms", file=sys.stderr, flush=True)
                results_path.write_text(json.dumps(results, indent=1))
        finally:
            for engine in engines.values():
                if isinstance(engine, Ours):
                    engine.close()
    results_path.write_text(json.dumps(results, indent=1))
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


# Methods whose every step is one target pass over the rows it verifies (lookahead's pass also carries its
# lookahead window, and layerskip adds early-exit passes, neither of which the records count).
PROJECTED = ("ar", "ngram", "pld", "pld-tree", "jacobi", "auto")
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                    num_kv_heads=3, head_dim=64)  # the REAL size's shape, for its head's bytes


def head_step_bytes(size: str, draft_vocab: int) -> int:
    """Bytes one draft step of an EAGLE head reads at ``size``, on the native int8 forward its heads run on: one
    decoder layer of the target's shape, the fc from [embedding ; feature] (2D -> D) and the LM head over the
    draft vocabulary."""
    from paradecode.synthetic import SHAPES, parameters

    spec = SMOLLM2_135M if size == REAL else SHAPES[size]
    d = spec["hidden_size"]
    return parameters(spec)[0] + 2 * d * d + draft_vocab * d


@dataclass
class Steps:
    """One method's decoding in a bench run: every step's (rows verified, tokens committed)."""

    steps: list[tuple[int, int]]
    head_steps: bool = False  # a run of a head drafter with chains of one: each step also pays one head step

    def rate(self, curve: dict[int, float], head_fraction: float = 0.0) -> float:
        """Tokens per second with each step priced by ``curve`` at its width (the forward passes only: the
        per-step drafting, sampling and bookkeeping, ~1-3 ms at 135M, are left out for every method alike) and,
        for a head drafter, one head step per step at ``head_fraction`` of a one-token pass (its bytes over the
        target's: every step is charged, although a step that copies runs no head)."""
        extra = head_fraction * curve[1] if self.head_steps else 0.0
        return sum(a for _, a in self.steps) / sum(_interpolate(curve, w) + extra for w, _ in self.steps)

    @property
    def tau(self) -> float:
        return sum(a for _, a in self.steps) / len(self.steps)


def ran_a_head_arm(turn: dict) -> bool:
    """Whether ``auto`` gave steps to an arm drafting with a head in this turn (the per-arm counts of the method's
    info, which a bench record keeps in the turn's stats; the turn's own ``info`` is the runner's)."""
    arms = ((turn.get("stats") or {}).get("info") or {}).get("auto", {}).get("candidates", {})
    return any(arm.get("steps", 0) and "head" in (arm.get("info") or {}) for arm in arms.values())


def method_steps(records: Path, heads: Sequence[str] = ()) -> dict[str, Steps]:
    """Per method of PROJECTED, and per label in ``heads`` (runs of a head drafter with chains of one), its
    steps in a ``paradecode bench`` run's records. An ``auto`` run whose head arm took steps is left out: which
    steps were the head's, and how many head steps each took, its records do not say."""
    out: dict[str, Steps] = {}
    unpriced = set()
    for line in records.read_text().splitlines():
        record = json.loads(line)
        if record["method"] not in PROJECTED and record["method"] not in heads:
            continue
        steps = out.setdefault(record["method"], Steps([], head_steps=record["method"] in heads))
        for turn in record["turns"]:
            widths = turn.get("draft_lengths") or [0] * len(turn["accepted_per_step"])
            steps.steps.extend((w + 1, a) for w, a in zip(widths, turn["accepted_per_step"]))
            if record["method"] not in heads and ran_a_head_arm(turn):
                unpriced.add(record["method"])
    return {method: steps for method, steps in out.items() if method not in unpriced}


def median_curve(rounds: list[dict[str, float]]) -> dict[int, float]:
    """Seconds per T: the median over the rounds."""
    return {int(t): statistics.median(r[t] for r in rounds) for t in rounds[0]}


def paired_ratio(slow: dict, fast: dict, t: str = "1") -> float:
    """``slow``'s time over ``fast``'s at T, the median over the rounds they shared."""
    return statistics.median(a[t] / b[t] for a, b in zip(slow["rounds"], fast["rounds"]))


def report(args: argparse.Namespace) -> int:
    results = json.loads((Path(args.folder) / "results.json").read_text())
    rows = results["rows"]
    engines = sorted({key.split("|")[1] for key in rows}, key=lambda e: (not e.startswith("ours"), e))
    curves = {key: median_curve(row["rounds"]) for key, row in rows.items() if row.get("rounds")}
    heads = [label for label in (args.heads or "").split(",") if label]
    steps = method_steps(Path(args.records), heads) if args.records else {}
    missing = [label for label in heads if label not in steps]
    if missing:
        print(f"error: no records of {', '.join(missing)} in {args.records}", file=sys.stderr)
        return 2
    if heads and any("weight_bytes" not in row for key, row in rows.items() if key.endswith("|ours q4")):
        print("error: --heads prices a head step by the q4 model's bytes, which these results do not record: "
              "time them again with this version's `run --force`.", file=sys.stderr)
        return 2
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
    lines.append("Medians over the rounds; the ratios are the medians of each round's ratio.")
    lines.append("")
    lines.append("| size | llama.cpp (faster build), ms | ours q4 | ours int8 | q4 speed vs llama.cpp "
                 "| int8 vs llama.cpp |")
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
        ratios = [f"{paired_ratio(rows[f'{size}|{name}'], rows[f'{size}|ours {d}']):.2f}x" if ours[d] else "–"
                  for d in ("q4", "int8")]
        lines.append(f"| {size} | {1000 * llama[name][1]:.1f} ({name.split()[-1]}) | " + " | ".join(cells) + " | "
                     + " | ".join(ratios) + " |")
    if steps:
        methods = [m for m in (*PROJECTED, *heads) if m in steps]
        lines.append("")
        lines.append("### Projected decoding speed per method")
        lines.append("")
        lines.append("Each method's steps (rows verified, tokens committed) as measured on SmolLM2-135M on q4 "
                     f"({args.records}), each priced by the size's measured forward time of ours on q4 at its "
                     "width (greedy verification's pass, which reads each row's argmax only, where timed: "
                     "`ours q4 greedy`); forward passes only, for every method and for llama.cpp's plain decoding (one "
                     "forward per token of its faster build). τ (tokens per step): "
                     + ", ".join(f"`{m}` {steps[m].tau:.2f}" for m in methods) + "."
                     + (f" Head drafters ({', '.join(f'`{m}`' for m in heads)}): each step also pays one draft "
                        f"step of an EAGLE head in the size's shape (one decoder layer, the fc and a "
                        f"{args.draft_vocab}-token LM head, int8), priced as that share of the bytes of a one-token "
                        "pass of the target on q4, charged on every step although copies run no head."
                        if heads else ""))
        lines.append("")
        lines.append("| size | llama.cpp tok/s | " + " | ".join(f"`{m}` tok/s (vs llama.cpp)" for m in methods)
                     + " | best vs our `ar` |")
        lines.append("|---|---|" + "---|" * len(methods) + "---|")
        for size in sizes():
            # the bench runs decode greedily, so their steps are priced by greedy verification's passes (each
            # row's argmax only) where the run timed them; a run before those were timed has full logits only
            ours = curves.get(f"{size}|ours q4 greedy") or curves.get(f"{size}|ours q4")
            if ours is None or size not in best_llama:
                continue
            llama_rate = 1.0 / best_llama[size][1][1]
            fraction = (head_step_bytes(size, args.draft_vocab) / rows[f"{size}|ours q4"]["weight_bytes"]
                        if heads else 0.0)
            rates = {m: steps[m].rate(ours, fraction) for m in methods}
            best = max(rates, key=rates.get)
            cells = [f"{rates[m]:.1f} ({rates[m] / llama_rate:.2f}x)" for m in methods]
            lines.append(f"| {size} | {llama_rate:.1f} | " + " | ".join(cells)
                         + f" | `{best}` {rates[best] / rates.get('ar', rates[best]):.2f}x |")
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
    engines = sorted({key.split("|")[1] for key in curves})
    colors = {engine: f"C{i}" for i, engine in enumerate(engines)}  # one color per engine in every panel
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.4), squeeze=False)
    for ax, size in zip(axes[0], shown):
        for key, curve in sorted(curves.items()):
            if key.startswith(f"{size}|"):
                engine = key.split("|")[1]
                ax.plot(list(curve), [1000 * s for s in curve.values()], marker="o", label=engine,
                        color=colors[engine])
        ax.set_xscale("log", base=2)
        ax.set_title(size if size == REAL else f"{size} ({SHAPES[size]['model']} shape)", fontsize=9)
        ax.set_xlabel("T (new tokens per pass)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("ms per pass")
    handles = [plt.Line2D([], [], color=colors[e], marker="o", label=e) for e in engines]
    axes[0][0].legend(handles=handles, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="write the files (once) and time every engine on each size; resumes")
    r.add_argument("--sizes", default="135m,0.5b,1b,3b,8b", help="comma-separated, of 135m,0.5b,1b,3b,8b")
    r.add_argument("--out", default="results/scaling", help="folder for results.json")
    r.add_argument("--repeats", type=int, default=7, help="timed passes per T in a round; the median is kept")
    r.add_argument("--rounds", type=int, default=3, help="rounds over every engine; the report takes medians")
    r.add_argument("--force", action="store_true", help="time again what results.json already has")
    r.add_argument("--quant", default="q4_0", choices=("q4_0", "q4_k_m"),
                   help="the synthetic files' layout, as llama-quantize's type of that name (default q4_0; q4_k_m: "
                        "Q4_K projections with Q6_K attn_v and ffn_down on some layers; 1b, 3b, 8b only)")
    r.set_defaults(run=run)
    c = commands.add_parser("serve", help=argparse.SUPPRESS)
    c.add_argument("size")
    c.add_argument("dtype", choices=("q4", "int8"))
    c.add_argument("repeats", type=int)
    c.add_argument("quant", nargs="?", default="q4_0")
    c.set_defaults(run=serve)
    p = commands.add_parser("report", help="tables (and a plot) from a run's results.json")
    p.add_argument("folder")
    p.add_argument("--records", help="a paradecode bench run's records.jsonl, for the projected speed per method")
    p.add_argument("--heads", help="comma-separated labels in --records of head drafters run with chains of one "
                                   "(e.g. eagle with schedule=fixed, depth=1): projected with one head step a step")
    p.add_argument("--draft-vocab", type=int, default=4096, help="the heads' draft vocabulary (default 4096)")
    p.add_argument("--plot", help="PNG to write")
    p.add_argument("--doc", help="markdown file whose part after '<!-- scaling tables -->' is replaced")
    p.set_defaults(run=report)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
