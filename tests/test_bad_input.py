"""Bad input, as a careless user gives it, across every command and the server's request bodies: each case ends
with exit code 2 (or an OpenAI-shaped 4xx) and one readable line naming what was wrong, never a traceback, and
the next good run works. The fast cases use a tiny model; the real-model ones are marked slow."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paradecode import cli
from tiny import tiny_model_dir

NOT_UTF8 = b"\xff\xfe hello \xc3\x28"  # the issue's example: an invalid start byte, then a bad continuation
RANDOM = bytes(range(128, 256)) * 4 + os.urandom(400)  # bytes that are not UTF-8 text from the first one on
GOOD = "w3 w4 w5 w3 w4"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    (root / "file").write_text("not a folder")
    (root / "folder").mkdir()
    (root / "empty-model").mkdir()
    (root / "broken.gguf").write_bytes(b"GGUF" + b"\x00garbage" * 10)
    (root / "latin1.jsonl").write_bytes('{"question_id": 1, "category": "x", "turns": ["caf\xe9"]}\n'.encode("latin-1"))
    (root / "latin1-prompts.jsonl").write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    return dict(model=str(tiny_model_dir(root / "model")), file=str(root / "file"), folder=str(root / "folder"),
                missing=str(root / "missing"), empty=str(root / "empty-model"), gguf=str(root / "broken.gguf"),
                latin1=str(root / "latin1.jsonl"), latin1_prompts=str(root / "latin1-prompts.jsonl"),
                under_file=str(root / "file" / "inside"), cache=str(root / "cache"), root=str(root))


def run(capsys, monkeypatch, argv: list[str], stdin: bytes | None = None) -> tuple[int, str]:
    """cli.main in this process; argparse's own errors arrive as SystemExit."""
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    try:
        code = cli.main(argv)
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return code, err


# (argv with {placeholders}, standard input or None, a fragment of the message)
CLI_CASES = [
    # the issue's three: bytes that are not UTF-8 on stdin, a cache folder that is a file
    (["generate", "--model", "{model}"], RANDOM, "standard input is not UTF-8 text: byte 0 (0x80)"),
    (["generate", "--model", "{model}"], NOT_UTF8, "standard input is not UTF-8 text: byte 0 (0xff)"),
    (["generate", "--model", "{model}", "--cache-dir", "{file}", "w3"], None, "--cache-dir: {file} is a file"),
    # generate: the prompt
    (["generate", "--model", "{model}", "w3 \udcff w4"], None, "the prompt argument is not UTF-8 text: byte 3"),
    (["generate", "--model", "{model}"], b"w3 w4 \xe9 w5", "byte 6 (0xe9)"),
    (["generate", "--model", "{model}"], b"", "the prompt is empty"),
    (["generate", "--model", "{model}"], b" \n\t ", "the prompt is empty"),
    (["generate", "--model", "{model}", " ".join(["w3"] * 300)], None, "context holds"),
    # generate: the model and the cache
    (["generate", "--model", "{missing}", "w3"], None, "unknown model"),
    (["generate", "--model", "{empty}", "w3"], None, "without config.json"),
    (["generate", "--model", "{file}", "w3"], None, "is not a .gguf file or a model directory"),
    (["generate", "--model", "{gguf}", "--cache-dir", "{cache}", "w3"], None, "could not read model file"),
    (["generate", "--model", "{model}", "--cache-dir", "{under_file}", "w3"], None, "cannot be created"),
    (["generate", "--model", "{model}", "--method", "draft", "--draft-model", "{missing}", "w3"], None,
     "--draft-model: unknown model"),
    (["generate", "--model", "{model}", "--backend", "tpu", "w3"], None, "invalid choice: 'tpu'"),
    (["generate", "--model", "{model}", "--dtype", "int4", "w3"], None, "invalid choice: 'int4'"),
    (["generate", "--model", "{model}", "--dtype", "q4", "--cache-dir", "{cache}", "w3"], None,
     "was not converted from a .gguf file"),
    (["generate", "--model", "{model}", "--backend", "hf", "--dtype", "int8", "w3"], None, "llama backend only"),
    # generate: methods, options and numbers
    (["generate", "--model", "{model}", "--method", "warp", "w3"], None, "unknown method 'warp'"),
    (["generate", "--model", "{model}", "--method", "pld", "--opt", "num_draft=0", "w3"], None, "num_draft must be"),
    (["generate", "--model", "{model}", "--method", "pld", "--opt", "num_draft", "w3"], None, "key=value"),
    (["generate", "--model", "{model}", "--method", "lookahead", "--opt", "W=2", "--opt", "window=3", "w3"], None,
     "both W and window"),
    (["generate", "--model", "{model}", "--max-new-tokens", "0", "w3"], None, "max new tokens"),
    (["generate", "--model", "{model}", "--max-new-tokens", "many", "w3"], None, "invalid int value: 'many'"),
    (["generate", "--model", "{model}", "--temperature", "nan", "w3"], None, "temperature must be"),
    (["generate", "--model", "{model}", "--top-k", "-1", "w3"], None, "top-k must be"),
    (["generate", "--model", "{model}", "--top-p", "0", "w3"], None, "top-p must be"),
    (["generate", "--model", "{model}", "--stop", "", "w3"], None, "stop strings must be"),
    (["generate", "--model", "{model}", "--verify", "--temperature", "0.5", "w3"], None, "temperature 0"),
    (["generate", "--model", "{model}", "--frobnicate", "w3"], None, "unrecognized arguments: --frobnicate"),
    (["frobnicate"], None, "invalid choice: 'frobnicate'"),
    # trace
    (["trace", "--model", "{model}", "--out", "{folder}", "w3"], None, "is a folder"),
    (["trace", "--model", "{model}", "--out", "{under_file}/t.html", "w3"], None, "cannot be created"),
    (["trace", "--model", "{model}", "--out", "{root}/t.html"], NOT_UTF8, "standard input is not UTF-8 text"),
    # bench
    (["bench", "--model", "{model}", "--questions", "{missing}", "--out", "{root}/b"], None,
     "--questions: {missing} does not exist"),
    (["bench", "--model", "{model}", "--questions", "{folder}", "--out", "{root}/b"], None, "is a folder"),
    (["bench", "--model", "{model}", "--questions", "{latin1}", "--out", "{root}/b"], None,
     "is not UTF-8 text: byte 50 (0xe9)"),
    (["bench", "--model", "{model}", "--out", "{file}"], None, "--out: {file} is a file"),
    (["bench", "--model", "{model}", "--methods", "ar,warp", "--out", "{root}/b"], None, "unknown method 'warp'"),
    (["bench", "--model", "{model}", "--cache-dir", "{file}", "--out", "{root}/b"], None, "--cache-dir"),
    (["bench", "--model", "{model}", "--per-category", "none", "--out", "{root}/b"], None, "--per-category"),
    # profile, quality, models, serve
    (["profile", "--model", "{model}", "--sizes", "1,x"], None, "--sizes"),
    (["profile", "--model", "{model}", "--dtypes", "int4"], None, "--dtypes"),
    (["profile", "--model", "{model}", "--out", "{file}"], None, "--out: {file} is a file"),
    (["profile", "--model", "{model}", "--context", "0"], None, "--context must be"),
    (["quality", "--model", "{model}", "--texts", "0"], None, "--texts must be"),
    (["models", "--cache-dir", "{file}"], None, "--cache-dir: {file} is a file"),
    (["serve", "--model", "{model}", "--port", "70000"], None, "--port"),
    (["serve", "--model", "{model}", "--method", "warp"], None, "unknown method 'warp'"),
    (["serve", "--model", "{model}", "--cache-dir", "{file}", "--max-waiting", "0"], None, "--cache-dir"),
    # training
    (["train-draft", "--kind", "eagle", "--model", "{model}", "--out", "{file}"], None, "--out: {file} is a file"),
    (["train-draft", "--kind", "eagle", "--model", "{model}", "--out", "{root}/h", "--data", "{file}"], None,
     "--data: {file} is a file"),
    (["train-draft", "--kind", "eagle", "--model", "{model}", "--out", "{root}/h", "--prompts", "{latin1_prompts}"],
     None, "is not UTF-8 text: byte 15 (0xe9)"),
    (["train-draft", "--kind", "eagle", "--model", "{model}", "--out", "{root}/h", "--init", "{missing}"], None,
     "--init"),
    (["make-prompts", "--model", "{model}", "--out", "{root}/p.txt"], None, ".jsonl"),
    (["make-prompts", "--model", "{model}", "--out", "{folder}"], None, "is a folder"),
    (["export-draft", "--model", "{model}", "--head", "{missing}", "--out", "{root}/e"], None,
     "--head: {missing} does not exist"),
    (["export-draft", "--model", "{model}", "--head", "{folder}", "--out", "{file}"], None, "--out: {file} is a file"),
    # dllm
    (["dllm", "generate", "--sampler", "warp", "copy : 1 2"], None, "unknown sampler 'warp'"),
    (["dllm", "generate", "copy : 1 \udce9 2"], None, "the prompt argument is not UTF-8 text"),
    (["dllm", "generate", "--trace", "{folder}", "copy : 1 2"], None, "is a folder"),
    (["dllm", "bench", "--out", "{file}"], None, "--out: {file} is a file"),
    (["dllm", "train", "--model", "waiting-line", "--out", "{file}"], None, "--out: {file} is a file"),
]


def _fill(text: str, paths: dict) -> str:
    return text.format(**paths) if "{" in text else text


@pytest.mark.parametrize("argv,stdin,fragment", CLI_CASES, ids=[" ".join(c[0])[:60] for c in CLI_CASES])
def test_bad_command_line_input_gets_one_line_and_exit_2(capsys, monkeypatch, paths, argv, stdin, fragment):
    argv = [_fill(a, paths) for a in argv]
    code, err = run(capsys, monkeypatch, argv, stdin)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("paradecode: error:"), err
    assert _fill(fragment, paths) in lines[0] and "Traceback" not in err
    good, err = run(capsys, monkeypatch, ["generate", "--model", paths["model"], "--cache-dir", paths["cache"],
                                          "--max-new-tokens", "3", GOOD])
    assert good == 0, err


def test_the_table_is_large():
    assert len(CLI_CASES) + len(SERVER_CASES) >= 50


# -- the server's request bodies ---------------------------------------------------------------------------
SERVER_CASES = [
    ("/v1/completions", b'{"model": "tiny", "prompt": "w3 \\ud800 w4"}', 400, "lone surrogate", None),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "w3 \\udcff"}]}', 400,
     "lone surrogate", None),
    ("/v1/completions", b'{"model": "tiny", "prompt": "w3 \xff\xfe w4"}', 400, "not valid JSON", None),
    ("/v1/completions", b"", 400, "not valid JSON", None),
    ("/v1/completions", b'{"model": "tiny", "prompt": null}', 400, "prompt", "prompt.str"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "w3", "top_k": -1}', 400, "top-k must be", None),
    ("/v1/completions", b'{"model": "tiny", "prompt": "w3", "stop": 5}', 400, "stop", "stop.str"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": "w3"}', 400, "valid list", "messages"),
    ("/v1/completions", b'{"model": "tiny", "prompt": [[3, 4], [5]]}', 400, "one prompt per request", "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": [-1]}', 400, "token ids", "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "w3", "paradecode": {"method": "ar", "options": {"x": 1}}}',
     400, "takes no options", None),
    ("/v1/completions", b'{"model": "tiny", "prompt": "w3", "paradecode": {"method": "lookahead", '
                        b'"options": {"G": 1, "candidates": 2}}}', 400, "both G and candidates", None),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("fastapi")
    import paradecode
    from test_server import CHAT_TEMPLATE, serving
    from transformers import AutoTokenizer

    folder = tiny_model_dir(tmp_path_factory.mktemp("served"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    with serving(paradecode.load(str(folder)), max_new_tokens=4) as url:
        yield url


@pytest.mark.parametrize("path,body,status,fragment,param", SERVER_CASES,
                         ids=[c[1][:50].decode("latin-1") for c in SERVER_CASES])
def test_bad_request_bodies_get_openai_errors(server, path, body, status, fragment, param):
    import httpx

    response = httpx.post(f"{server}{path}", content=body, headers={"content-type": "application/json"}, timeout=20)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and fragment in error["message"]
    assert error["param"] == param and "\n" not in error["message"] and "Traceback" not in error["message"]
    good = httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": GOOD}, timeout=20)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] > 0


# -- the real model, as the issue ran it -------------------------------------------------------------------
def _paradecode(args: list[str], stdin: bytes = b"", cwd: Path | None = None) -> subprocess.CompletedProcess:
    src = str(Path(cli.__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "paradecode.cli", *args], input=stdin, capture_output=True,
                          env=env, cwd=cwd, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("args,stdin,fragment", [
    (["generate"], RANDOM, b"standard input is not UTF-8 text"),
    (["generate"], NOT_UTF8, b"standard input is not UTF-8 text: byte 0 (0xff)"),
    (["generate", "--cache-dir", "f", "hi"], b"", b"--cache-dir: f is a file"),
])
def test_the_issues_three_cases_on_the_real_model(tmp_path, args, stdin, fragment):
    (tmp_path / "f").touch()
    done = _paradecode(args, stdin, cwd=tmp_path)
    assert done.returncode == 2 and b"Traceback" not in done.stderr
    assert done.stderr.strip().count(b"\n") == 0 and fragment in done.stderr
    good = _paradecode(["generate", "--max-new-tokens", "4", "--temperature", "0", "Say hi"], cwd=tmp_path)
    assert good.returncode == 0 and good.stdout.strip(), good.stderr
