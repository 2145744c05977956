"""Does a bf16 matmul beat our int8 projection on this CPU, at any row count?

    python benchmarks/matmul_dtypes.py [--rows 1,8,64,256] [--repeats 20]

Times SmolLM2-135M's widest projection (gate/up, 576 -> 3072) as fp32 ``x @ W.T``, bf16 ``F.linear`` (oneDNN;
AMX or AVX512-BF16 where the CPU has them) and paradecode's ``Int8Linear`` (per-token int8 activations, exact
integer GEMM, fp32 out) for each row count: median microseconds over ``--repeats`` calls, weights warm in cache.
A bf16 path would only be worth building for the row counts where its column wins.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from paradecode.backends.int8 import Int8Linear


def median_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,64,256", help="row counts T (default: 1,8,64,256)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per cell (default: 20)")
    args = parser.parse_args()
    torch.manual_seed(0)
    weight = torch.randn(3072, 576) * 0.02  # [out, in]
    weight_t = weight.t().contiguous()
    weight_bf16 = weight.to(torch.bfloat16)
    int8 = Int8Linear.from_float(weight)
    print(f"{'T':>5}{'fp32 us':>10}{'bf16 us':>10}{'int8 us':>10}")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, 576)
        x_bf16 = x.to(torch.bfloat16)
        cells = [median_us(lambda: x @ weight_t, args.repeats),
                 median_us(lambda: F.linear(x_bf16, weight_bf16), args.repeats),
                 median_us(lambda: int8(x), args.repeats)]
        print(f"{rows:>5}" + "".join(f"{c:>10.0f}" for c in cells))


if __name__ == "__main__":
    main()
