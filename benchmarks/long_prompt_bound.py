"""How fast `ar` could at best answer long-prompt questions (Spec-Bench rag, summarization) on this machine.

    python benchmarks/long_prompt_bound.py results/run/records.jsonl

A long prompt's answer pays its prefill before the first token: every prompt token goes through every layer's
GEMMs, whatever the kernel. This script measures the machine's peak rate of multiply-adds (a register-only loop of
the densest instruction it has, on all threads: ``vpdpbusd`` on AVX512-VNNI for int8, else gemm.h's AVX2 step
(``vpsignb``, ``vpmaddubsw``, ``vpmaddwd``, ``vpaddd`` per 32) and gemm_q4.h's AVX2 step (unsigned nibbles need no
sign: two ``vpmaddubsw``, ``vpaddw``, ``vpmaddwd``, ``vpaddd`` per 64), ``vfmadd`` for fp32; compiled with the native
forward's flags) and prices, for each rag and summarization answer of a ``paradecode bench`` run
(its ``records.jsonl``, method ``ar``): the prefill GEMMs' multiply-adds at the faster integer peak, the prefill
attention's at
the fp32 peak (or not at all, ``--free-attention``), and the decoding at the other categories' own measured time
per token (which leaves out that attending over a long prompt makes each step slower). The result is an upper
bound of each answer's tok/s, to hold against the issue's "rag and summarization within 25% of the other
categories": where the bound is below 0.75x, no kernel reaches it on this machine. The model's shapes are read from
the run's model (``--model``, default the run's SmolLM2-135M).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <omp.h>
constexpr int kChains = 12;  // independent sums: more than latency x throughput
// a[j] = step(a[j]) for every chain, `iters` rounds: registers only, so the instruction's own rate
template <class V, class Step>
__attribute__((always_inline)) inline void chains(long iters, V (&a)[kChains], Step step) {
  for (long i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j) a[j] = step(a[j]);
}
__attribute__((noinline)) long int8_loop(long iters) {
#if defined(__AVX512VNNI__)
  __m512i a[kChains];
  const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(1);
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_set1_epi32(j);
  chains(iters, a, [&](__m512i v) { return _mm512_dpbusd_epi32(v, w, x); });
  long s = 0;
  for (int j = 0; j < kChains; ++j) s += _mm512_reduce_add_epi32(a[j]);
  return s;
#elif defined(__AVX2__)  // gemm.h's AVX2 step: |x| times the weight signed by x, pairs to int16, then to int32
  // (x is the chain's own value, so that |x| and the sign are computed every step, as in the GEMM, not hoisted)
  __m256i a[kChains];
  const __m256i w = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_epi32(j);
  chains(iters, a, [&](__m256i v) {
    return _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(w, v)), ones));
  });
  long s = 0;
  for (int j = 0; j < kChains; ++j) s += _mm256_extract_epi32(a[j], 0);
  return s & 0x7fffffff;  // the sums are meaningless (any sign): only the rate counts, and < 0 means "none here"
#else
  return -1;
#endif
}
// The 4-bit kernel's step: unsigned nibbles need no sign step, so on AVX2 it is two vpmaddubsw, vpaddw, vpmaddwd
// and vpaddd per 64 multiply-adds (gemm_q4.h); with VNNI it is vpdpbusd, as int8_loop.
__attribute__((noinline)) long q4_loop(long iters) {
#if defined(__AVX512VNNI__)
  return int8_loop(iters);
#elif defined(__AVX2__)
  __m256i a[kChains];
  const __m256i lo = _mm256_set1_epi8(3), hi = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_epi32(j);
  chains(iters, a, [&](__m256i v) {  // the chain's own value as the activations: nothing is hoisted
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, v), _mm256_maddubs_epi16(hi, v));
    return _mm256_add_epi32(v, _mm256_madd_epi16(pairs, ones));
  });
  long s = 0;
  for (int j = 0; j < kChains; ++j) s += _mm256_extract_epi32(a[j], 0);
  return s & 0x7fffffff;
#else
  return -1;
#endif
}
#if defined(__AVX512VNNI__)
constexpr int kInt8Macs = 64;  // multiply-adds per step
#else
constexpr int kInt8Macs = 32;
#endif
#if defined(__AVX512VNNI__)
constexpr int kQ4Macs = kInt8Macs;
#else
constexpr int kQ4Macs = 64;
#endif
#if defined(__AVX512F__)
constexpr int kFp32Macs = 16;
#else
constexpr int kFp32Macs = 8;
#endif
__attribute__((noinline)) long fp32_loop(long iters) {
#if defined(__AVX512F__)
  __m512 a[kChains];
  const __m512 w = _mm512_set1_ps(0.5f), x = _mm512_set1_ps(0.25f);
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_set1_ps(j);
  chains(iters, a, [&](__m512 v) { return _mm512_fmadd_ps(v, w, x); });
  long s = 0;
  for (int j = 0; j < kChains; ++j) s += static_cast<long>(_mm512_reduce_add_ps(a[j]));
  return s;
#elif defined(__FMA__)
  __m256 a[kChains];
  const __m256 w = _mm256_set1_ps(0.5f), x = _mm256_set1_ps(0.25f);
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_ps(j);
  chains(iters, a, [&](__m256 v) { return _mm256_fmadd_ps(v, w, x); });
  long s = 0;
  for (int j = 0; j < kChains; ++j) s += static_cast<long>(_mm256_cvtss_f32(a[j]));
  return s;
#else
  return -1;
#endif
}
int main(int argc, char** argv) {
  const int threads = std::atoi(argv[1]);
  const long iters = 40000000L / kChains;
  const char* const names[3] = {"int8", "fp32", "q4"};
  const int macs_per_step[3] = {kInt8Macs, kFp32Macs, kQ4Macs};
  for (int kind = 0; kind < 3; ++kind) {
    double best = 0;
    bool missing = false;
    for (int rep = 0; rep < 7; ++rep) {
      long sink = 0;
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
      sink += kind == 0 ? int8_loop(iters) : kind == 1 ? fp32_loop(iters) : q4_loop(iters);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (sink < 0) missing = true;
      const double macs = static_cast<double>(iters) * kChains * threads * macs_per_step[kind];
      if (macs / s > best) best = macs / s;
    }
    std::printf("%s %.1f\n", names[kind], missing ? 0.0 : best / 1e9);
  }
}
"""


def peaks(threads: int) -> dict[str, float]:
    """{"int8": G multiply-adds/s, "fp32": ...} on `threads` threads, the best of 7 runs (0: not on this CPU)."""
    from paradecode.backends import native

    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "peak.cpp", Path(tmp) / "peak"
        command = native.program_command(source, binary)
        if command is None:
            raise SystemExit(native.NO_COMPILER)
        source.write_text(PROBE)
        subprocess.run(command, check=True)
        out = subprocess.run([str(binary), str(threads)], check=True, capture_output=True, text=True).stdout
    return {kind: float(value) for kind, value in (line.split() for line in out.splitlines())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, help="a `paradecode bench` run's records.jsonl (with method ar)")
    parser.add_argument("--model", default="smollm2-135m", help="the run's model (its shapes give the work)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: torch's, as the run used)")
    parser.add_argument("--categories", default="rag,summarization", help="the long-prompt categories")
    args = parser.parse_args()
    if not args.records.is_file():
        raise SystemExit(f"{args.records}: no such file; pass a bench run's records.jsonl.")
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    answers = [(r["category"], t) for r in records if r.get("method") == "ar" and not r.get("error") for t in r["turns"]]
    long_cats = args.categories.split(",")
    if not any(c in long_cats for c, _ in answers) or not any(c not in long_cats for c, _ in answers):
        raise SystemExit(f"{args.records} needs `ar` answers of {args.categories} and of other categories.")

    import torch

    from paradecode import api
    from paradecode.profile import cpu_name, isa_flags, isa_text

    threads = args.threads or torch.get_num_threads()
    shape = api.load(args.model).backend.shape
    hidden, inter, layers = shape.hidden_size, shape.intermediate_size, shape.num_layers
    heads, kv, head_dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
    per_token = layers * hidden * ((heads + 2 * kv) * head_dim + 3 * inter) + layers * heads * head_dim * hidden
    rate = peaks(threads)
    if not rate["int8"]:
        raise SystemExit("this CPU has neither AVX512-VNNI nor AVX2: the probe has no int8 loop for it.")
    print(f"CPU: {cpu_name()}; ISA: {isa_text(isa_flags())}; {threads} threads")
    integer = max(rate["int8"], rate["q4"])  # the prefill GEMMs at the faster of the int8 and 4-bit kernels' steps
    print(f"peak multiply-adds: int8 {rate['int8']:.0f} G/s, 4-bit step {rate['q4']:.0f} G/s, fp32 {rate['fp32']:.0f} "
          f"G/s; the layers' GEMMs: "
          f"{per_token / 1e6:.1f} M multiply-adds per token")
    others = [t for c, t in answers if c not in long_cats]
    other_speed = statistics.mean(t["new_tokens"] / t["wall_time_s"] for t in others)
    per_new = statistics.mean(t["wall_time_s"] / t["new_tokens"] for t in others)
    print(f"other categories: ar {other_speed:.1f} tok/s ({per_new * 1e3:.2f} ms per token); 0.75x of it: "
          f"{0.75 * other_speed:.1f} tok/s")
    print(f"{'category':<14} {'prompt':>6} {'new':>4} {'measured':>9} {'GEMM ms':>8} {'attn ms':>8} {'decode ms':>9} "
          f"{'at most':>8} {'no attn':>8}")
    for category in long_cats:
        bounds, free, measured = [], [], []
        for c, t in answers:
            if c != category:
                continue
            p, n = t["prompt_tokens"], t["new_tokens"]
            gemm = p * per_token / (integer * 1e9)
            attention = p * p / 2 * layers * heads * head_dim * 2 / (rate["fp32"] * 1e9)
            decode = n * per_new
            bounds.append(n / (gemm + attention + decode))
            free.append(n / (gemm + decode))
            measured.append(n / t["wall_time_s"])
            print(f"{category:<14} {p:>6} {n:>4} {measured[-1]:>9.1f} {gemm * 1e3:>8.0f} {attention * 1e3:>8.0f} "
                  f"{decode * 1e3:>9.0f} {bounds[-1]:>8.1f} {free[-1]:>8.1f}")
        print(f"{category}: measured {statistics.mean(measured):.1f} tok/s ({statistics.mean(measured) / other_speed:.2f}x "
              f"the others); at most {statistics.mean(bounds):.1f} ({statistics.mean(bounds) / other_speed:.2f}x), "
              f"{statistics.mean(free):.1f} ({statistics.mean(free) / other_speed:.2f}x) with attention free")
    return 0


if __name__ == "__main__":
    sys.exit(main())
