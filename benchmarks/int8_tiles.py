"""The int8 GEMM's tile shape, chunk and prefetch distance, compared in one process on a forward's worth of weights.

    python benchmarks/int8_tiles.py --rows 4,8,16 --variants 4x4/8/64,4x4/8/32,8x2/16/64

Compiles ``backends/native/gemm.h`` (g++ with the native forward's flags, ``native.FLAGS``) into a small program
that packs 30 layers of SmolLM2-135M's four projections (106 MB of random int8 weights, more than the caches hold,
so every pass streams them from memory as a forward does) and runs each variant's GEMMs over all of them, the
variants taking turns rep by rep, on 2 threads that split each matrix's column blocks as the forward does. A
variant is ``MRxNB/CHUNK/PREFETCH``: rows x 16-column blocks per register tile, k quads per chunk, and how many
quads ahead the weights are asked into L2 (``gemm.h``'s kTileRows x kTileBlocks, kChunkQuads, kPrefetchQuads;
``gemm_blocks`` takes the last two as template arguments).
Prints each variant's median time per forward's GEMMs and the median of its per-rep ratios to the first variant:
the machine's drift falls on every variant alike, so the ratio is what to read.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from paradecode.backends import native


SOURCE = r"""
#include "gemm.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <omp.h>
using namespace paradecode;

template <int MR, int NB, int CHUNK, int PF>
void run_v(const PackedInt8& w, const int8_t* q, const int32_t* rowsum, int64_t rows, float* y, int64_t b0,
           int64_t b1, float* spill) {
  for_blocks<NB>(w.n, rows, y, w.n, b0, b1, spill, [&](auto nb, int64_t b, float* out, int64_t stride) {
    gemm_blocks<MR, decltype(nb)::value, CHUNK, PF>(w, b, q, w.kq * 4, rowsum, rows, out, stride);
  });
}

using Fn = void (*)(const PackedInt8&, const int8_t*, const int32_t*, int64_t, float*, int64_t, int64_t, float*);
static const Fn kVariants[] = {VARIANTS};

int main(int argc, char** argv) {
  const int reps = std::atoi(argv[1]);
  const int nv = sizeof(kVariants) / sizeof(kVariants[0]);
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<float>> scales;
  std::vector<PackedInt8> mats;
  std::mt19937 rng(1);
  for (int l = 0; l < 30; ++l)
    for (auto& s : shapes) {
      data.emplace_back(packed_bytes(s[0], s[1]));
      for (auto& b : data.back()) b = static_cast<uint8_t>(rng());
      scales.emplace_back(s[0], 0.01f);
      mats.push_back(PackedInt8{data.back().data(), scales.back().data(), s[0], s[1], packed_quads(s[1]),
                                (s[0] + kBlockCols - 1) / kBlockCols});
    }
  for (int a = 2; a < argc; ++a) {
    const int rows = std::atoi(argv[a]);
    std::vector<int8_t> q(rows * 1536);
    for (auto& v : q) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    std::vector<int32_t> rowsum(rows, 0);
    std::vector<float> y(rows * 3072);
    std::vector<std::vector<double>> t(nv);
    for (int rep = 0; rep < reps; ++rep)
      for (int v = 0; v < nv; ++v) {
        const auto start = std::chrono::steady_clock::now();
        for (auto& W : mats) {
#pragma omp parallel num_threads(2)
          {
            const int id = omp_get_thread_num(), nt = omp_get_num_threads();
            int64_t per = (W.blocks + nt - 1) / nt;
            per = (per + 7) / 8 * 8;
            const int64_t b0 = std::min(W.blocks, id * per), b1 = std::min(W.blocks, b0 + per);
            float spill[kMaxTileRows * kBlockCols];
            if (b0 < b1) kVariants[v](W, q.data(), rowsum.data(), rows, y.data(), b0, b1, spill);
          }
        }
        t[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    for (int v = 0; v < nv; ++v) {
      std::vector<double> ratio, s = t[v];
      for (int rep = 0; rep < reps; ++rep) ratio.push_back(t[v][rep] / t[0][rep]);
      std::sort(ratio.begin(), ratio.end());
      std::sort(s.begin(), s.end());
      std::printf("%d %d %.6f %.4f\n", rows, v, s[reps / 2], ratio[reps / 2]);
    }
  }
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="4x4/8/32,4x4/8/64,4x4/8/16,8x2/16/32",
                        help="MRxNB/CHUNK/PREFETCH, comma-separated; ratios are to the first (default: today's "
                             "gemm.h first)")
    parser.add_argument("--rows", default="2,4,8,16", help="rows per pass, comma-separated")
    parser.add_argument("--reps", type=int, default=41, help="passes over the weights per variant")
    args = parser.parse_args()
    variants = args.variants.split(",")
    parsed = [re.fullmatch(r"(\d+)x(\d+)/(\d+)/(\d+)", v) for v in variants]
    if not all(parsed) or any(not 1 <= int(m[1]) <= 8 or not 1 <= int(m[2]) <= 8 for m in parsed):
        raise SystemExit("--variants takes MRxNB/CHUNK/PREFETCH items (MR and NB 1-8), e.g. 4x4/8/32.")
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        raise SystemExit("--rows takes integers, comma-separated (e.g. 4,8).")
    if any(not 1 <= r <= 64 for r in rows):
        raise SystemExit("--rows must lie in 1..64 (the rows one tile keeps).")
    instances = ", ".join(f"run_v<{m[1]}, {m[2]}, {m[3]}, {m[4]}>" for m in parsed)
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "int8_tiles.cpp", Path(tmp) / "int8_tiles"
        command = native.program_command(source, binary)
        if command is None:
            raise SystemExit(native.NO_COMPILER)
        source.write_text(SOURCE.replace("VARIANTS", instances))
        subprocess.run(command, check=True)
        out = subprocess.run([str(binary), str(args.reps), *map(str, rows)], check=True, capture_output=True,
                             text=True).stdout
    from paradecode.profile import cpu_name, isa_flags, isa_text

    print(f"CPU: {cpu_name()}; ISA: {isa_text(isa_flags())}")
    print(f"{'rows':>4} {'variant':>14} {'ms':>8} {'vs first':>9}")
    for line in out.splitlines():
        r, v, seconds, ratio = line.split()
        print(f"{r:>4} {variants[int(v)]:>14} {float(seconds) * 1e3:8.3f} {float(ratio):8.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
