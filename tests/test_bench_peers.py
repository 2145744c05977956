"""The benchmark outside this workspace, with crash-prone peers, and with methods that learn across questions:
the shipped Spec-Bench questions are the default from any working directory; a peer running in a child
process that dies is a failed row, not a dead benchmark; ``auto`` runs warm after the warm-up, and says so."""

import json
import sys
from pathlib import Path

import pytest

import fake_llamacpp_worker
from paradecode.benchmark import llamacpp_worker, peers, questions
from paradecode.benchmark.llamacpp import LlamaCpp
from paradecode.errors import ParadecodeError
from test_benchmark import bench_cli, tiny_model, write_questions  # noqa: F401  (tiny_model: a fixture)


def test_bench_without_questions_uses_the_shipped_spec_bench_set(tmp_path, monkeypatch, capsys, tiny_model):
    monkeypatch.chdir(tmp_path)  # nowhere near the checkout: no ../shared here
    code, captured = bench_cli(capsys, "--methods", "ar", "--per-category", "1", "--categories", "qa,translation",
                               "--max-new-tokens", "2", "--out", "out")
    assert code == 0, captured.err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["questions"]["path"] == str(questions.DEFAULT_QUESTIONS.resolve())
    assert sorted(r["category"] for r in results["records"]) == ["qa", "translation"]
    shipped = questions.load_questions(questions.DEFAULT_QUESTIONS)
    assert len(shipped) == 480 and len({q.category for q in shipped}) == 13
    assert (questions.DEFAULT_QUESTIONS.parent / "LICENSE").read_text().startswith("Apache License")


@pytest.mark.parametrize("keep", [True, False])
def test_bench_records_whether_auto_ran_warm(tmp_path, capsys, tiny_model, keep):
    qfile = write_questions(tmp_path / "q.jsonl", CRASH_QUESTIONS)
    out = tmp_path / "out"
    code, captured = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "6", "--methods", "ar,auto",
                               "--opt", f"auto.keep={str(keep).lower()}", "--out", str(out))
    assert code == 0, captured.err
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["kept_state"] == {
        "auto": dict(kept_across_questions=keep, warmup=dict(question_id=1, tokens=8))}
    warm = [r["turns"][0]["stats"]["info"]["auto"]["warm"] for r in results["records"] if r["method"] == "auto"]
    assert warm == [keep] * 3  # with keep, even the first question starts from the warm-up's estimates
    assert results["lossless"]["auto"]["share"] == 1.0
    report = (out / "report.md").read_text()
    assert ("`auto` keeps what it learns across questions" in report) == keep
    assert json.loads((out / "settings.json").read_text()).get("kept_state") is None  # not compared on --resume


# -- llama.cpp in a child process ----------------------------------------------------------------------------
CRASH_QUESTIONS = [  # TinyTokenizer prompts: 2 role tokens + one token per character
    dict(question_id=1, category="a", turns=["one two"]),  # 9 tokens
    dict(question_id=2, category="b", turns=["three four"]),  # 12 tokens
    dict(question_id=3, category="c", turns=["five six seven"]),  # 16 tokens
]


class CrashyPeer(LlamaCpp):
    """The ``llamacpp`` peer with its worker replaced by tests/fake_llamacpp_worker.py."""

    settings: dict = {}

    @classmethod
    def unavailable(cls, model):
        return None

    def worker_command(self):
        return [sys.executable, str(Path(__file__).parent / "fake_llamacpp_worker.py"), llamacpp_worker.__file__]

    def worker_config(self):
        return dict(super().worker_config(), **CrashyPeer.settings)


@pytest.fixture
def crashy(monkeypatch, tmp_path):
    monkeypatch.setitem(peers.PEERS, "crashy", CrashyPeer)
    monkeypatch.setattr(CrashyPeer, "method_name", "crashy")
    CrashyPeer.settings = dict(starts_file=str(tmp_path / "starts"))
    return tmp_path / "starts"


@pytest.mark.parametrize("how", ["SIGILL", "exit"])
def test_a_dying_llamacpp_worker_is_a_failed_row_and_restarts(tmp_path, capsys, tiny_model, crashy, how):
    CrashyPeer.settings.update(die_at_prompt_len=12, die_with=how)  # question 2 kills the worker
    qfile = write_questions(tmp_path / "q.jsonl", CRASH_QUESTIONS)
    out = tmp_path / "out"
    code, captured = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "5", "--methods", "ar,crashy",
                               "--out", str(out))
    assert code == 0, captured.err
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and len(results["records"]) == 6
    rows = {r["question_id"]: r for r in results["records"] if r["method"] == "crashy"}
    assert rows[1]["error"] is None and rows[3]["error"] is None  # before and after the crash
    expected = "was killed by SIGILL (Illegal instruction)" if how == "SIGILL" else "exited with code 3"
    assert expected in rows[2]["error"] and "restarts for the next question" in rows[2]["error"]
    assert ("GGML_NATIVE=OFF" in rows[2]["error"]) == (how == "SIGILL")  # how to rebuild, for SIGILL
    assert crashy.read_text().count("start") == 2  # the first worker served warm-up and q1; a new one q3
    turn = rows[3]["turns"][0]
    assert turn["wall_time_s"] == fake_llamacpp_worker.WALL_TIME_S  # the child's own timing, not the pipe's
    assert turn["info"]["call_wall_time_s"] > 0 and turn["new_tokens"] == 5
    assert f"`crashy` on question 2: crashy: the llama.cpp worker process {expected}" in (out / "report.md").read_text()


def test_a_worker_that_always_dies_is_given_up_after_max_crashes(tmp_path, capsys, tiny_model, crashy):
    CrashyPeer.settings.update(die_on_load=True, die_with="SIGSEGV")
    qfile = write_questions(tmp_path / "q.jsonl", CRASH_QUESTIONS)
    out = tmp_path / "out"
    code, captured = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "5", "--methods", "ar,crashy",
                               "--opt", "crashy.max_crashes=2", "--out", str(out))
    assert code == 0, captured.err
    results = json.loads((out / "results.json").read_text())
    errors = [r["error"] for r in results["records"] if r["method"] == "crashy"]
    assert len(errors) == 3 and all(errors)
    # prepare and warm-up used up the two starts; every question is then refused without a new child
    assert crashy.read_text().count("start") == 2
    assert all("not restarted after 2 failures in a row" in e and "SIGSEGV" in e for e in errors)
    assert all(r["error"] is None for r in results["records"] if r["method"] == "ar")


def test_prompt_lookup_steps_follow_the_draft_calls():
    # prompt of 20 tokens; llama.cpp called the draft model at contexts 21 (after the prefill's token),
    # 22 and 30; we stopped after 11 new tokens (context 31)
    draft = llamacpp_worker._RecordedDraft(lambda ids: ids)
    draft.calls = [(21, 0), (22, 10), (30, 10)]
    steps = draft.steps(prompt_len=20, new_tokens=11)
    assert steps == dict(forward_passes=4, draft_lengths=[0, 0, 10, 10], accepted_lengths=[0, 0, 7, 0],
                         accepted_per_step=[1, 1, 8, 1])


@pytest.mark.slow
def test_llamacpp_peers_on_the_real_gguf():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    import paradecode
    from paradecode.benchmark.llamacpp import LlamaCppPromptLookup
    from paradecode.drafters.base import build_options

    model = paradecode.load("smollm2-135m")
    prompt = model.encode("Repeat this sentence exactly twice: the quick brown fox jumps over the lazy dog.")
    long_prompt = model.encode("Summarize: " + "The river rose after the storm and the town moved uphill. " * 50)
    assert len(long_prompt) > 600  # past llama.cpp's batch of 512 tokens
    ar = model.generate(prompt, max_new_tokens=32).token_ids
    runs = {}
    for cls in (LlamaCpp, LlamaCppPromptLookup):
        peer = cls(build_options(cls, {}), model)
        peer.prepare()
        try:
            runs[cls.method_name] = peer.generate(prompt, 32)
            assert len(peer.generate(long_prompt, 8).token_ids) > 0  # a long context works too
        finally:
            peer.close()
    assert peer.worker is None  # closed
    for name, run in runs.items():
        assert run.token_ids[:16] == ar[:16], name  # llama.cpp's own kernels: compare the first tokens
        assert 0 < run.wall_time_s and sum(run.accepted_per_step) == len(run.token_ids)
        assert run.forward_passes == len(run.draft_lengths) == len(run.accepted_per_step)
    pld = runs["llamacpp-pld"]
    assert pld.forward_passes < len(pld.token_ids) and max(pld.accepted_lengths) > 1  # the repeat was drafted


def test_the_llamacpp_worker_can_run_on_another_python(tmp_path):
    """``--opt llamacpp.python=PATH`` runs the worker on another environment's interpreter (e.g. a llama.cpp
    built for this CPU beside the portable build); a path that is no interpreter is a clear error."""
    from paradecode.drafters.base import build_options

    other = tmp_path / "python"
    other.symlink_to(sys.executable)
    peer = LlamaCpp(build_options(LlamaCpp, {"python": str(other)}), model=None)
    assert peer.worker_command()[0] == str(other)
    assert LlamaCpp(build_options(LlamaCpp, {}), model=None).worker_command()[0] == sys.executable
    with pytest.raises(ParadecodeError, match="not an executable file"):
        LlamaCpp(build_options(LlamaCpp, {"python": str(tmp_path / "missing")}), model=None)
