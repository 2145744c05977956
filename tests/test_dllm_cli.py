"""``paradecode dllm`` on checkpoints written in the test: outputs, the trace file, a tiny bench, and every
bad input ending in a clear message with exit code 2."""

import json

import pytest
import torch

from paradecode import cli
from paradecode.dllm.model import ModelConfig, TinyLM

SMALL = dict(n_layers=1, d_model=32, n_heads=2, d_ff=64)


@pytest.fixture(scope="module")
def dllm_dir(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("dllm")
    TinyLM(ModelConfig(**SMALL)).save(folder)
    return str(folder)


@pytest.fixture(scope="module")
def twin_dir(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("twin")
    TinyLM(ModelConfig(causal=True, **SMALL)).save(folder)
    return str(folder)


def call(capsys, *argv):
    code = cli.main(["dllm", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_and_trace(capsys, dllm_dir, tmp_path):
    trace = tmp_path / "t.html"
    code, out, err = call(capsys, "generate", "--model", dllm_dir, "--sampler", "threshold", "--opt", "threshold=0.5",
                          "--json", "--trace", str(trace), "reverse: 7 3 9 1 4")
    assert code == 0, err
    payload = json.loads(out)
    stats = payload["stats"]
    assert len(payload["canvas"]) == 12 and stats["forward_passes"] == len(stats["steps"]) >= 1
    assert sum(len(s["positions"]) + len(s["filled"]) for s in stats["steps"]) == 12  # each position decided once
    assert "<table>" in trace.read_text()


def test_generate_text_reports_tokens_per_forward(capsys, dllm_dir):
    code, out, err = call(capsys, "generate", "--model", dllm_dir, "--sampler", "topk", "--steps", "6",
                          "--block-length", "6", "copy : 1 2 3")
    assert code == 0, err
    assert "tokens/forward" in err and "forward passes" in err


@pytest.mark.parametrize("argv,message", [
    (["--sampler", "nope"], "unknown sampler"),
    (["--sampler", "threshold", "--opt", "threshold=2"], "threshold must be in"),
    (["--sampler", "factor", "--opt", "factor=abc"], "must be a number"),
    (["--gen-length", "50"], "more than this model's context"),
    (["--block-length", "5"], "must divide"),
    (["--cache", "full"], "unknown cache"),
    (["--model", "no-such-model"], "unknown model"),
])
def test_generate_bad_inputs_exit_2(capsys, dllm_dir, argv, message):
    argv = argv if "--model" in argv else ["--model", dllm_dir, *argv]
    code, out, err = call(capsys, "generate", *argv, "copy : 1 2 3")
    assert code == 2 and message in err and "Traceback" not in err


def test_unknown_task_word_exit_2(capsys, dllm_dir):
    code, _, err = call(capsys, "generate", "--model", dllm_dir, "frobnicate : 1 2")
    assert code == 2 and "does not know: frobnicate" in err


def test_autoregressive_model_is_refused(capsys, twin_dir):
    code, _, err = call(capsys, "generate", "--model", twin_dir, "copy : 1 2 3")
    assert code == 2 and "autoregressive" in err


@pytest.mark.parametrize("argv,message", [
    (["--samplers", "topk,nope"], "unknown sampler"),
    (["--caches", "full"], "unknown cache mode"),
    (["--per-task", "0"], "--per-task"),
    (["--sweep", "threshold=2"], "threshold must be in"),
    (["--sweep", "topk=0"], "steps must be integers"),
])
def test_bench_bad_inputs_exit_2(capsys, dllm_dir, tmp_path, argv, message):
    code, _, err = call(capsys, "bench", "--models", dllm_dir, "--out", str(tmp_path), *argv)
    assert code == 2 and message in err


def test_bench_writes_results_report_and_plot(capsys, dllm_dir, tmp_path):
    code, _, err = call(capsys, "bench", "--models", dllm_dir, "--samplers", "threshold", "--sweep", "threshold=0.5",
                        "--caches", "none,dual", "--per-task", "1", "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    results = json.loads((tmp_path / "results.json").read_text())
    summary = results["summary"]["waiting-line"]
    assert set(summary) == {"one-per-step", "threshold threshold=0.5", "oracle",
                            "threshold threshold=0.9 block=4 cache=none", "threshold threshold=0.9 block=4 cache=dual"}
    assert summary["one-per-step"]["all"]["n"] == 7 and summary["one-per-step"]["all"]["cpu_ms"] > 0
    assert (tmp_path / "tradeoff-waiting-line.png").stat().st_size > 1000
    assert "## Model `waiting-line`" in (tmp_path / "report.md").read_text()


def test_train_rejects_bad_settings(capsys, tmp_path):
    code, _, err = call(capsys, "train", "--suite", "sudoku", "--out", str(tmp_path))
    assert code == 2 and "unknown task suite" in err
    code, _, err = call(capsys, "train", "--objective", "gan", "--out", str(tmp_path))
    assert code == 2 and "unknown objective" in err
