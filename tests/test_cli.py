"""The CLI and Python API on a tiny model directory: outputs, the lossless certificate, and every bad input
ending in a clear message with exit code 2 (never a traceback)."""

import io
import json

import pytest

import paradecode
from paradecode import cli
from paradecode.verify.base import Verdict
from tiny import WORDS, tiny_model_dir

PROMPT = "w3 w4 w5 w3 w4 w5 w3 w4"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(tiny_model_dir(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def other_tokenizer_dir(tmp_path_factory):
    words = ["<unk>", "<eos>"] + [f"v{i}" for i in range(46)]
    return str(tiny_model_dir(tmp_path_factory.mktemp("other"), seed=1, words=words))


def call(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_has_text_ids_and_stats(capsys, model_dir):
    code, out, err = call(capsys, "generate", "--model", model_dir, "--method", "pld", "--json",
                          "--max-new-tokens", "20", PROMPT)
    assert code == 0, err
    payload = json.loads(out)
    assert set(payload) >= {"text", "token_ids", "stats"}
    stats = payload["stats"]
    assert len(payload["token_ids"]) == stats["new_tokens"] <= 20
    assert stats["forward_passes"] == len(stats["accepted_per_step"])
    assert sum(stats["accepted_per_step"]) == stats["new_tokens"]
    for key in ("mean_accepted", "tokens_per_second", "wall_time_s", "prefill_time_s", "drafted_tokens"):
        assert key in stats
    assert payload["text"] == " ".join(WORDS[t] for t in payload["token_ids"] if t != 1)


def test_verify_certifies_lossless_and_exit_3_when_not(capsys, model_dir, monkeypatch):
    code, _, err = call(capsys, "generate", "--model", model_dir, "--method", "pld", "--verify", PROMPT)
    assert code == 0 and "IDENTICAL" in err

    def accept_everything(draft_tokens, parents, logits):
        return Verdict(list(range(len(draft_tokens))), list(draft_tokens), int(logits[-1].argmax()), True)

    monkeypatch.setattr("paradecode.engine.verify_greedy", accept_everything)
    code, _, err = call(capsys, "generate", "--model", model_dir, "--method", "pld", "--verify", PROMPT)
    assert code == cli.EXIT_NOT_LOSSLESS and "DIFFERS" in err


def test_prompt_from_stdin_and_stop_string(capsys, model_dir, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT))
    code, out, _ = call(capsys, "generate", "--model", model_dir, "--json", "--max-new-tokens", "30")
    assert code == 0
    text = json.loads(out)["text"]
    stop = text.split()[4]  # a word that appears in the unrestricted output
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT))
    code, out, _ = call(capsys, "generate", "--model", model_dir, "--json", "--max-new-tokens", "30",
                        "--method", "pld", "--stop", stop)
    payload = json.loads(out)
    assert code == 0 and stop not in payload["text"] and payload["stats"]["stop_reason"] == "stop"
    assert text.startswith(payload["text"])


def test_stream_yields_the_same_text_as_generate(model_dir):
    model = paradecode.load(model_dir)
    full = model.generate(PROMPT, method="pld", max_new_tokens=25)
    stream = model.stream(PROMPT, method="pld", max_new_tokens=25)
    deltas = list(stream)
    assert len(deltas) > 1 and "".join(deltas) == full.text
    assert stream.result.token_ids == full.token_ids


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["generate", "--model", "{model}", "   "], "prompt is empty"),
        (["generate", "--model", "no-such-model", "hi"], "unknown model"),
        (["generate", "--model", "{model}", "--method", "nope", "w3"], "unknown method"),
        (["generate", "--model", "{model}", "--method", "pld", "--opt", "num_draft=many", "w3"], "integer"),
        (["generate", "--model", "{model}", "--method", "pld", "--opt", "depth=3", "w3"], "no option depth"),
        (["generate", "--model", "{model}", "--method", "pld", "--opt", "oops", "w3"], "key=value"),
        (["generate", "--model", "{model}", "--max-new-tokens", "0", "w3"], "max new tokens"),
        (["generate", "--model", "{model}", "--temperature", "-1", "w3"], "temperature"),
        (["generate", "--model", "{model}", "--top-p", "1.5", "w3"], "top-p"),
        (["generate", "--model", "{model}", "--method", "draft", "w3"], "needs a draft model"),
        (["generate", "--model", "{model}", "--method", "draft", "--draft-model", "{other}", "w3"], "different tokenizer"),
        (["generate", "--model", "{model}", " ".join(["w3"] * 300)], "context holds"),
        (["generate", "--model", "{model}", "--temperature", "0.5", "--verify", "w3"], "temperature 0"),
        (["generate", "--model", "{corrupt}", "w3"], "could not read model file"),
        (["generate", "--model", "{tmp}", "w3"], "without config.json"),
    ],
)
def test_bad_input_gives_a_message_and_exit_2(capsys, tmp_path, model_dir, other_tokenizer_dir, argv, fragment):
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x00garbage" * 10)
    values = dict(model=model_dir, other=other_tokenizer_dir, corrupt=str(corrupt), tmp=str(tmp_path))
    argv = [a.format(**values) for a in argv] + ["--cache-dir", str(tmp_path / "cache")]
    code, _, err = call(capsys, *argv)
    assert code == 2, err
    assert fragment in err and "Traceback" not in err
    assert err.startswith("paradecode: error:") and len(err.strip().splitlines()) == 1


def test_models_lists_builtins(capsys, tmp_path):
    code, out, _ = call(capsys, "models", "--cache-dir", str(tmp_path))
    assert code == 0 and "smollm2-135m" in out and "gemma3-270m" in out and "not cached" in out


def test_models_shows_the_speed_kept_for_this_machine(capsys, tmp_path):
    """The cost curve a cost-aware run kept for a model on this machine is its speed in `models`; another machine's
    is not."""
    import json

    from paradecode.profile import machine_key

    folder = tmp_path / "models" / "mine"
    folder.mkdir(parents=True)
    (folder / "paradecode.json").write_text(json.dumps({"source": "mine.gguf"}))
    (tmp_path / "profiles").mkdir()
    for name, machine, one in [("here", machine_key(), 0.01), ("there", "another CPU", 0.5)]:
        (tmp_path / "profiles" / f"{name}.json").write_text(json.dumps(
            {"machine": machine, "model": f"{folder.resolve()}|Int8LlamaBackend|int8|own",
             "seconds": {"1": one, "2": one * 1.1, "8": one * 2, "16": one * 4}}))
    code, out, _ = call(capsys, "models", "--cache-dir", str(tmp_path))
    assert code == 0
    assert "int8 speed here: one-token forward 10.0 ms (100/s), 8 tokens 2.00x one" in out
    assert "500.0 ms" not in out and out.count("speed here") == 1


def test_each_builtin_default_dtype_is_one_whose_shipped_quality_passes(tmp_path):
    """A built-in model's default dtype other than fp32 is backed by a shipped `paradecode quality` record within
    the 1% perplexity bar (a default set without a measurement, or one that failed it, fails here)."""
    from paradecode.models import BUILTIN_MODELS
    from paradecode.quality import known

    for name, builtin in BUILTIN_MODELS.items():
        if builtin.default_dtype != "fp32":
            record = known(tmp_path, name)[builtin.default_dtype]  # tmp_path: no figures measured here
            assert record["passes_bar"] and record["perplexity_change"] <= 0.01, name


def test_methods_lists_registered_methods(capsys):
    code, out, _ = call(capsys, "methods")
    assert code == 0
    for name in paradecode.method_names():
        assert name in out
