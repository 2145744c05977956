"""The native kernels' hot loops compile to packed vector instructions for every x86 target, not only the CPU
running the tests.

The native forward is built with ``-march=native`` on the user's machine, so a loop that the compiler
vectorizes for one CPU and leaves scalar for another (a 16-lane multiply-add written as a loop of scalar
``fmaf`` became 16 ``vfmadd231ss`` on Haswell, Skylake-X and Sapphire Rapids targets, and halved the speed on
those machines) would pass every test here and still be slow there. Compiling needs no such CPU: each target's
assembly of the attention score loop (and its packed widening of the half-float cache) and the int8 GEMM tile is
checked for the packed instructions it must use.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from paradecode.backends import native

# target -> the GEMM's inner product instruction (gemm.h picks it from the target's instruction set)
TARGETS = {
    "haswell": "vpmaddubsw",          # AVX2 + FMA
    "skylake-avx512": "vpmaddubsw",   # AVX-512 without VNNI: the 256-bit AVX2 GEMM
    "x86-64-v4": "vpmaddubsw",        # the same, by the ISA level's name
    "alderlake": "vpdpbusd",          # AVX-VNNI on 256-bit registers
    "icelake-server": "vpdpbusd",     # AVX512-VNNI
    "sapphirerapids": "vpdpbusd",
    "znver4": "vpdpbusd",
}
AMX_TARGETS = {"sapphirerapids"}  # targets with AMX-INT8 tiles: gemm_amx.h's kernel is compiled in
# the 4-bit GEMM (gemm_q4.h) uses vpdpbusd with AVX512-VNNI only; AVX-VNNI targets take its AVX2 path
Q4_TARGETS = {**TARGETS, "alderlake": "vpmaddubsw"}
SOURCE = """
#include "attention.h"
#include "gemm.h"
#include "gemm_amx.h"
#include "gemm_q4.h"
#include "gemm_q4_amx.h"
namespace paradecode {
extern "C" __attribute__((noinline, flatten)) void check_scores(const LayerCache& c, const int32_t* p, const float* const* q,
                                                                 int64_t seen, float* s) {
  score_blocks<6>(c, p, 0, q, 0, seen, s, 1024);
}
extern "C" __attribute__((noinline, flatten)) void check_values(const LayerCache& c, const int64_t* v, const float* const* p,
                                                                 float* const* a, int64_t n) {
  weighted_values<4>(c, 0, v, 0, n, p, a);
}
extern "C" __attribute__((noinline, flatten)) void check_gemm(const PackedInt8& w, const int8_t* q, int32_t* sums) {
  gemm_tile<4, 4>(w, 0, q, 64, 0, w.kq, sums);
}
extern "C" __attribute__((noinline, flatten)) void check_gemm_rows(const PackedInt8& w, const int8_t* q, const int32_t* s,
                                                                    float* y, int64_t b1, float* spill) {
  gemm_rows_stream<2>(w, q, 64, s, y, 64, 0, b1, spill);
}
extern "C" __attribute__((noinline, flatten)) void check_amx(const PackedInt8& w, const int8_t* q, const int32_t* s,
                                                              int64_t rows, float* y, int64_t b1, float* spill) {
  amx_gemm(w, q, 64, s, rows, y, 64, 0, b1, spill);
}
extern "C" __attribute__((noinline, flatten)) void check_q4_amx(const PackedQ4& w, const Q4Rows& x, int64_t rows,
                                                                 float* y, int64_t b1, float* spill) {
  q4_amx_gemm(w, x, rows, y, 64, 0, b1, spill);
}
#ifdef PARADECODE_AMX
extern "C" __attribute__((noinline, flatten)) void check_q4_amx_tiles(const PackedQ4& w, const Q4Rows& x, int64_t rows,
                                                                       float* y) {
  q4_amx_blocks<2>(w, 0, x, rows, y, 64);
}
extern "C" __attribute__((noinline, flatten)) void check_amx_tiles(const PackedInt8& w, const int8_t* q, const int32_t* s,
                                                                    int64_t rows, float* y) {
  amx_one_tile<4>(w, 0, q, 64, s, rows, y, 64);
  amx_two_tiles<2>(w, 0, q, 64, s, rows, y, 64);
}
#endif
extern "C" __attribute__((noinline, flatten)) void check_q4(const PackedQ4& w, const Q4Rows& x, float* acc) {
  q4_tile_inlined<4, 4>(w, 0, 1, x, acc);
}
extern "C" __attribute__((noinline, flatten)) void check_q8(const PackedQ4& w, const Q4Rows& x, float* acc) {
  q4_tile_inlined<4, 4, 8>(w, 0, 1, x, acc);
}
extern "C" __attribute__((noinline, flatten)) void check_q6(const PackedQ4& w, const Q4Rows& x, float* acc) {
  q4_tile_inlined<4, 4, 6>(w, 0, 1, x, acc);
}
extern "C" __attribute__((noinline, flatten)) void check_q4_stream(const PackedQ4& w, const Q4Rows& x, int64_t rows,
                                                                  float* y) {
  q4_blocks<kQ4StreamRows, 1>(w, 0, x, rows, y, 64);
}
extern "C" __attribute__((noinline, flatten)) float check_max(const float* x, int64_t n) {
  return max_value(x, n) + abs_max(x, n);
}
extern "C" __attribute__((noinline, flatten)) void check_exp(float* x, const float* y, int64_t n) {
  each(n, [&](int64_t k, auto z) { st(x + k, exp_approx(ld(y + k, z))); });
}
extern "C" __attribute__((noinline, flatten)) float check_quantize(const float* x, float* qf, int8_t* q, int64_t n) {
  return quantize_row(x, qf, n) + static_cast<float>(to_int8(qf, q, n));
}
extern "C" __attribute__((noinline, flatten)) int64_t check_argmax(const float* x, int64_t n) {
  return argmax(x, n);
}
}
"""


def function(assembly: str, name: str) -> str:
    """The assembly of one function: from its label to the end of its frame."""
    start = assembly.index(f"\n{name}:")
    return assembly[start : assembly.index(".cfi_endproc", start)]


@pytest.fixture(scope="module", params=sorted(TARGETS))
def target(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    # the flags the native build uses (native.FLAGS), with this target instead of -march=native
    command = native.program_command(folder / "kernels.cpp", folder / "kernels.s", request.param, openmp=False,
                                     assembly=True)
    if command is None:
        pytest.skip("no C++ compiler")
    (folder / "kernels.cpp").write_text(SOURCE)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 and "bad value" in result.stderr:
        pytest.skip(f"this compiler does not know -march={request.param}")
    assert result.returncode == 0, result.stderr[-2000:]
    return request.param, (folder / "kernels.s").read_text()


PACKED_FMA = re.compile(r"\bvfmadd\d+ps\s[^\n]*%[yz]mm")
SCALAR_FMA = re.compile(r"\bvfmadd\d+ss\b")


def test_attention_multiply_adds_are_packed(target):
    march, assembly = target
    for name in ("check_scores", "check_values"):
        body = function(assembly, name)
        packed, scalar = len(PACKED_FMA.findall(body)), len(SCALAR_FMA.findall(body))
        assert packed >= 8, f"{march}: {name} has {packed} packed multiply-adds"
        assert re.search(r"\bvcvtph2ps\s[^\n]*%[yz]mm", body), f"{march}: {name} widens the half cache lane by lane"
        if name == "check_scores":  # whole 16-slot blocks: no scalar tail at all
            assert scalar == 0, f"{march}: {name} has {scalar} scalar multiply-adds"
        else:  # only the tail of a head dimension that is not a multiple of 16 is scalar
            assert scalar < packed, f"{march}: {name} has {scalar} scalar vs {packed} packed multiply-adds"


def test_the_int8_gemm_uses_the_targets_integer_dot_product(target):
    march, assembly = target
    instruction = TARGETS[march]
    for name in ("check_gemm", "check_gemm_rows"):  # the multi-row tile, and the one- or two-row stream
        body = function(assembly, name)
        assert re.search(rf"\b{instruction}\s[^\n]*%[yz]mm", body), f"{march}: no packed {instruction} in {name}"
        assert "imul" not in body, f"{march}: {name} multiplies scalars"


@pytest.mark.parametrize("entry", ["check_q4", "check_q8", "check_q6"])
def test_the_block_gemm_uses_the_targets_integer_dot_product_and_packed_float_steps(target, entry):
    """The 4-bit tile and its 8-bit (Q8_0) and 6-bit (Q6_K) forms."""
    march, assembly = target
    body = function(assembly, entry)
    instruction = Q4_TARGETS[march]
    assert re.search(rf"\b{instruction}\s[^\n]*%[yz]mm", body), f"{march}: no packed {instruction} in {entry}"
    assert len(PACKED_FMA.findall(body)) >= 16, f"{march}: {entry}'s per-group float steps are not packed"
    assert not SCALAR_FMA.findall(body), f"{march}: {entry}'s float steps run lane by lane"
    assert body.count("imul") <= 4, f"{march}: {entry} multiplies scalars (beyond a few for addresses)"


def test_the_block_streams_one_and_two_row_tiles_are_inlined(target):
    """The one- and two-row stream must not call a function per group (GCC's cost model left the tile a call there,
    and one row took up to 1.28x the time): only the taller tiles are called."""
    march, assembly = target
    body = function(assembly, "check_q4_stream")
    calls = re.findall(r"\bcall\s+(\S+)", body)
    tiles = [c for c in calls if "q4_tile" in c]
    assert not any("q4_tile_calledILi1ELi1E" in c or "q4_tile_calledILi2ELi1E" in c for c in tiles), (march, tiles)
    assert all("q4_tile_called" in c for c in tiles), (march, tiles)


def amx_tiles(target, entry: str, tiles: str, label: str) -> str | None:
    """The assembly of `tiles` (a tile kernel's inner shapes) on an AMX target, after checking that `entry` (its
    public function) configures, multiplies and releases the tiles; elsewhere None, after checking that neither
    holds tile instructions."""
    march, assembly = target
    body = function(assembly, entry)
    if march not in AMX_TARGETS:
        assert "tdpbsud" not in body and "ldtilecfg" not in body, f"{march}: tile instructions without AMX"
        assert f"\n{tiles}:" not in assembly, f"{march}: the {label} is compiled in"
        return None
    assert "tdpbsud" in body and "ldtilecfg" in body and "tilerelease" in body, f"{march}: no {label}"
    return function(assembly, tiles)


def test_the_amx_kernel_is_there_on_amx_targets_with_packed_conversions(target):
    """On an AMX target the tile kernel multiplies with tdpbsud and turns its int32 sums into floats 16 at a time
    (a scalar conversion loop cost more than the tiles' multiplies); elsewhere it compiles to nothing."""
    march, tiles = target[0], amx_tiles(target, "check_amx", "check_amx_tiles", "AMX kernel")
    if tiles is None:
        return
    assert tiles.count("tdpbsud") >= 8, f"{march}: the tile shapes do not multiply with tdpbsud"
    assert re.search(r"\bvcvtdq2ps\s[^\n]*%zmm", tiles), f"{march}: the AMX sums are not converted 16 at a time"
    assert not re.search(r"\bvcvtsi2ss", tiles), f"{march}: the AMX sums are converted one by one"


def test_the_4bit_amx_kernel_is_there_on_amx_targets_with_packed_float_steps(target):
    """On an AMX target the 4-bit GEMM's tile form multiplies each group with tdpbsud and runs gemm_q4.h's float
    steps 16 columns at a time (fused multiply-adds, no scalar ones); elsewhere it is the vector kernel alone."""
    march, tiles = target[0], amx_tiles(target, "check_q4_amx", "check_q4_amx_tiles", "4-bit AMX kernel")
    if tiles is None:
        return
    assert tiles.count("tdpbsud") >= 4, f"{march}: the 4-bit tile steps do not multiply with tdpbsud"
    assert re.search(r"\bvcvtdq2ps\s[^\n]*%zmm", tiles), f"{march}: the 4-bit sums are not converted 16 at a time"
    assert PACKED_FMA.search(tiles) and not SCALAR_FMA.search(tiles), f"{march}: the float steps run lane by lane"


VECTOR_ON_STACK = re.compile(r"\bv[a-z0-9]+\s[^\n]*\(%r[sb]p\)[^\n]*%[xyz]mm|\bv[a-z0-9]+\s[^\n]*%[xyz]mm[^\n]*\(%r[sb]p\)")
LANE_SHUFFLE = re.compile(r"\b(vpinsr[bwdq]|vpextr[bwdq]|vinsertps|vextractps)\b")


def test_hot_loops_keep_their_vectors_in_registers(target):
    """The attention tiles, the exponentials and quantization keep their 16-lane values in vector registers. On
    AVX2 targets GCC 12 kept a 64-byte vector (no register holds one there) in memory between uses: every sum of
    the score and value loops went through the stack and general registers (vpinsrq / movq around each packed
    FMA) and attention ran ~10x slower than its multiply-adds on an AMD EPYC Zen 3. lanes.h's vf is two 8-lane
    vectors there, and the tiles size themselves to the registers (attention.h's fits_registers)."""
    march, assembly = target
    for name in ("check_scores", "check_values", "check_max", "check_quantize"):
        body = function(assembly, name)
        shuffles = LANE_SHUFFLE.findall(body)
        # (a scalar tail's half-float widening or a final reduction's lane extract may take one or two)
        assert len(shuffles) <= 2, f"{march}: {name} moves lanes one by one ({len(shuffles)} inserts/extracts)"
    for name in ("check_scores", "check_values"):  # the tiles' sums: no spills at all
        spills = VECTOR_ON_STACK.findall(function(assembly, name))
        assert not spills, f"{march}: {name} keeps vectors on the stack ({len(spills)} loads/stores)"


PACKED_MAX = re.compile(r"\bv(max|min|cmp[a-z]*)ps\s[^\n]*%[yz]mm")  # a packed max or min, or a packed compare
PACKED_COMPARE = re.compile(r"\bvcmp[a-z]*ps\s[^\n]*%[yz]mm")


def test_maxima_exponentials_and_argmax_are_packed(target):
    """The softmax's maximum and exponentials, quantization's max |x| and greedy verification's argmax keep their
    16-lane bodies packed: a `?:` over 16-lane vectors compiled to scalar compares on AVX2-only targets."""
    march, assembly = target
    assert len(PACKED_MAX.findall(function(assembly, "check_max"))) >= 2, f"{march}: the maxima run lane by lane"
    assert len(PACKED_MAX.findall(function(assembly, "check_exp"))) >= 2, f"{march}: exp's clamps run lane by lane"
    body = function(assembly, "check_argmax")
    assert PACKED_COMPARE.search(body) and len(PACKED_MAX.findall(body)) >= 2, f"{march}: the argmax compares lane by lane"
