"""The native int8 forward (paradecode/backends/native): built and used when a compiler is there, exact row by
row whatever the pass size, equal in meaning to the PyTorch int8 forward, and a clean fallback without it."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from paradecode import cli
from paradecode.backends import native
from paradecode.backends.base import ARGMAX, tree_depths, tree_mask
from paradecode.backends.int8_llama import BUCKETS, PAGE, Int8LlamaBackend
from paradecode.profile import measure_stages
from tiny import (TREE_PARENTS, shaped_llama, assert_rows_equal_one_token_passes,
                  assert_same_bits_on_any_thread_count, one_by_one, run, tiny_model_dir)

pytestmark = pytest.mark.skipif(not native.enabled(), reason="PARADECODE_NATIVE=0 turns the native path off")

VOCAB = 64
CALIBRATION = [list(range(1, 60)), [5, 9, 5, 9, 30, 31, 2, 2, 2, 47] * 4]
# head_dim 8 runs only the scalar tails; head_dim 72 runs the 64-wide vector body, a 16-wide chunk and a tail,
# and an intermediate size of 100 leaves a tail after the 16-lane loops; six query heads on one kv head are
# scored in bands of four and two.
SHAPES = {"narrow": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64),
          "wide": dict(hidden_size=144, num_attention_heads=2, num_key_value_heads=1, intermediate_size=100),
          "grouped": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=1, intermediate_size=64),
          # every k a multiple of 64, so the AMX kernel is offered where the CPU has it; 72 logits leave a partial
          # block of 8 columns
          "tiles": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=192,
                        vocab_size=72)}


def llama(seed: int, shape: str) -> transformers.LlamaForCausalLM:
    dims = dict(SHAPES[shape])
    return shaped_llama(seed, dims, dims.pop("vocab_size", VOCAB))


def int8_backend(seed: int = 0, shape: str = "wide") -> Int8LlamaBackend:
    return Int8LlamaBackend.from_hf(llama(seed, shape), calibration=CALIBRATION)


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_the_native_kernels_build_and_the_int8_backend_uses_them():
    backend = int8_backend()
    assert backend.available_kernels(), "the native int8 forward could not be built (see the warning above)"
    assert backend.kernels.startswith("int8-") and "-native-" in backend.kernels


KERNEL_CHOICES = {  # bucket -> GEMM kernel: each kernel alone, and one where every pass size uses another
    "own": dict.fromkeys(BUCKETS, "own"), "fbgemm": dict.fromkeys(BUCKETS, "fbgemm"),
    "int_mm": dict.fromkeys(BUCKETS, "int_mm"), "mixed": dict(one="int_mm", verify="own", prefill="fbgemm"),
    "amx": dict.fromkeys(BUCKETS, "amx"), "mixed-amx": dict(one="own", verify="amx", prefill="amx"),
    "interleaved": dict.fromkeys(BUCKETS, "interleaved"),
    "mixed-interleaved": dict(one="interleaved", verify="own", prefill="interleaved")}


def use_kernels(backend: Int8LlamaBackend, choice: str) -> None:
    wanted = KERNEL_CHOICES[choice]
    missing = set(wanted.values()) - set(backend.available_kernels())
    if missing:
        pytest.skip(f"this machine offers no {', '.join(sorted(missing))} kernel for this model")
    backend.use_kernels(wanted)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("kernels", sorted(KERNEL_CHOICES))
def test_every_row_equals_its_one_token_pass_to_the_bit(shape, kernels):
    """A 57-token pass, a causal chain and a tree pass give each row what a one-token forward gives it later,
    with every GEMM kernel and with different kernels for different pass sizes; the contexts (70+ slots) cross
    a 64-slot block of the attention's score loop."""
    backend = int8_backend(3, shape)
    use_kernels(backend, kernels)
    assert_rows_equal_one_token_passes(backend, tokens(70, seed=1), tokens(len(TREE_PARENTS), seed=2))


@pytest.mark.parametrize("kernels", ["chosen", "amx"])
def test_a_long_pass_is_exact_too_and_may_skip_the_lm_head(kernels):
    """A 100-row pass (a prefill) gives its rows what shorter passes give them; a prefill whose logits nobody
    reads skips the LM head and leaves the same cache. On the AMX kernel, 100 rows (200 in the precise LM head)
    take several 64-row chunks of two-tile groups, the last one partial."""
    backend = int8_backend(7, "tiles" if kernels == "amx" else "wide")
    if kernels == "amx":
        use_kernels(backend, "amx")
    ids = tokens(100, seed=3)
    backend.reset()
    long_pass = backend.forward(ids).logits  # one pass of 100 rows
    backend.reset()
    backend.forward(ids[:50])
    assert torch.equal(long_pass[50:], backend.forward(ids[50:]).logits)  # rows 50..99 in a 50-row pass
    backend.reset()
    skipped = backend.forward(ids, return_hidden=True, logits=False)
    assert skipped.logits is None and skipped.hidden.shape == (100, backend.shape.hidden_size)
    after_skipped = backend.forward(ids[:1]).logits
    backend.reset()
    backend.forward(ids)
    assert torch.equal(after_skipped, backend.forward(ids[:1]).logits)  # the same cache either way


def test_commit_moves_the_transposed_keys_with_the_kept_path():
    backend = int8_backend(4)
    prompt, chain = tokens(66, seed=5), tokens(len(TREE_PARENTS), seed=6)
    backend.reset()
    backend.forward(prompt)
    positions = len(prompt) - 1 + torch.tensor(tree_depths(TREE_PARENTS))
    backend.forward(chain, positions, tree_mask(TREE_PARENTS, len(prompt)))
    backend.commit(len(prompt), [0, 2, 4])  # the path 0 -> 2 -> 4 of the tree
    after_commit = one_by_one(backend, tokens(3, seed=7))
    backend.reset()
    backend.forward(torch.cat((prompt, chain[[0, 2, 4]])))
    assert torch.equal(after_commit, one_by_one(backend, tokens(3, seed=7)))


def test_native_and_pytorch_int8_forwards_compute_the_same_model(monkeypatch):
    """Same quantized weights; attention sums in float32 loops (native) or float64 (PyTorch), so the logits
    differ by rounding only, amplified at most by an activation's quantization step."""
    ids = tokens(90, seed=8)
    fast = int8_backend(6)
    monkeypatch.setenv("PARADECODE_NATIVE", "0")
    slow = int8_backend(6)
    assert not slow.available_kernels() and "-native-" not in slow.kernels
    a, b = fast.forward(ids).logits, slow.forward(ids).logits
    assert (a - b).abs().max() < 0.02 * b.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.95


@pytest.mark.parametrize("method,options", [("ngram", {}), ("pld", {}), ("pld-tree", {}), ("jacobi", {}),
                                            ("lookahead", {})])
@pytest.mark.parametrize("kernels", sorted(KERNEL_CHOICES))
def test_methods_equal_ar_on_the_native_forward(method, options, kernels):
    backend = int8_backend(9, "tiles" if "amx" in kernels else "wide")  # a model the AMX kernel fits
    reference, _ = run(backend, "ar", tokens(20, seed=10).tolist() * 2, max_new_tokens=40)  # the chosen kernels
    use_kernels(backend, kernels)
    output, _ = run(backend, method, tokens(20, seed=10).tolist() * 2, max_new_tokens=40, **options)
    assert output == reference


def test_amx_cpus_offer_the_amx_kernel_for_models_that_fit_its_tiles():
    """Built for an AMX CPU, the native pass offers the tile kernel (a build or a permission check that dropped it
    silently would fail here), and only for weights whose every k is a multiple of 64."""
    if "amx_int8" not in native.cpu_flags().split():
        pytest.skip("this CPU has no AMX-INT8")
    assert "amx" in int8_backend(5, "tiles").available_kernels()
    assert "amx" not in int8_backend(5, "wide").available_kernels()  # k of 144


@pytest.mark.parametrize("shape", ["grouped", "tiles"])
def test_every_kernel_gives_the_same_logits(shape):
    backend = int8_backend(5, shape)
    ids = tokens(40, seed=4)
    logits = {}
    for kernel in backend.available_kernels():
        backend.use_kernels(dict.fromkeys(BUCKETS, kernel))
        backend.reset()
        logits[kernel] = torch.cat([backend.forward(ids[:30]).logits, backend.forward(ids[30:34]).logits,
                                    backend.forward(ids[34:35]).logits])
    assert len(logits) >= 2 and "own" in logits
    for kernel, values in logits.items():
        assert torch.equal(values, logits["own"]), kernel


def test_the_kernel_choice_takes_what_the_machine_offers_and_is_kept(monkeypatch, tmp_path):
    """Each bucket gets the fastest of the kernels offered; with a kernel forced off the choice is made among
    the others; the choice is kept per machine and build and read back; a kept choice that names a kernel no
    longer offered is measured anew."""
    backend = int8_backend(2, "narrow")
    offered = backend.available_kernels()
    for kernel in offered:
        others = [k for k in offered if k != kernel]
        monkeypatch.setattr(Int8LlamaBackend, "available_kernels", lambda self, others=others: others)
        choice = backend.choose_kernels(repeats=1)
        assert set(choice) == set(BUCKETS) and set(choice.values()) <= set(others)
        for bucket, times in backend.kernel_timings.items():  # the one-token form is timed on one token only
            expected = {k for k in others if bucket == "one" or k != "interleaved"} or set(others)
            assert set(times) == expected, bucket
    monkeypatch.setattr(Int8LlamaBackend, "available_kernels", lambda self: ["own"])
    assert backend.choose_kernels(tmp_path, repeats=1) == dict.fromkeys(BUCKETS, "own")
    saved = list(tmp_path.glob("*.json"))
    assert len(saved) == 1
    kept = json.loads(saved[0].read_text())
    kept["choice"]["one"] = "no-such-kernel"
    saved[0].write_text(json.dumps(kept))
    assert backend.choose_kernels(tmp_path, repeats=1)["one"] == "own"  # measured again, not a crash
    monkeypatch.setattr(Int8LlamaBackend, "available_kernels", lambda self: offered)
    busy = {bucket: {kernel: 1.0 + (kernel == "own") for kernel in offered} for bucket in BUCKETS}
    monkeypatch.setattr(Int8LlamaBackend, "_time_kernels", lambda self, kernels, repeats: (busy, False))
    for path in tmp_path.glob("*.json"):
        path.unlink()
    choice = backend.choose_kernels(tmp_path, repeats=1)  # timings spread by other work: used, not kept
    assert "own" not in choice.values() and not list(tmp_path.glob("*.json"))


def test_sequences_sharing_a_pass_get_exactly_their_own_rows():
    """The native pass takes rows of several sequences at once, each through its own page table: every row
    equals what the same tokens give in a pass of their own sequence alone (batch invariance)."""
    backend = int8_backend(6, "grouped")
    native = backend._native
    assert backend.max_length // PAGE >= 4
    pages_a = torch.tensor([3, 1], dtype=torch.int32)  # the cache's pages shared out, not in order
    pages_b = torch.tensor([0, 2], dtype=torch.int32)
    a, b = tokens(100, seed=11), tokens(90, seed=12)

    def run_alone(ids, pages, split):
        native.forward(ids[:split], torch.arange(split), [(pages, 0, split, None)], list(range(3)), False)
        rest = len(ids) - split
        return native.forward(ids[split:], torch.arange(split, len(ids)), [(pages, split, rest, None)],
                              list(range(3)), True)[1]

    alone_a, alone_b = run_alone(a, pages_a, 80), run_alone(b, pages_b, 70)
    native.forward(a[:80], torch.arange(80), [(pages_a, 0, 80, None)], list(range(3)), False)
    native.forward(b[:70], torch.arange(70), [(pages_b, 0, 70, None)], list(range(3)), False)
    mask_b = torch.ones(20, 90, dtype=torch.bool).tril(70)  # b's rows as an explicit causal mask
    both = native.forward(torch.cat((a[80:], b[70:])), torch.cat((torch.arange(80, 100), torch.arange(70, 90))),
                          [(pages_a, 80, 20, None), (pages_b, 70, 20, mask_b)], list(range(3)), True)[1]
    assert torch.equal(both[:20], alone_a) and torch.equal(both[20:], alone_b)
    # positions None: each row at its logical slot, in every segment (the engine's chains pass no positions)
    native.forward(a[:80], None, [(pages_a, 0, 80, None)], list(range(3)), False)
    native.forward(b[:70], None, [(pages_b, 0, 70, None)], list(range(3)), False)
    assert torch.equal(native.forward(torch.cat((a[80:], b[70:])), None,
                                      [(pages_a, 80, 20, None), (pages_b, 70, 20, mask_b)], list(range(3)), True)[1],
                       both)
    with pytest.raises(RuntimeError, match="positions must be"):
        native.forward(a[:4], torch.arange(3), [(pages_a, 0, 4, None)], list(range(3)), True)


def test_stage_clock_times_each_stage_per_pass_size():
    backend = int8_backend(2)
    stages = measure_stages(backend, sizes=(1, 4), context=30, repeats=2)
    assert sorted(stages) == [1, 4]
    for seconds in stages.values():
        assert {"gemm", "attention", "quantize", "lm head", "norm"} <= set(seconds)
        assert seconds["gemm"] > 0 and seconds["attention"] > 0 and seconds["lm head"] > 0
    assert backend.stage_seconds(lambda: None) == dict.fromkeys(stages[1], 0.0)  # the clock restarts per call


def test_profile_command_prints_the_stage_table(capsys, tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    code = cli.main(["profile", "--model", str(model_dir), "--dtypes", "int8", "--sizes", "1,2", "--context", "8",
                     "--repeats", "2", "--stages", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "ms per stage" in out and "attention" in out and "gemm" in out
    saved = json.loads((tmp_path / "cost_curve.json").read_text())
    assert set(next(iter(saved["stage_seconds"].values()))) == {"1", "2"}


def test_a_failed_build_warns_and_keeps_the_pytorch_forward(monkeypatch, tmp_path):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setenv("PARADECODE_CACHE", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="could not be built"):
        backend = int8_backend(1, "narrow")
    assert not backend.available_kernels() and "-native-" not in backend.kernels
    backend.reset()
    assert torch.isfinite(backend.forward(tokens(5, seed=1)).logits).all()


def test_a_crash_in_the_build_check_is_a_warning_not_a_dead_process(monkeypatch, tmp_path):
    """The build and a first forward run in a child; here the child dies of SIGILL, as code built for another
    CPU would: the caller warns and keeps the PyTorch forward."""
    monkeypatch.setattr(native, "CHECK", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setenv("PARADECODE_CACHE", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="died of signal 4"):
        backend = int8_backend(1, "narrow")
    assert not backend.available_kernels() and "-native-" not in backend.kernels
    assert not list((tmp_path / "cache").rglob("checked")), "a failed check must not mark the build as good"


def test_the_build_check_runs_every_kernel_and_the_4bit_projections(monkeypatch):
    """What the child runs before a build is trusted covers the 4-bit kernel too: a crash there ends the child."""
    from paradecode.backends import q4

    module = native.load()
    calls = []
    monkeypatch.setattr(native, "_compile", lambda *args: module)
    original = q4.Q4Linear.from_blocks.__func__
    monkeypatch.setattr(q4.Q4Linear, "from_blocks", classmethod(lambda cls, *a: calls.append(1) or original(cls, *a)))
    native.check("key", "unused", "unused")  # in this process: the module is already built and loaded
    assert len(calls) == 3  # qkv, o and gate_up of the 4-bit model


def test_the_build_check_runs_an_eagle_heads_step(monkeypatch):
    """The child's check covers the native EAGLE step too (heads/eagle_native.py): a forward through an input
    projection, built with no norms, run on another cache with ``with_cache``; and EAGLE-3's: [2D] rows as they
    are, into a layer with a [2D] attention norm, the residual stream returned."""
    from types import SimpleNamespace

    module = native.load()
    calls = []

    class Recording:
        def __init__(self, inner) -> None:
            self.inner = inner

        def __getattr__(self, name):
            method = getattr(self.inner, name)

            def call(*args, **kwargs):
                calls.append((name, "inputs" in kwargs))
                out = method(*args, **kwargs)
                return Recording(out) if name == "with_cache" else out
            return call

    proxy = SimpleNamespace(Int8Forward=lambda *args, **kwargs: Recording(module.Int8Forward(*args, **kwargs)))
    monkeypatch.setattr(native, "_compile", lambda *args: proxy)
    native.check("key", "unused", "unused")
    names = [name for name, _ in calls]
    assert "set_input" in names and "with_cache" in names
    assert ("forward", True) in calls[names.index("with_cache"):]  # rows given as inputs, on the forked forward
    assert ("forward", True) in calls[names.index("set_output_residual"):]  # and EAGLE-3's step


def test_a_build_baton_left_by_a_killed_build_does_not_hang_the_next_load(tmp_path):
    """PyTorch's builder waits for its `lock` file to go away; a build killed mid-way leaves it behind, and the
    next load (here: a fresh process, as the next command would be) must clear it, not wait forever."""
    import os
    import subprocess
    import sys

    from paradecode.models import cache_root

    assert native.load() is not None, "the native int8 forward could not be built"
    baton = cache_root() / "native" / native.build_key() / "lock"
    baton.write_text("")
    done = subprocess.run([sys.executable, "-c", "from paradecode.backends import native; "
                           "print(native.load() is not None)"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    assert not baton.exists()


def test_a_build_that_never_ends_is_given_up_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "CHECK", "import time; time.sleep(60)")
    monkeypatch.setattr(native, "BUILD_SECONDS", 1)
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setenv("PARADECODE_CACHE", str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match="took more than 1 s"):
        backend = int8_backend(1, "narrow")
    assert not backend.available_kernels() and "-native-" not in backend.kernels


# wide enough that the projections and the LM head are split over threads in several pieces (137.5 blocks of 16
# columns in gate_up, a partial last one; 63 in the LM head)
BROAD = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=1100)


@pytest.mark.parametrize("kernels", ["own", "mixed"])
def test_a_pass_gives_the_same_bits_on_one_thread_or_several(kernels):
    """The GEMMs hand column blocks to whichever thread is free (``parallel_blocks``): the thread count, and which
    thread takes which block, must not change a bit (the tests otherwise run on one thread: conftest)."""
    backend = Int8LlamaBackend.from_hf(shaped_llama(3, BROAD, 1000), calibration=CALIBRATION)
    use_kernels(backend, kernels)
    assert_same_bits_on_any_thread_count(backend, [tokens(rows, rows) for rows in (1, 5, 70)])


def test_row_argmax_is_torchs_argmax_ties_nans_and_tails_included():
    """The native argmax greedy verification uses gives torch's answer: the first of equal maxima (in the vector
    body, across lanes and in the scalar tail), the first NaN, index 0 of a row of -inf, any width."""
    module = native.load()
    assert module is not None
    torch.manual_seed(0)
    rows = [torch.randn(49152), torch.randn(7), torch.randn(16), torch.randn(33), torch.full((40,), float("-inf"))]
    tied = torch.randn(100)
    tied[[5, 21, 37, 98]] = 9.0  # equal maxima in lanes 5 and 5 again (21, 37) and in the tail (98)
    rows.append(tied)
    late = torch.zeros(35)
    late[3], late[17], late[34] = 1.0, 1.0, 1.0  # lanes 3 and 1: the lane order must not win over the index
    rows.append(late)
    tail_only = torch.zeros(20)
    tail_only[18] = 5.0
    rows.append(tail_only)
    nans = torch.randn(64)
    nans[[40, 12]] = float("nan")
    rows.append(nans)
    int_like = torch.randint(-3, 3, (200,)).float()  # many ties everywhere
    rows.append(int_like)
    for row in rows:
        logits = row[None].contiguous()
        assert module.row_argmax(logits) == logits.argmax(dim=-1).tolist(), row
        assert native.row_argmax(logits) == logits.argmax(dim=-1).tolist()
    batch = torch.randint(-2, 2, (6, 1000)).float()  # several rows at once
    assert module.row_argmax(batch) == batch.argmax(dim=-1).tolist()
    with pytest.raises(RuntimeError, match="float32"):
        module.row_argmax(torch.zeros(2, 3, dtype=torch.float64))
    assert native.row_argmax(torch.zeros(2, 3, dtype=torch.float64)) == [0, 0]  # torch's path for other dtypes


TILES = {key: value for key, value in SHAPES["tiles"].items() if key != "vocab_size"}  # with a vocabulary of 3,000


@pytest.mark.parametrize("kernels", sorted(KERNEL_CHOICES))
def test_argmax_logits_keep_every_rows_argmax_and_its_bits(kernels):
    """``forward(logits=ARGMAX)`` (greedy verification's pass): each row's argmax and its value are the full
    logits' to the bit, ties included (pairs of equal LM head rows, the first wins); the other entries are
    close approximations, and some do differ (the residual rows were skipped for them)."""
    model = shaped_llama(7, TILES, 3000)
    with torch.no_grad():
        head = model.lm_head.weight
        head[1::2] = head[0::2].clone()  # columns 2i and 2i + 1 give equal logits
        head[6] = head[6] * 1.0001  # and a near tie
    backend = Int8LlamaBackend.from_hf(model, calibration=CALIBRATION)
    use_kernels(backend, kernels)
    ids = tokens(60, seed=8)
    differ = 0
    for cut in [(0, 40), (40, 41), (41, 49), (49, 60)]:
        backend.reset()
        full = backend.forward(ids[: cut[1]]).logits[cut[0]:]
        backend.reset()
        if cut[0]:
            backend.forward(ids[: cut[0]], logits=False)
        fast = backend.forward(ids[cut[0]: cut[1]], logits=ARGMAX).logits
        assert fast.shape == full.shape
        want = full.argmax(-1)
        assert torch.equal(fast.argmax(-1), want)
        assert torch.equal(fast.gather(1, want[:, None]), full.gather(1, want[:, None]))  # the same bits
        assert (want % 2 == 0).all(), "a tie went to the second of two equal columns"
        scale = full.abs().amax(-1, keepdim=True)
        assert ((fast - full).abs() <= 0.02 * scale).all()
        differ += int((fast != full).sum())
    assert differ > 0, "every entry was exact: the skipped residual rows were never skipped"


@pytest.mark.parametrize("mode", [native.FULL_LOGITS, native.ARGMAX_LOGITS])
def test_logits_from_a_row_on_are_those_rows_logits_to_the_bit(mode):
    """``logits_from=k`` (a head's catch-up feed: the last pair's logits only) runs the LM head on rows k..T-1 of
    the pass and gives them the bits a pass reading every row's logits gives them; the cache is the same either
    way. A row outside the pass is a clear error."""
    backend = int8_backend(5, "tiles")
    ids = tokens(12, seed=4)
    pages = torch.arange(backend.max_length // PAGE, dtype=torch.int32)
    layers = list(range(backend.shape.num_layers))

    def run_pass(logits_from: int):  # the pass at slots 0..11 (written over each time), then a row after it
        _, logits, _ = backend._native.forward(ids, None, [(pages, 0, 12, None)], layers, mode,
                                               logits_from=logits_from)
        after = backend._native.forward(ids[:1], None, [(pages, 12, 1, None)], layers, native.FULL_LOGITS)[1]
        return logits, after

    every, after_every = run_pass(0)
    for k in (11, 5):
        some, after_some = run_pass(k)
        assert some.shape == (12 - k, every.shape[1])
        assert torch.equal(some, every[k:])
        assert torch.equal(after_some, after_every)
    with pytest.raises(RuntimeError, match="logits_from"):
        backend._native.forward(ids, None, [(pages, 0, 12, None)], layers, mode, logits_from=12)


def test_greedy_decoding_reads_argmax_logits_and_matches_full_logits_decoding():
    """The engine asks a greedy decode's passes for ARGMAX logits; its tokens are the argmax of full logits, one
    token at a time, for plain decoding and for a drafting method; with log-probabilities read it asks for full
    logits."""
    backend = Int8LlamaBackend.from_hf(shaped_llama(9, TILES, 3000), calibration=CALIBRATION)
    prompt = tokens(20, seed=3).tolist() * 2
    expected = []
    backend.reset()
    logits = backend.forward(torch.tensor(prompt)).logits[-1]
    for _ in range(24):
        expected.append(int(logits.argmax()))
        logits = backend.forward(torch.tensor(expected[-1:])).logits[-1]
    asked = []
    forward = backend.forward

    def recording(*args, **kwargs):
        asked.append(kwargs.get("logits", True))
        return forward(*args, **kwargs)

    backend.forward = recording
    for method in ("ar", "pld"):
        asked.clear()
        output, _ = run(backend, method, prompt, max_new_tokens=24)
        assert output == expected, method
        assert asked.count(ARGMAX) >= 5 and set(asked) <= {False, ARGMAX}, asked
    asked.clear()
    output, _ = run(backend, "ar", prompt, max_new_tokens=24, on_commit=lambda tokens, logits: None)
    assert output == expected and ARGMAX not in asked
