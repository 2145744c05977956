"""The trace viewer: ``render_trace`` on hand-built steps (chain, tree, bonus, recovered, cut at EOS, hostile
token strings), ``trace_payload`` on a tiny model, the ``trace`` command, and the page in headless Chromium
(the JS-built rows exist and match the steps; a screenshot lands in test-artifacts/)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from paradecode.api import Model
from paradecode.backends.llama import LlamaBackend
from paradecode import commands
from paradecode.cli import main
from paradecode.trace import render_trace, trace_payload
from test_benchmark import TinyTokenizer
from tiny import tiny_llama

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
EVIL = "<script>alert(1)</script>"


def step(drafted, accepted, next_token, bonus, committed, parents=None):
    return dict(drafted=drafted, parents=parents, accepted=accepted, next_token=next_token, bonus=bonus,
                committed=committed, time_s=0.004, info=None)


def hand_built_payload():
    steps = [
        step([], [], 10, True, 1),  # plain AR step: the target's own token only
        dict(step([11, 12, 13], [0, 1], 14, False, 3), info={"drafter": "pld"}),  # chain: 2 accepted, 1 rejected
        step([15, 16], [0, 1], 17, True, 3),  # full accept + bonus
        # tree: nodes 0 (root child), 1 (child of 0), 2 (root child), 3 (child of 2); path 2 -> 3 accepted
        step([20, 21, 22, 23], [2, 3], 24, True, 3, parents=[-1, 0, -1, 2]),
        step([25, 99], [0, 1], 26, True, 2),  # accepted draft 99 is EOS: the step is cut after it
    ]
    token_ids = [10, 11, 12, 14, 15, 16, 17, 22, 23, 24, 25, 99]
    pieces = {str(i): f" w{i}" for i in range(10, 30)}
    pieces.update({"12": EVIL, "14": "\n", "99": "</s>", "20": "a & b", "21": ""})
    stats = dict(method="pld", new_tokens=12, forward_passes=5, draft_forward_passes=0, drafted_tokens=11,
                 accepted_tokens=8, wall_time_s=0.5, prefill_time_s=0.1, stop_reason="eos", steps=steps)
    return dict(method="pld", model="tiny <model>", options={"num_draft": 3}, prompt="Say </pre> & <b>hi</b>",
                text="", prompt_tokens=7, token_ids=token_ids, stats=stats, pieces=pieces)


def test_render_trace_is_self_contained_and_escaped():
    page = render_trace(hand_built_payload())
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert not re.search(r"(src|href)=\"?https?:", page) and "@import" not in page  # no network
    assert EVIL not in page and "</s>" not in page  # token strings only travel as escaped JSON
    assert "tiny &lt;model&gt;" in page and "Say &lt;/pre&gt; &amp; &lt;b&gt;hi&lt;/b&gt;" in page
    assert page.count("<script") == 2  # the data block and the viewer, nothing injected
    assert ">12</div>" in page and ">2.40</div>" in page  # tokens; mean accepted = 12 / 5


def test_trace_payload_on_a_tiny_model_and_the_trace_command(tmp_path, monkeypatch):
    hf = tiny_llama(3, sharp=4.0)
    model = Model(LlamaBackend.from_hf(hf), TinyTokenizer(), name="tiny", model_dir=tmp_path, chat=True)
    result = model.generate("abcabcabcabc", method="pld", max_new_tokens=30)
    payload = trace_payload(model, result, method="pld", prompt="abcabcabcabc")
    assert len(payload["stats"]["steps"]) == result.stats.forward_passes
    assert "".join(payload["output_pieces"]) == model.decode(result.token_ids)
    assert all(str(t) in payload["pieces"] for s in result.stats.steps for t in s.drafted)
    assert sum(s["committed"] for s in payload["stats"]["steps"]) == len(payload["token_ids"]) == 30

    monkeypatch.setattr(commands, "load_model", lambda args: model)
    out = tmp_path / "t.html"
    assert main(["trace", "--method", "pld", "--opt", "num_draft=3", "--max-new-tokens", "20", "abcabcabc",
                 "--out", str(out)]) == 0
    assert '"steps"' in out.read_text()
    assert main(["trace", "--method", "nope", "x", "--out", str(out)]) == 2


def test_trace_runs_on_a_model_without_chat_template_and_matches_generate(tmp_path, capsys):
    """``trace`` encodes the prompt as ``generate`` does (the chat template only where the model has one)."""
    import json

    from tiny import tiny_model_dir

    model_dir = str(tiny_model_dir(tmp_path / "model"))  # a word-level tokenizer without a chat template
    prompt = "w3 w4 w5 w3 w4 w5 w3 w4"
    argv = ["--model", model_dir, "--method", "pld", "--max-new-tokens", "20", prompt]
    assert main(["generate", "--json", *argv]) == 0
    generated = json.loads(capsys.readouterr().out)
    out = tmp_path / "t.html"
    assert main(["trace", *argv, "--out", str(out)]) == 0, capsys.readouterr().err
    data = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', out.read_text(), re.S)
    traced = json.loads(data.group(1))
    assert traced["token_ids"] == generated["token_ids"]


def chromium(*args, timeout=60):
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def long_payload(tokens: int = 500):
    """A realistic-looking 500-token chain trace: words, some drafts accepted, some rejected."""
    words = ("def fibonacci ( n ) : \n if n < 2 : \n return n \n return fibonacci ( n - 1 ) + "
             "fibonacci ( n - 2 ) \n").split(" ")
    pieces = {str(i): (" " if i % 3 else "") + w for i, w in enumerate(words)}
    steps, ids, i = [], [], 0
    while len(ids) < tokens:
        drafted = [(i + k) % len(words) for k in range(1, 1 + (i % 5))]
        accepted = list(range(min(len(drafted), i % 3)))
        committed = min(len(accepted) + 1, tokens - len(ids))
        steps.append(step(drafted, accepted, (i + 7) % len(words), len(accepted) == len(drafted), committed))
        ids += ([drafted[k] for k in accepted] + [(i + 7) % len(words)])[:committed]
        i += 1
    stats = dict(new_tokens=len(ids), forward_passes=len(steps), draft_forward_passes=0,
                 drafted_tokens=sum(len(s["drafted"]) for s in steps),
                 accepted_tokens=sum(len(s["accepted"]) for s in steps), wall_time_s=9.1, stop_reason="max_new_tokens",
                 steps=steps)
    return dict(method="pld", model="smollm2-135m", prompt="Write a Python function for Fibonacci numbers.",
                prompt_tokens=31, token_ids=ids, stats=stats, pieces=pieces)


# CI sets PARADECODE_REQUIRE_BROWSER=1 and installs Chromium, so there a missing browser fails the test.
@pytest.mark.skipif(CHROMIUM is None and os.environ.get("PARADECODE_REQUIRE_BROWSER") != "1",
                    reason="chromium is not installed (Debian: apt-get install -y chromium)")
@pytest.mark.parametrize("name,payload", [("trace-small", hand_built_payload()), ("trace-500", long_payload())])
def test_trace_renders_in_headless_chromium(tmp_path, name, payload):
    assert CHROMIUM is not None, "chromium is required here: apt-get install -y chromium"
    ARTIFACTS.mkdir(exist_ok=True)
    page = ARTIFACTS / f"{name}.html"
    page.write_text(render_trace(payload), encoding="utf-8")
    profile = f"--user-data-dir={tmp_path / 'profile'}"
    dom = chromium(profile, "--dump-dom", page.as_uri()).stdout
    steps = payload["stats"]["steps"]
    rows = re.findall(r'<div class="step" id="step-(\d+)" data-step="\d+" data-drafted="(\d+)"', dom)
    assert [int(n) for n, _ in rows] == list(range(1, len(steps) + 1))
    assert [int(d) for _, d in rows] == [len(s["drafted"]) for s in steps]
    output = dom[dom.index('id="output"'): dom.index("</div>", dom.index('id="output"'))]
    assert output.count("<span") == len(payload["token_ids"])  # one span per output token
    assert dom.count('class="chip rej"') >= 1 and dom.count("chip bonus") >= 1
    if name == "trace-small":
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom and "<script>alert" not in dom
        assert 'class="chip rec"' in dom and "tree · 4 nodes" in dom and 'drafter="pld"' in dom
        assert dom.count('title="step 4 · ') == 3  # the tree step committed 3 tokens
        assert 'class="chip bonus cut"' in dom  # EOS was accepted inside the draft: its bonus never commits
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    chromium(profile, f"--screenshot={shot}", "--window-size=1400,1000", "--hide-scrollbars", page.as_uri())
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
