"""The int8 backend: rows quantized on their own (so verification equals one-token decoding), the backend
protocol (trees, rollback, commit) against the int8 model's own uncached forward, every method lossless
against ``ar`` of the same dtype, the cached quantized state, quality figures and the --dtype option."""

from __future__ import annotations

import json

import pytest
import torch

from paradecode import cli, profile, quality
from paradecode.backends import int8
from paradecode.backends.base import tree_depths, tree_mask
from paradecode.backends.int8_llama import Int8LlamaBackend
from paradecode.backends.llama import LlamaBackend
from paradecode.drafters.schedule import CostCurve
from paradecode.profile import measure_curve
from tiny import PROMPTS, run, run_case, tiny_backend, tiny_int8_backend, tiny_llama, tiny_model_dir

TREE_PARENTS = [-1, 0, 0, 1, 2, -1]
ATOL = 1e-4
CALIBRATION = [list(range(1, 40)), [5, 9, 5, 9, 30, 31, 2, 2, 2, 47] * 3]


def int8_backend(seed: int = 0, **kwargs) -> Int8LlamaBackend:
    return tiny_int8_backend(seed, CALIBRATION, **kwargs)


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(48, (n,), generator=torch.Generator().manual_seed(seed))


def uncached(backend: LlamaBackend, ids: torch.Tensor) -> torch.Tensor:
    backend.reset()
    logits = backend.forward(ids).logits
    backend.reset()
    return logits


def test_fbgemm_is_used_only_where_its_sums_are_exact():
    """fbgemm's int8 GEMM without VNNI adds pairs of u8 x s8 products in saturating int16, so full-range rows come
    out wrong (AMD EPYC Zen 3, AVX2). The probe's answer must match a random full-range trial on this CPU, and
    without exact sums no weight is prepacked for it (so neither Int8Linear nor the native forward uses it)."""
    torch.manual_seed(3)
    weight = torch.randint(-127, 128, (48, 256), dtype=torch.int8)
    rows = torch.randint(-127, 128, (9, 256)).float()
    exact = int8.fbgemm_sums_are_exact(weight, rows)
    if exact is None:
        pytest.skip("PyTorch's quantized engine cannot pack here")
    assert int8.fbgemm_is_exact() == exact
    assert (int8.prepack(weight, torch.ones(48)) is not None) == int8.fbgemm_is_exact()


def test_int8_linear_is_close_to_the_float_product_and_rows_are_independent():
    torch.manual_seed(0)
    weight, x = torch.randn(24, 40), torch.randn(6, 40)
    x[:, 3] *= 30  # an outlier channel
    for precise in (False, True):
        linear = int8.Int8Linear.from_float(weight, precise=precise)
        out = linear(x)
        exact = x @ weight.t()
        assert (out - exact).abs().max() < (0.02 if precise else 0.2) * exact.abs().max()
        one_by_one = torch.cat([linear(x[i : i + 1]) for i in range(len(x))])
        assert torch.equal(out, one_by_one)  # integer sums: bit-identical whatever the batch
    q, scale = int8.quantize_weight(weight)
    weight_only = x @ (q.float() * scale[:, None]).t()  # what is left is the activations' rounding
    precise_err = (int8.Int8Linear.from_float(weight, precise=True)(x) - weight_only).abs().max()
    plain_err = (int8.Int8Linear.from_float(weight)(x) - weight_only).abs().max()
    assert precise_err < plain_err / 50


def test_quantized_backend_stays_close_to_fp32_and_replaces_every_projection():
    fp32, q = tiny_backend(1, sharp=4.0), int8_backend(1, sharp=4.0)
    assert q.dtype == "int8" and isinstance(q._lm_head, int8.Int8Linear)
    if q.available_kernels():  # the native pass: every bucket's kernel was chosen by timing the ones offered
        assert set(q.kernel_choice) == {"one", "verify", "prefill"}
        offered = set(q.available_kernels())  # the one-token form ("interleaved") is timed on one token only
        assert {b: set(times) for b, times in q.kernel_timings.items()} == dict(
            one=offered, verify=offered - {"interleaved"}, prefill=offered - {"interleaved"})
    assert all(isinstance(getattr(layer, name), int8.Int8Linear) for layer in q._layers for name in int8.PROJECTIONS)
    ids = tokens(20, seed=1)
    a, b = uncached(fp32, ids), uncached(q, ids)
    assert (a - b).abs().max() < 0.05 * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9
    hidden_fp32 = fp32.forward(ids, return_hidden=True).hidden
    hidden_int8 = q.forward(ids, return_hidden=True).hidden  # smoothing undone: the same quantity as fp32's
    assert (hidden_fp32 - hidden_int8).abs().max() < 0.05 * hidden_fp32.abs().max()


def test_incremental_forwards_match_the_full_sequence():
    backend = int8_backend()
    ids = tokens(14, seed=2)
    full = uncached(backend, ids)
    steps = torch.cat([backend.forward(ids[:7]).logits, backend.forward(ids[7:8]).logits,
                       backend.forward(ids[8:]).logits])
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=0)


def test_tree_pass_matches_each_branch_as_a_chain_and_commit_keeps_the_path():
    backend = int8_backend()
    prompt, nodes, after = tokens(6, seed=4), tokens(len(TREE_PARENTS), seed=5), tokens(2, seed=6)
    backend.reset()
    backend.forward(prompt)
    positions = backend.cache_len - 1 + torch.tensor(tree_depths(TREE_PARENTS))
    tree = backend.forward(nodes, positions, tree_mask(TREE_PARENTS, backend.cache_len)).logits
    for node, path in [(3, [0, 1, 3]), (4, [0, 2, 4]), (5, [5])]:
        expected = uncached(backend, torch.cat([prompt, nodes[path]]))[-1]
        torch.testing.assert_close(tree[node], expected, atol=ATOL, rtol=0)
    backend.reset()
    backend.forward(prompt)
    backend.forward(nodes, positions, tree_mask(TREE_PARENTS, backend.cache_len))
    backend.commit(len(prompt), [0, 2, 4])
    logits = backend.forward(after).logits
    expected = uncached(backend, torch.cat([prompt, nodes[[0, 2, 4]], after]))[-2:]
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_rollback_then_forward_matches_a_fresh_computation():
    backend = int8_backend()
    ids, junk = tokens(11, seed=7), tokens(5, seed=8)
    expected = uncached(backend, ids)[8:]
    backend.forward(ids[:8])
    backend.forward(junk)
    backend.rollback(8)
    torch.testing.assert_close(backend.forward(ids[8:]).logits, expected, atol=ATOL, rtol=0)


METHODS = [("pld", {}), ("ngram", {}), ("pld-tree", {}), ("lookahead", {}), ("jacobi", {}), ("layerskip", {}),
           ("auto", {}), ("draft", {"num_draft": 3}), ("draft-tree", {}), ("draft-self", {"num_draft": 5})]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_every_method_equals_ar_on_the_int8_backend(seed, method, options):
    backend = int8_backend(seed, sharp=4.0)
    for prompt in PROMPTS:
        expected, _ = run(backend, "ar", prompt, max_new_tokens=30)
        got, _ = run_case(backend, method, prompt, options, max_new_tokens=30, model_seed=seed)
        assert got == expected, (method, seed, prompt)


def test_exported_state_reloads_to_identical_logits(tmp_path):
    from safetensors.torch import load_file, save_file

    backend = int8_backend(2)
    save_file(backend.export_state(), tmp_path / "int8.safetensors")
    reloaded = Int8LlamaBackend.from_hf(tiny_llama(2), int8_state=load_file(tmp_path / "int8.safetensors"))
    ids = tokens(12, seed=9)
    assert torch.equal(uncached(backend, ids), uncached(reloaded, ids))


def test_quantize_needs_calibration_and_fp32_weights():
    with pytest.raises(ValueError, match="calibration"):
        tiny_int8_backend(0, [])
    with pytest.raises(ValueError, match="fp32"):
        Int8LlamaBackend.from_hf(tiny_llama(0).to(torch.bfloat16), calibration=CALIBRATION)


def test_quality_figures_are_zero_for_fp32_and_measured_for_int8():
    reference, candidate = tiny_backend(3, sharp=4.0), int8_backend(3, sharp=4.0)
    sequences = [tokens(30, seed=s).tolist() for s in range(3)]
    results = {q.dtype: q for q in quality.measure(reference, {"int8": candidate}, sequences)}
    assert results["fp32"].top1_agreement == 1.0 and results["fp32"].perplexity_change == 0.0
    assert results["int8"].tokens == 87 and 0.5 < results["int8"].top1_agreement <= 1.0
    assert results["int8"].perplexity != results["fp32"].perplexity  # it was really scored on int8 logits
    broken = tiny_backend(4, sharp=4.0)  # another model altogether: far worse agreement
    worse = quality.measure(reference, {"other": broken}, sequences)[1]
    assert worse.top1_agreement < results["int8"].top1_agreement


def test_a_quality_record_keeps_the_dtypes_a_later_run_left_out(tmp_path):
    """Measuring q4 alone after int8 and q4 keeps int8's figures (same texts), replaces q4's; figures measured on
    other texts (another reference perplexity) are dropped, and a damaged record is replaced."""
    def run(reference: float, **ppl: float) -> list[quality.Quality]:
        return [quality.Quality(dtype, 12, 6000, value, reference, 0.9) for dtype, value in ppl.items()]

    path = quality.save(tmp_path, "m", run(20.0, fp32=20.0, int8=20.2, q4=20.1))
    quality.save(tmp_path, "m", run(20.0, fp32=20.0, q4=20.05))
    figures = quality.known(tmp_path, "m")
    assert figures["int8"]["perplexity"] == 20.2 and figures["q4"]["perplexity"] == 20.05
    quality.save(tmp_path, "m", run(30.0, fp32=30.0, q4=30.1))
    assert "int8" not in quality.known(tmp_path, "m")
    path.write_text("{damaged")
    quality.save(tmp_path, "m", run(30.0, fp32=30.0, int8=30.3))
    assert set(quality.known(tmp_path, "m")) == {"fp32", "int8"}


class _WarmingBackend:
    """A backend whose passes cost 1 ms + 0.1 ms per token on a fake clock, the first 10 forwards of a process
    five times that (a machine that starts slow)."""

    vocab_size, max_length = 100, 64

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.forwards = clock, 0

    def forward(self, ids, logits=True):
        self.forwards += 1
        self.clock[0] += (1e-3 + 1e-4 * len(ids)) * (5.0 if self.forwards <= 10 else 1.0)

    def rollback(self, length: int) -> None:
        pass

    def reset(self) -> None:
        pass


def test_cost_curve_sizes_take_turns_after_a_warm_up(monkeypatch):
    # timed one size after the other, T=1 took the slow start alone and came out dearer than T=2 and T=4
    # (kept curves on an Intel Xeon); every size warmed up, then in turns, the shape is the machine's
    clock = [0.0]
    monkeypatch.setattr(profile.time, "perf_counter", lambda: clock[0])
    curve = measure_curve(_WarmingBackend(clock), sizes=(1, 2, 4, 8), context=8, repeats=5)
    assert curve == pytest.approx({t: 1e-3 + 1e-4 * t for t in (1, 2, 4, 8)})


class _BusyBackend(_WarmingBackend):
    """Every other pass takes four times as long: another process shares the cores."""

    def forward(self, ids, logits=True):
        self.forwards += 1
        self.clock[0] += (1e-3 + 1e-4 * len(ids)) * (4.0 if self.forwards % 2 == 0 else 1.0)


def test_a_cost_curve_measured_on_a_busy_machine_is_not_kept(monkeypatch, tmp_path):
    clock = [0.0]
    monkeypatch.setattr(profile.time, "perf_counter", lambda: clock[0])
    busy = profile.cached_curve(_BusyBackend(clock), tmp_path, "busy", sizes=(1, 2, 4))
    assert sorted(busy) == [1, 2, 4] and not (tmp_path / "profiles").exists()
    steady = profile.cached_curve(_WarmingBackend(clock), tmp_path, "steady", sizes=(1, 2, 4))
    assert steady == pytest.approx({t: 1e-3 + 1e-4 * t for t in (1, 2, 4)})
    assert len(list((tmp_path / "profiles").iterdir())) == 1
    assert profile.cached_curve(_BusyBackend(clock), tmp_path, "steady", sizes=(1, 2, 4)) == steady  # kept


def test_cost_curve_is_measured_per_size_and_shapes_the_schedule_prior():
    curve = measure_curve(tiny_backend(), sizes=(1, 4, 16), context=20, repeats=2)
    assert sorted(curve) == [1, 4, 16] and all(s > 0 for s in curve.values())
    shaped = CostCurve(shape={1: 1.0, 4: 1.2, 16: 3.0})
    shaped.add(1, 0.010)
    predicted = shaped.predictions(16)
    assert predicted[3] == pytest.approx(0.012, rel=1e-6) and predicted[15] == pytest.approx(0.030, rel=1e-6)
    assert predicted[9] == pytest.approx(0.010 * (1.2 + 1.8 * 6 / 12), rel=1e-6)  # interpolated at T = 10
    flat = CostCurve()
    flat.add(1, 0.010)
    assert flat.predictions(16)[15] != pytest.approx(0.030, rel=0.05)  # the measured shape made the difference


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model_dir(tmp_path_factory.mktemp("tiny")))


def test_cli_generates_on_int8_and_verifies_against_int8_ar(capsys, model_dir, tmp_path):
    code = cli.main(["generate", "--model", model_dir, "--dtype", "int8", "--method", "pld", "--verify", "--json",
                     "--cache-dir", str(tmp_path), "--max-new-tokens", "16", "w3 w4 w5 w3 w4 w5 w3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["verify"]["identical"]
    assert list((tmp_path / "int8").glob("*.safetensors")), "the quantized weights are cached"


def test_unknown_dtype_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["generate", "--dtype", "int4", "x"])
    assert raised.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["generate", "--backend", "hf", "--dtype", "int8", "x"], "llama backend only"),
    (["profile", "--dtypes", "fp16"], "--dtypes"),
    (["quality", "--texts", "0"], "--texts"),
])
def test_bad_dtype_input_exits_2_with_a_message(capsys, model_dir, argv, message):
    code = cli.main([argv[0], "--model", model_dir, *argv[1:]])
    assert code == 2 and message in capsys.readouterr().err


def test_verify_rows_equal_one_token_decoding_to_the_bit():
    """The ar path (one token per pass) and a verify pass over a chain or a tree must give each row the very
    same logits: int8 magnifies a last-bit difference (say, from attention summing in another order) into a
    quantization step, and that would break the equality with ar on real models."""
    backend = int8_backend(5, layers=4, sharp=4.0)
    prompt, chain = tokens(40, seed=11), tokens(7, seed=12)
    backend.reset()
    backend.forward(prompt)
    batch = backend.forward(chain).logits  # [7, V] one causal pass
    backend.rollback(len(prompt))
    one_by_one = torch.stack([backend.forward(token.view(1)).logits[0] for token in chain])
    assert torch.equal(batch, one_by_one)
    backend.rollback(len(prompt))
    positions = len(prompt) - 1 + torch.tensor(tree_depths(TREE_PARENTS))
    tree = backend.forward(chain[: len(TREE_PARENTS)], positions, tree_mask(TREE_PARENTS, len(prompt))).logits
    for node, path in [(3, [0, 1, 3]), (4, [0, 2, 4]), (5, [5])]:
        backend.rollback(len(prompt))
        for i in path:
            last = backend.forward(chain[i].view(1)).logits[0]
        assert torch.equal(tree[node], last), node
