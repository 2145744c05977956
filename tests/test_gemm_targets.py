"""The int8 GEMM computes the same numbers on every instruction set it is compiled for, not only this CPU's.

``gemm.h`` has an AVX512-VNNI, an AVX-VNNI, an AVX2 and a plain path, and the native build takes the one
``-march=native`` offers, so the tests of the native forward exercise one of them. Here ``gemm.h`` alone is compiled
for each target this CPU can run (plain x86-64, Haswell's AVX2, and the native one) into a small program that packs
random weights of awkward shapes (a partial last column block, k not a multiple of 4) and checks every pass size
(the one- and two-row stream and its interleaved form, the 4 x 4 tiles and their leftovers) against a plain integer reference, to the bit.
"""

from __future__ import annotations

import subprocess

import pytest

from paradecode.backends import native

# target -> the CPU flags it needs to run here
TARGETS = {"x86-64": set(), "haswell": {"avx2", "fma", "bmi2"}, "native": set()}
SOURCE = r"""
#include "gemm.h"
#include <cstdio>
#include <vector>
using namespace paradecode;
int main() {
  uint32_t state = 12345;
  auto next = [&] { state = state * 1664525u + 1013904223u; return state >> 8; };
  const int64_t shapes[][2] = {{40, 70}, {16, 64}, {200, 132}, {7, 5}};
  const int64_t rows_list[] = {1, 2, 3, 4, 5, 8, 17, 70};
  int bad = 0, checked = 0;
  for (auto& s : shapes) {
    const int64_t n = s[0], k = s[1], kq = packed_quads(k), blocks = (n + kBlockCols - 1) / kBlockCols;
    std::vector<int8_t> w(n * k);
    for (auto& v : w) v = static_cast<int8_t>(static_cast<int>(next() % 255) - 127);
    std::vector<uint8_t> packed(packed_bytes(n, k));
    pack_int8(w.data(), n, k, packed.data());
    std::vector<float> scale(n);
    for (auto& v : scale) v = 1e-3f * static_cast<float>(1 + next() % 1000);
    const PackedInt8 pw{packed.data(), scale.data(), n, k, kq, blocks};
    for (int64_t rows : rows_list) {
      std::vector<int8_t> q(rows * kq * 4, 0);
      std::vector<int32_t> rowsum(rows, 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c) {
          q[r * kq * 4 + c] = static_cast<int8_t>(static_cast<int>(next() % 255) - 127);
          rowsum[r] += q[r * kq * 4 + c];
        }
      for (bool interleaved : {false, true}) {
      std::vector<float> y(rows * n, -1.0f);
      float spill[kMaxTileRows * kBlockCols];
      // two pieces of the column blocks, as threads share them out
      const int64_t half = blocks / 2;
      int8_gemm(pw, q.data(), kq * 4, rowsum.data(), rows, y.data(), n, 0, half, spill, interleaved);
      int8_gemm(pw, q.data(), kq * 4, rowsum.data(), rows, y.data(), n, half, blocks, spill, interleaved);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < n; ++c) {
          int64_t sum = 0;
          for (int64_t j = 0; j < k; ++j) sum += static_cast<int64_t>(w[c * k + j]) * q[r * kq * 4 + j];
          const float expect = static_cast<float>(static_cast<int32_t>(sum)) * scale[c];
          ++checked;
          if (y[r * n + c] != expect && bad++ < 5)
            std::printf("n=%ld k=%ld rows=%ld interleaved=%d row %ld col %ld: %g != %g\n", (long)n, (long)k,
                        (long)rows, int(interleaved), (long)r, (long)c, y[r * n + c], expect);
        }
      }
    }
  }
  std::printf("%s %s %d of %d\n", gemm_isa(), bad ? "wrong" : "ok", bad, checked);
  return bad != 0;
}
"""


def run_program(source: str, target: str, folder) -> str:
    """Compile `source` for -march=`target` with the native build's flags, run it, and return what it printed
    (skips where there is no compiler or this CPU cannot run the target's code; fails where the program does)."""
    command = native.program_command(folder / "check.cpp", folder / "check", target, openmp=False)
    if command is None:
        pytest.skip("no C++ compiler")
    missing = TARGETS[target] - set(native.cpu_flags().split())
    if missing:
        pytest.skip(f"this CPU cannot run -march={target} code (no {', '.join(sorted(missing))})")
    (folder / "check.cpp").write_text(source)
    built = subprocess.run(command, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([str(folder / "check")], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    return ran.stdout


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_int8_gemm_is_exact_on_each_instruction_set(target, tmp_path):
    printed = run_program(SOURCE, target, tmp_path)
    isa = printed.split()[-5]
    expected = {"x86-64": "scalar", "haswell": "avx2"}.get(target)
    if expected:
        assert isa == expected, f"-march={target} built the {isa} path"
    assert " ok 0 of " in printed


# The block GEMM (gemm_q4.h) on each target against its formula, to the bit: per column and group of 32 inputs,
# acc = mul_add(a, mul_add(d, float(sum q p), m * psum), acc) (lanes.h: fused where the target has FMA), groups in
# order, with q the 4-bit nibbles (m stored, or Q4_0's -8 d), Q5_0's 5 bits (m = -16 d) or Q8_0's bytes plus 128
# (m = -128 d); and Q6_K's
# 6-bit q: per sub-block of 16, T = sc (sum q p - 32 sum p), inner = mul_add(a, T, inner), and per 256 inputs
# acc = mul_add(d, inner, acc); and Q4_K's nibbles with d = d256 * sc and m = dmin256 * -mn per group (exact
# products, then Q4_1's steps). The 8-bit path on AVX2 splits each byte into nibbles (its byte products would
# overflow 16 bits), which is what this test guards, with the 6-bit high bits' and Q4_K's scales' placement.
BLOCK_SOURCE = r"""
#include "gemm_q4.h"
#include <cmath>
#include <cstdio>
#include <vector>
using namespace paradecode;
int main() {
  uint32_t state = 777;
  auto next = [&] { state = state * 1664525u + 1013904223u; return state >> 8; };
  const int64_t shapes[][2] = {{40, 64}, {16, 32}, {200, 96}, {40, 256}, {24, 512}};
  const int64_t rows_list[] = {1, 2, 3, 4, 5, 8, 17};
  const int formats[][2] = {{4, 1}, {4, 0}, {5, 0}, {8, 0}, {6, 0}, {kQ4K, 0}};  // bits (or Q4_K's id), m stored
  int bad = 0, checked = 0;
  for (auto& f : formats)
    for (auto& s : shapes) {
      const int bits = f[0];
      const bool with_m = f[1];
      const int64_t n = s[0], k = s[1], groups = k / kQ4Group, blocks = (n + kBlockCols - 1) / kBlockCols;
      if (bits == 6 || bits == kQ4K ? k % 256 != 0 : k > 128) continue;
      const int64_t gb = q4_group_bytes(with_m, bits);
      std::vector<uint8_t> packed(q4_packed_bytes(n, k, with_m, bits), 0);
      std::vector<int> q(blocks * kBlockCols * k), sc(blocks * kBlockCols * k / 16);
      std::vector<float> d(blocks * kBlockCols * groups), m(d.size());
      std::vector<float> super_d(blocks * kBlockCols), super_m(super_d.size());  // Q4_K's d and dmin
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t g = 0; g < groups; ++g) {
          uint8_t* block = packed.data() + b * groups * gb;
          uint8_t* group = block + (bits == 6 ? (g / 8) * 3360 + (g % 8) * 416
                                    : bits == kQ4K ? (g / 8) * 2368 + (g % 8) * 288 : g * gb);
          for (int64_t c = 0; c < kBlockCols; ++c) {
            const int64_t col = b * kBlockCols + c;
            for (int64_t i = 0; i < kQ4Group; ++i) {
              const int v = static_cast<int>(next() % (bits == 8 ? 256 : bits == 6 ? 64 : bits == 5 ? 32 : 16));
              q[col * k + g * kQ4Group + i] = v;
              if (bits == 8) {
                group[(i / 4) * 64 + c * 4 + i % 4] = static_cast<uint8_t>(v);
              } else {
                group[(i / 8) * 64 + c * 4 + i % 4] |= static_cast<uint8_t>(i % 8 < 4 ? (v & 15) : (v & 15) << 4);
                if (bits == 6)  // high bits: vector i / 16, field (i % 16) / 4 of byte i % 4
                  group[256 + (i / 16) * 64 + c * 4 + i % 4] |= static_cast<uint8_t>((v >> 4) << (2 * ((i % 16) / 4)));
                if (bits == 5)  // fifth bits: bit 2 (i / 8) + (i % 8) / 4 of byte i % 4
                  group[256 + c * 4 + i % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (i / 8) + (i % 8) / 4));
              }
            }
            if (bits == 6) {
              for (int h = 0; h < 2; ++h) {
                const int v = static_cast<int>(next() % 256) - 128;
                sc[col * (k / 16) + 2 * g + h] = v;
                group[384 + 16 * h + c] = static_cast<uint8_t>(static_cast<int8_t>(v));
              }
              if (g % 8 == 0) {
                const half dh = to_half(1e-4f * static_cast<float>(1 + next() % 1000));
                std::memcpy(packed.data() + b * groups * gb + (g / 8) * 3360 + 3328 + 2 * c, &dh, 2);
                for (int64_t h = g; h < g + 8; ++h) d[col * groups + h] = from_half(dh);
              }
              continue;
            }
            if (bits == kQ4K) {  // sc and mn per group; d and dmin per 256 inputs
              if (g % 8 == 0) {
                const half dh = to_half(1e-4f * static_cast<float>(1 + next() % 1000));
                const half mh = to_half(1e-3f * static_cast<float>(next() % 1000));
                std::memcpy(block + (g / 8) * 2368 + 2304 + 2 * c, &dh, 2);
                std::memcpy(block + (g / 8) * 2368 + 2336 + 2 * c, &mh, 2);
                super_d[col] = from_half(dh);
                super_m[col] = from_half(mh);
              }
              const int scale_g = static_cast<int>(next() % 64), min_g = static_cast<int>(next() % 64);
              group[256 + c] = static_cast<uint8_t>(scale_g);
              group[272 + c] = static_cast<uint8_t>(min_g);
              d[col * groups + g] = super_d[col] * static_cast<float>(scale_g);
              m[col * groups + g] = super_m[col] * -static_cast<float>(min_g);
              continue;
            }
            const half dh = to_half(1e-3f * static_cast<float>(1 + next() % 1000));
            const half mh = to_half(-1e-2f * static_cast<float>(next() % 1000));
            std::memcpy(group + (bits == 8 ? 512 : bits == 5 ? 320 : 256) + 2 * c, &dh, 2);
            if (with_m) std::memcpy(group + 288 + 2 * c, &mh, 2);
            d[col * groups + g] = from_half(dh);
            const float implied = bits == 8 ? -128.f : bits == 5 ? -16.f : -8.f;
            m[col * groups + g] = with_m ? from_half(mh) : implied * from_half(dh);
          }
        }
      const PackedQ4 w{packed.data(), n, k, groups, blocks, gb};
      for (int64_t rows : rows_list) {
        std::vector<int8_t> p(rows * k);
        std::vector<float> scale(rows * groups), sum(rows * groups, 0.f);
        std::vector<int32_t> halves(2 * rows * groups, 0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t g = 0; g < groups; ++g) {
            int total = 0;
            for (int64_t i = 0; i < kQ4Group; ++i) {
              const int v = static_cast<int>(next() % 255) - 127;
              p[r * k + g * kQ4Group + i] = static_cast<int8_t>(v);
              total += v;
              halves[2 * (r * groups + g) + i / 16] += v;
            }
            sum[r * groups + g] = static_cast<float>(total);
            scale[r * groups + g] = 1e-2f * static_cast<float>(1 + next() % 100);
          }
        const Q4Rows x{p.data(), scale.data(), sum.data(), k, groups, halves.data()};
        for (bool interleaved : {false, true}) {
          std::vector<float> y(rows * n, -1.0f);
          float spill[kMaxTileRows * kBlockCols];
          const int64_t half_blocks = blocks / 2;  // two pieces of the column blocks, as threads share them out
          q4_gemm(w, x, rows, y.data(), n, 0, half_blocks, spill, interleaved);
          q4_gemm(w, x, rows, y.data(), n, half_blocks, blocks, spill, interleaved);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < n; ++c) {
              float acc = 0.f, inner = 0.f;
              for (int64_t g = 0; g < groups; ++g) {
                if (bits == 6) {
                  for (int h = 0; h < 2; ++h) {
                    int32_t qsum = 0, psum = 0;
                    for (int64_t i = 16 * h; i < 16 * h + 16; ++i) {
                      qsum += q[c * k + g * kQ4Group + i] * p[r * k + g * kQ4Group + i];
                      psum += p[r * k + g * kQ4Group + i];
                    }
                    const int32_t t = sc[c * (k / 16) + 2 * g + h] * (qsum - 32 * psum);
                    inner = mul_add(scale[r * groups + g], static_cast<float>(t), inner);
                  }
                  if (g % 8 == 7) {
                    acc = mul_add(d[c * groups + g], inner, acc);
                    inner = 0.f;
                  }
                  continue;
                }
                int32_t qsum = 0;
                for (int64_t i = 0; i < kQ4Group; ++i) qsum += q[c * k + g * kQ4Group + i] * p[r * k + g * kQ4Group + i];
                const float dd = d[c * groups + g], mm = m[c * groups + g];
                acc = mul_add(scale[r * groups + g], mul_add(dd, static_cast<float>(qsum), mm * sum[r * groups + g]), acc);
              }
              ++checked;
              if (y[r * n + c] != acc && bad++ < 5)
                std::printf("bits=%d m=%d n=%ld k=%ld rows=%ld interleaved=%d row %ld col %ld: %g != %g\n", bits,
                            int(with_m), (long)n, (long)k, (long)rows, int(interleaved), (long)r, (long)c,
                            y[r * n + c], acc);
            }
        }
      }
    }
  std::printf("%s %d of %d\n", bad ? "wrong" : "ok", bad, checked);
  return bad != 0;
}
"""


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_block_gemm_is_exact_on_each_instruction_set(target, tmp_path):
    assert run_program(BLOCK_SOURCE, target, tmp_path).startswith("ok 0 of ")
