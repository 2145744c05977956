"""The benchmark outside this workspace and with crash-prone peers: the shipped Spec-Bench questions are the
default from any working directory; a peer running in a child process that dies is a failed row, not a dead
benchmark."""

import json

from paradecode.benchmark import questions
from test_benchmark import bench_cli, tiny_model  # noqa: F401  (a fixture)


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
