"""Each int8 GEMM kernel the native forward offers on this machine, forced for every pass size, timed in turns.

    python benchmarks/kernel_stages.py --rounds 3                  # GEMM stage and whole forward per T
    python benchmarks/kernel_stages.py --prefill 1000 --rounds 3   # one long prefill's stages per kernel
    python benchmarks/kernel_stages.py --dtype q4 --prefill 1000   # the same for the 4-bit GEMM (own, amx)

Per T (256-token context, as ``paradecode profile``): the GEMM stage's ms (the native pass's own clock) and the
whole forward's median ms, every bucket forced to one kernel; kernels take turns each round, and the median over
rounds is printed, so drift in the machine's speed spreads over all of them. ``--prefill N``: one N-token pass
from an empty cache per kernel (the one-token bucket stays on ``own``), every stage's ms; the LM head over every
row is timed too, though the engine's prefill skips it. Prints the CPU model first: quote it with the numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from paradecode import api
from paradecode.profile import cpu_name, measure_curve, measure_stages

SIZES = (1, 2, 4, 8, 16, 32)


def curves(backend, kernels: list[str], rounds: int) -> None:
    gemm = {k: {t: [] for t in SIZES} for k in kernels}
    whole = {k: {t: [] for t in SIZES} for k in kernels}
    for _ in range(rounds):
        for kernel in kernels:
            backend.use_kernels(dict.fromkeys(("one", "verify", "prefill"), kernel))
            stages = measure_stages(backend, SIZES, repeats=5)
            curve = measure_curve(backend, SIZES, repeats=5)
            for t in SIZES:
                gemm[kernel][t].append(stages[t]["gemm"] * 1e3)
                whole[kernel][t].append(curve[t] * 1e3)
    for title, table in (("GEMM stage, ms", gemm), ("whole forward, ms", whole)):
        print(f"{title} (median of {rounds} rounds)")
        print("kernel   " + "".join(f"T={t:<7}" for t in SIZES))
        for kernel in kernels:
            print(f"{kernel:8} " + "".join(f"{statistics.median(table[kernel][t]):<9.2f}" for t in SIZES))


def prefill(backend, kernels: list[str], tokens: int, rounds: int) -> None:
    ids = torch.arange(tokens) % backend.vocab_size
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kernels}
    for _ in range(rounds):
        for kernel in kernels:
            backend.use_kernels({"one": "own", "verify": kernel, "prefill": kernel})

            def one_pass() -> None:
                backend.reset()
                backend.forward(ids)

            runs[kernel].append(backend.stage_seconds(one_pass))
    names = sorted(runs[kernels[0]][0])
    print(f"prefill of {tokens} tokens, ms per stage (median of {rounds} rounds)")
    print("kernel  " + " ".join(f"{name:>10}" for name in names) + "  total w/o head")
    for kernel in kernels:
        ms = {name: statistics.median(run[name] for run in runs[kernel]) * 1e3 for name in names}
        print(f"{kernel:7} " + " ".join(f"{ms[name]:10.1f}" for name in names)
              + f"  {sum(v for name, v in ms.items() if name != 'lm head'):10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=0, metavar="N", help="time one N-token prefill instead")
    parser.add_argument("--dtype", choices=["int8", "q4"], default="int8",
                        help="int8 weights, or a GGUF model's 4-bit blocks (the 4-bit GEMM and its AMX tile form)")
    args = parser.parse_args()
    backend = api.load(args.model, dtype=args.dtype).backend
    kernels = backend.available_kernels() if hasattr(backend, "available_kernels") else []
    if not kernels:
        sys.exit(f"kernel_stages: this model has no native {args.dtype} forward here (no kernels to compare)")
    print(cpu_name(), "kernels:", ", ".join(kernels))
    if args.prefill:
        prefill(backend, kernels, args.prefill, args.rounds)
    else:
        curves(backend, kernels, args.rounds)


if __name__ == "__main__":
    main()
