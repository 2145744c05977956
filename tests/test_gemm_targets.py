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


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_int8_gemm_is_exact_on_each_instruction_set(target, tmp_path):
    command = native.program_command(tmp_path / "gemm.cpp", tmp_path / "gemm", target, openmp=False)
    if command is None:
        pytest.skip("no C++ compiler")
    missing = TARGETS[target] - set(native.cpu_flags().split())
    if missing:
        pytest.skip(f"this CPU cannot run -march={target} code (no {', '.join(sorted(missing))})")
    (tmp_path / "gemm.cpp").write_text(SOURCE)
    built = subprocess.run(command, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([str(tmp_path / "gemm")], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    isa = ran.stdout.split()[-5]
    expected = {"x86-64": "scalar", "haswell": "avx2"}.get(target)
    if expected:
        assert isa == expected, f"-march={target} built the {isa} path"
    assert " ok 0 of " in ran.stdout
