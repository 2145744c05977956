"""The 4-bit GEMM alone against what this CPU's cores can do: multiply-adds per second by rows per pass, beside the
peak of its multiply step alone.

    python benchmarks/q4_kernel.py                       # SmolLM2-135M's four shapes and one far larger than the caches
    python benchmarks/q4_kernel.py --shapes 3072x576 --rows 1,2,3,4,8 --threads 1

Compiles ``backends/native/gemm_q4.h`` alone (g++ with the native forward's flags, ``native.FLAGS``) into a
small program that fills random Q4_1 blocks (on 2 MiB pages where the OS gives them, as the forward's weights
are), splits the column blocks over the threads as two contiguous halves and takes the best of ``--repeats``
passes for each row count, beside a plain read of the same bytes split the same way (kernel "read": how fast this
machine streams them at all, to compare the one-row GB/s with). The peak loop
runs 12 independent chains per thread of the kernel's multiply step: vpdpbusd with AVX512-VNNI, else AVX2's two
vpmaddubsw, vpaddw, vpmaddwd and vpaddd per 64 multiply-adds (elsewhere it is skipped). A verify pass of T
rows is compute-bound once T x multiply-adds per weight outrun the memory read: compare the GMAC/s here with the
peak to see how far the kernel is from the instruction's limit on this CPU, and the large shape's GB/s with the
memory bandwidth ``paradecode profile`` measures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from paradecode.backends import native


SOURCE = r"""
#include "gemm_q4_amx.h"
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <omp.h>
#include <sys/mman.h>
using namespace paradecode;

// The packed weights on 2 MiB pages where the OS gives them (the forward's are: backends/hugepages.py).
static uint8_t* huge_bytes(size_t n) {
  const size_t page = size_t{1} << 21, size = (n + page - 1) / page * page;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(page, size));
  madvise(p, size, MADV_HUGEPAGE);  // a refusal leaves ordinary pages
  return p;
}

// The column blocks thread `id` of `nt` takes: contiguous shares, whole multiples of 4 blocks.
static void thread_blocks(int64_t blocks, int id, int nt, int64_t& b0, int64_t& b1) {
  const int64_t per = ((blocks + nt - 1) / nt + 3) / 4 * 4;
  b0 = std::min(blocks, id * per);
  b1 = std::min(blocks, b0 + per);
}

// Seconds (the best of `repeats`) to read `blocks` blocks of `block_bytes` split over the threads as the kernel's
// are.
static double timed_read(const uint8_t* data, int64_t blocks, int64_t block_bytes, int threads, int repeats) {
  double best = 1e30;
  for (int rep = 0; rep < repeats; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    long sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      int64_t b0, b1;
      thread_blocks(blocks, omp_get_thread_num(), omp_get_num_threads(), b0, b1);
      const auto* p = reinterpret_cast<const uint64_t*>(data + b0 * block_bytes);
      const int64_t words = (b1 - b0) * block_bytes / 8;
      uint64_t a = 0, b = 0, c = 0, d = 0;
      for (int64_t i = 0; i + 4 <= words; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
      }
      sink += static_cast<long>(a + b + c + d);
    }
    if (sink == 42) std::printf(" ");
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The best of 3 timings of `chains(iters)` on every thread (12 independent chains of the kernel's multiply step,
// 64 multiply-adds each per iteration), in GMAC/s.
template <class Chains>
static double timed_peak(int threads, Chains chains) {
  const long iters = 20000000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    long sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += chains(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sink == 42) std::printf(" ");
    best = std::max(best, threads * iters * 12.0 * 64 / s / 1e9);
  }
  return best;
}

static double peak(int threads) {  // GMAC/s of 12 independent chains of the kernel's multiply step per thread
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return timed_peak(threads, [](long iters) {
    __m512i acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
    __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x05060708);
    for (long it = 0; it < iters; ++it) {
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
      __asm__ volatile("" : "+v"(a));
    }
    long sink = 0;
    for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_epi32(acc[i]);
    return sink;
  });
#elif defined(__AVX2__)  // gemm_q4.h's AVX2 step: two nibble vectors x bytes (vpmaddubsw), to int32 (vpmaddwd)
  return timed_peak(threads, [](long iters) {
    __m256i acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
    __m256i a = _mm256_set1_epi32(0x01020304), b = _mm256_set1_epi32(0x05060708);
    const __m256i lo = _mm256_set1_epi8(3), hi = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
    for (long it = 0; it < iters; ++it) {
      for (int i = 0; i < 12; ++i) {
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, a), _mm256_maddubs_epi16(hi, b));
        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pairs, ones));
        __asm__ volatile("" : "+x"(a), "+x"(b));  // new operands every step: nothing is hoisted
      }
    }
    long sink = 0;
    for (int i = 0; i < 12; ++i) sink += _mm256_extract_epi32(acc[i], 0);
    return sink;
  });
#else
  (void)threads;
  return 0;
#endif
}

int main(int argc, char** argv) {
  const int threads = std::atoi(argv[1]), repeats = std::atoi(argv[2]);
  std::vector<int> rows_list;
  for (char* p = std::strtok(argv[3], ","); p; p = std::strtok(nullptr, ",")) rows_list.push_back(std::atoi(p));
  const bool amx = std::strcmp(argv[4], "amx") == 0;
  if (amx && !amx_ready()) {
    std::printf("no-amx\n");
    return 0;
  }
  std::printf("peak %.1f\n", peak(threads));
  for (int s = 5; s < argc; ++s) {
    const int64_t n = std::atoll(argv[s]), k = std::atoll(std::strchr(argv[s], 'x') + 1);
    std::mt19937 rng(1);
    const int64_t bytes = q4_packed_bytes(n, k, true);
    uint8_t* w = huge_bytes(bytes);
    for (int64_t i = 0; i < bytes; ++i) w[i] = static_cast<uint8_t>(rng());
    const PackedQ4 W{w, n, k, k / kQ4Group, (n + kBlockCols - 1) / kBlockCols, kQ4GroupBytes};
    for (int64_t b = 0; b < W.blocks; ++b)  // d and m: small positive half floats
      for (int64_t g = 0; g < W.groups; ++g)
        for (int i = 0; i < 32; ++i) {
          const uint16_t h = 0x2000 + (rng() & 0xff);
          std::memcpy(w + (b * W.groups + g) * kQ4GroupBytes + 256 + 2 * i, &h, 2);
        }
    const double read = timed_read(w, W.blocks, W.groups * kQ4GroupBytes, threads, repeats);
    std::printf("%s read %.6e 0 %.1f\n", argv[s], read, bytes / read / 1e9);
    for (int rows : rows_list) {
      std::vector<int8_t> p(q4_amx_padded_rows(rows) * k);
      for (auto& v : p) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
      std::vector<float> scale(rows * W.groups, 0.01f), sum(rows * W.groups, 3.f), y(rows * n);
      const Q4Rows x{p.data(), scale.data(), sum.data(), k, W.groups};
      double best = 1e30;
      for (int rep = 0; rep < repeats; ++rep) {
        const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
        {
          int64_t b0, b1;
          thread_blocks(W.blocks, omp_get_thread_num(), omp_get_num_threads(), b0, b1);
          float spill[kMaxTileRows * kBlockCols];
          if (b0 < b1 && amx) q4_amx_gemm(W, x, rows, y.data(), n, b0, b1, spill);
          else if (b0 < b1) q4_gemm(W, x, rows, y.data(), n, b0, b1, spill);
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::printf("%s %d %.6e %.1f %.1f\n", argv[s], rows, best, rows * double(n) * k / best / 1e9, bytes / best / 1e9);
    }
    std::free(w);
  }
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="960x576,576x576,3072x576,576x1536,98304x2048",
                        help="output columns x inputs, comma-separated (default: SmolLM2-135M's qkv, o, gate_up, "
                             "down, and a 113 MB weight no cache holds)")
    parser.add_argument("--rows", default="1,2,3,4,6,8,16,32,64", help="rows per pass, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9, help="passes per measurement; the best is kept")
    parser.add_argument("--kernels", default="own,amx",
                        help="own (the vector kernel, gemm_q4.h) and/or amx (its AMX tile form, gemm_q4_amx.h; "
                             "skipped where the CPU or OS has no AMX), comma-separated")
    args = parser.parse_args()
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
        [int(r) for r in args.rows.split(",")]
    except ValueError:
        raise SystemExit("--shapes takes NxK pairs (e.g. 3072x576) and --rows integers, both comma-separated.")
    kernels = args.kernels.split(",")
    if not kernels or set(kernels) - {"own", "amx"}:
        raise SystemExit(f"--kernels takes own and/or amx, comma-separated (got {args.kernels!r}).")
    if any(k % 32 for _, k in shapes):
        raise SystemExit("every shape's input count must be a multiple of 32 (the Q4 block size).")
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "q4_kernel.cpp", Path(tmp) / "q4_kernel"
        command = native.program_command(source, binary)
        if command is None:
            raise SystemExit(native.NO_COMPILER)
        source.write_text(SOURCE)
        subprocess.run(command, check=True)
        outputs = {kernel: subprocess.run([str(binary), str(args.threads), str(args.repeats), args.rows, kernel,
                                           *[f"{n}x{k}" for n, k in shapes]],
                                          check=True, capture_output=True, text=True).stdout for kernel in kernels}
    header = False
    for kernel, out in outputs.items():
        lines = out.split("\n")
        if lines[0] == "no-amx":
            print(f"{kernel}: not run (this CPU or OS offers no AMX tiles)")
            continue
        peak = float(lines[0].split()[1])
        if not header:
            rate = f"{peak:.1f} GMAC/s" if peak else "n/a (neither AVX512-VNNI nor AVX2)"
            print(f"peak of the kernel's multiply step (vpdpbusd, or AVX2's vpmaddubsw pair), {args.threads} "
                  f"threads: {rate}")
            print(f"{'kernel':>6} {'shape':>12} {'rows':>5} {'ms':>8} {'GMAC/s':>8} {'of peak':>8} {'GB/s':>7}")
            header = True
        for line in lines[1:]:
            if not line.strip():
                continue
            shape, rows, seconds, gmacs, gbs = line.split()
            if rows == "read":  # the plain read of the shape's bytes
                if kernel == kernels[0]:
                    print(f"{'read':>6} {shape:>12} {'-':>5} {float(seconds) * 1e3:8.3f} {'-':>8} {'-':>8} "
                          f"{float(gbs):7.1f}")
                continue
            share = f"{float(gmacs) / peak:.0%}" if peak else "-"
            print(f"{kernel:>6} {shape:>12} {rows:>5} {float(seconds) * 1e3:8.3f} {float(gmacs):8.1f} {share:>8} "
                  f"{float(gbs):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
