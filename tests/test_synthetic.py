"""Synthetic models (paradecode.synthetic, benchmarks/scaling.py): a random-weight GGUF that llama.cpp loads, and
our native backends built straight from its blocks compute what llama.cpp computes from the same file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from paradecode import synthetic
from paradecode.backends import native, q4
from paradecode.backends.int8_llama import Int8LlamaBackend
from paradecode.backends.q4_llama import Q4LlamaBackend
from tiny import TREE_PARENTS, assert_rows_equal_one_token_passes

pytestmark = pytest.mark.skipif(not native.enabled(), reason="PARADECODE_NATIVE=0 turns the native path off")

# tied: the embedding is the LM head (Q8_0: 64 is no multiple of 256); untied: a Q4_0 embedding and a Q6_K head;
# k-quants: laid out as Q4_K_M (Q4_K projections, Q6_K attn_v and ffn_down on layers 0, 3, 6 and 7 of 8, so their
# qkv mixes Q4_K and Q6_K; a Q4_K embedding and a Q6_K head).
SPECS = {
    "tied": dict(model="tiny tied", vocab_size=320, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=1e4),
    "untied": dict(model="tiny untied", vocab_size=300, hidden_size=256, intermediate_size=64, num_layers=2,
                   num_heads=2, num_kv_heads=1, head_dim=128, tie_word_embeddings=False, rope_theta=1e4),
    "k-quants": dict(model="tiny k-quants", vocab_size=300, hidden_size=256, intermediate_size=256, num_layers=8,
                     num_heads=2, num_kv_heads=1, head_dim=128, tie_word_embeddings=False, rope_theta=1e4),
}
QUANT = {"tied": "q4_0", "untied": "q4_0", "k-quants": "q4_k_m"}
IDS = [260, 300 - 1, 261, 270, 280, 262, 263, 290, 264, 265, 266, 271]

LLAMA_CPP = textwrap.dedent("""
    import json, sys
    import llama_cpp
    llm = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    ids = json.loads(sys.argv[2])
    llm.eval(ids)
    print(json.dumps([[float(x) for x in llm.scores[i]] for i in range(len(ids))]))
""")


@pytest.fixture(scope="module", params=sorted(SPECS))
def written(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("synthetic") / f"{request.param}.gguf"
    synthetic.write_gguf(SPECS[request.param], path, seed=1, progress=False, scale=20.0,  # sharp attention
                         quant=QUANT[request.param])
    return request.param, path


@pytest.mark.parametrize("dtype", ["q4", "int8"])
def test_our_backend_on_the_file_computes_what_llama_cpp_computes(written, dtype):
    """Same file, llama.cpp's kernels in a child process: every row of logits correlates with llama.cpp's at 0.97
    or more (measured: q4 0.999, int8 0.98-0.99, int8 having no SmoothQuant here; taking the q rows in the file's
    order instead of undoing llama.cpp's RoPE permutation gives 0.35 at best). On q4 the file's Q8_0 or Q6_K head
    runs as stored, so there every weight is the file's."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    name, path = written
    done = subprocess.run([sys.executable, "-c", LLAMA_CPP, str(path), json.dumps(IDS)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    want = torch.tensor(json.loads(done.stdout))
    backend = synthetic.load(path, SPECS[name], dtype, max_length=64)
    assert isinstance(backend, Q4LlamaBackend if dtype == "q4" else Int8LlamaBackend) and backend.dtype == dtype
    # q4 runs the file's head as stored (the tied file's Q8_0, the untied one's Q6_K); int8 its own int8 head
    assert getattr(backend._lm_head, "bits", None) == ({"tied": 8}.get(name, 6) if dtype == "q4" else None)
    if name == "k-quants" and dtype == "q4":  # Q4_K throughout, with Q6_K v and down on the more-bits layers
        layouts = [(layer.qkv.layout, layer.down.bits) for layer in backend._layers]
        assert layouts[1] == (((512, q4.Q4K, False),), q4.Q4K) and backend._layers[1].qkv.bits == q4.Q4K
        assert layouts[0] == (((256, q4.Q4K, False), (128, q4.Q4K, False), (128, 6, False)), 6)
    got = backend.forward(torch.tensor(IDS)).logits
    assert got.shape == want.shape
    correlation = [torch.corrcoef(torch.stack([g, w]))[0, 1].item() for g, w in zip(got, want)]
    assert min(correlation) > 0.97, correlation
    assert (got - want).abs().max() < 0.2 * want.abs().max()
    assert want.std(-1).min() > 0.1 * want.abs().max()  # logits spread enough for the comparison to mean something


@pytest.mark.parametrize("dtype", ["q4", "int8"])
def test_every_row_of_a_backend_built_from_parts_equals_its_one_token_pass(written, dtype):
    name, path = written
    backend = synthetic.load(path, SPECS[name], dtype, max_length=128)
    g = torch.Generator().manual_seed(0)
    assert_rows_equal_one_token_passes(backend, torch.randint(300, (40,), generator=g),
                                       torch.randint(300, (len(TREE_PARENTS),), generator=g))


def test_the_random_blocks_have_the_spread_asked_for():
    rng = np.random.default_rng(0)
    from gguf import GGMLQuantizationType, quants

    for kind in ("Q4_0", "Q8_0", "Q6_K", "Q4_K"):
        weights = quants.dequantize(synthetic.random_rows(rng, kind, 64, 512), GGMLQuantizationType[kind])
        assert weights.shape == (64, 512)
        assert 0.005 < weights.std() < 0.05, kind
        assert np.isfinite(weights).all()
    with pytest.raises(ValueError, match="no random blocks"):
        synthetic.random_rows(rng, "Q5_K", 4, 256)


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="placeholder vocabulary"):
        synthetic.write_gguf(dict(SPECS["tied"], vocab_size=100), tmp_path / "x.gguf", progress=False)
    with pytest.raises(ValueError, match="q4 or int8"):
        synthetic.load(tmp_path / "x.gguf", SPECS["tied"], "fp32", 64)
    with pytest.raises(ValueError, match="q4_k_m needs rows of multiples of 256"):
        synthetic.write_gguf(SPECS["untied"], tmp_path / "x.gguf", progress=False, quant="q4_k_m")


def test_the_real_shapes_are_what_the_scaling_benchmark_names():
    for size, spec in synthetic.SHAPES.items():
        shape = synthetic.llama_shape(spec)
        assert shape.num_heads * shape.head_dim % 32 == 0 and shape.hidden_size % 32 == 0, size
        assert shape.intermediate_size % 32 == 0, size
    params = {}
    for size, spec in synthetic.SHAPES.items():
        layer, head = synthetic.parameters(spec)
        params[size] = (spec["num_layers"] * layer + head * (1 if spec["tie_word_embeddings"] else 2)) / 1e9
    assert 0.45 < params["0.5b"] < 0.55 and 1.1 < params["1b"] < 1.3
    assert 3.0 < params["3b"] < 3.4 and 7.8 < params["8b"] < 8.2


def _scaling_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling.py"
    spec = importlib.util.spec_from_file_location("scaling_script", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_projection_prices_each_step_at_its_width(tmp_path):
    """benchmarks/scaling.py's report: widths between measured T interpolate linearly, beyond the last extrapolate;
    a method's rate is its tokens over its steps' prices; paired ratios are per-round medians."""
    scaling = _scaling_script()
    curve = {1: 0.010, 2: 0.012, 4: 0.020, 8: 0.040, 16: 0.100}
    assert scaling._interpolate(curve, 3) == pytest.approx(0.016)
    assert scaling._interpolate(curve, 20) == pytest.approx(0.130)
    records = tmp_path / "records.jsonl"
    turns = {  # ar: 4 steps of one token; ngram: a 3-row step taking 3 tokens and a 1-row step taking 1
        "ar": dict(draft_lengths=[0, 0, 0, 0], accepted_per_step=[1, 1, 1, 1], wall_time_s=0.05,
                   stats=dict(prefill_time_s=0.01)),
        "ngram": dict(draft_lengths=[2, 0], accepted_per_step=[3, 1], wall_time_s=0.036,
                      stats=dict(prefill_time_s=0.0)),
        "lookahead": dict(draft_lengths=[2], accepted_per_step=[2], wall_time_s=0.01, stats={}),
    }
    records.write_text("\n".join(json.dumps(dict(method=m, turns=[t])) for m, t in turns.items()))
    steps = scaling.method_steps(records)
    assert sorted(steps) == ["ar", "ngram"]  # lookahead's window rows are not in its records: left out
    assert steps["ar"].rate(curve) == pytest.approx(100.0) and steps["ar"].tau == 1.0
    assert steps["ngram"].rate(curve) == pytest.approx(4 / (0.016 + 0.010)) and steps["ngram"].tau == 2.0
    assert steps["ngram"].rate(curve, 0.5) == steps["ngram"].rate(curve)  # only head drafters pay head steps
    # auto: priced while its arms are training-free; left out once a head arm took steps (their cost is unknown)
    arms = dict(auto=dict(candidates=dict(ngram=dict(steps=2), eagle=dict(steps=0, info=dict(head="h")))))
    auto = dict(turns["ngram"], info=dict(batch_size=1), stats=dict(info=arms))  # the runner's info, the method's
    records.write_text(records.read_text() + "\n" + json.dumps(dict(method="auto", turns=[auto])))
    assert scaling.method_steps(records)["auto"].steps == [(3, 3), (1, 1)]
    arms["auto"]["candidates"]["eagle"]["steps"] = 1
    records.write_text(records.read_text() + "\n" + json.dumps(dict(method="auto", turns=[auto])))
    assert "auto" not in scaling.method_steps(records)
    # a head drafter's label: each step adds one head step at the given share of a one-token pass
    records.write_text(records.read_text() + "\n" + json.dumps(dict(method="eagle-chain1", turns=[turns["ngram"]])))
    heads = scaling.method_steps(records, heads=("eagle-chain1",))
    assert heads["eagle-chain1"].rate(curve, 0.5) == pytest.approx(4 / (0.016 + 0.010 + 2 * 0.005))
    # its bytes: one decoder layer of the shape, the fc (2D -> D) and the draft-vocabulary head, at a byte each
    layer = 576 * (9 + 2 * 3) * 64 + 9 * 64 * 576 + 3 * 576 * 1536
    assert scaling.head_step_bytes("135m", 4096) == layer + 2 * 576 * 576 + 4096 * 576
    assert scaling.head_step_bytes("1b", 1024) < scaling.head_step_bytes("1b", 4096) < scaling.head_step_bytes("3b", 4096)
    slow = dict(rounds=[{"1": 2.0}, {"1": 3.0}, {"1": 10.0}])
    fast = dict(rounds=[{"1": 1.0}, {"1": 1.0}, {"1": 2.0}])
    assert scaling.paired_ratio(slow, fast) == pytest.approx(3.0)
    assert scaling.median_curve(slow["rounds"]) == {1: 3.0}


def test_the_projection_prices_greedy_runs_by_greedy_passes(tmp_path, capsys):
    """The bench runs decode greedily: where the results time greedy verification's pass (``ours q4 greedy``),
    report prices the steps by it, else by the full-logits pass."""
    import argparse

    scaling = _scaling_script()
    full, greedy, llama = ({str(t): s * t for t in scaling.SIZES_T} for s in (0.010, 0.008, 0.020))
    machine = dict(cpu="test", threads=2, isa=[])
    rows = {"1b|ours q4": dict(rounds=[full], weight_bytes=1e9), "1b|llama.cpp portable": dict(rounds=[llama])}
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(dict(method="ar", turns=[dict(accepted_per_step=[1, 1])])))
    args = argparse.Namespace(folder=str(tmp_path), records=str(records), heads="", draft_vocab=4096, plot=None,
                              doc=None)
    rates = []
    for with_greedy in (False, True):
        if with_greedy:
            rows["1b|ours q4 greedy"] = dict(rounds=[greedy], weight_bytes=1e9)
        (tmp_path / "results.json").write_text(json.dumps(dict(machines=[machine], rows=rows)))
        assert scaling.report(args) == 0
        line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("| 1b | 50.0 |"))
        rates.append(line.split("|")[3].strip())
    assert rates == ["100.0 (2.00x)", "125.0 (2.50x)"]
