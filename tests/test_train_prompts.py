"""The built-in training prompt sets: distinct, reproducible, shaped like the tasks they stand for, sharing no
text with the benchmark's questions; ``train-draft`` reads several sources with one count each, and refuses bad
counts with a clear message before any model is loaded.
"""

import json

import pytest

from paradecode.cli import main
from paradecode.training.prompts import builtin_prompts, read_prompts
from paradecode.training.task_prompts import KINDS, task_prompts


def test_task_prompts_are_distinct_reproducible_and_cover_every_kind():
    prompts = task_prompts(900)
    assert len(prompts) == len(set(prompts)) == 900
    assert prompts == task_prompts(900) and prompts[:50] == task_prompts(50)
    assert prompts != task_prompts(900, seed=1)
    starts = ("Summarize", "Translate", "Extract", "Write a", "Context:")
    for start in starts:
        assert any(p.startswith(start) for p in prompts), start
    assert len(KINDS) >= 8


def test_prompt_sets_share_no_sentence_with_the_benchmark_questions():
    from paradecode.benchmark.questions import default_questions_path, load_questions

    questions = [turn for q in load_questions(default_questions_path()) for turn in q.turns]
    ours = set(task_prompts(600)) | set(builtin_prompts(600))
    benchmark = " ".join(questions)
    sentences = {s.strip() for p in ours for s in p.replace("\n", " ").split(". ") if len(s.strip()) > 30}
    assert sentences and not [s for s in sentences if s in benchmark]


def test_read_prompts_knows_both_builtin_sets():
    assert read_prompts("builtin-tasks", 7) == task_prompts(7)
    assert read_prompts("builtin", 7) == builtin_prompts(7)


@pytest.mark.parametrize("counts, message", [("10,20,30", "gives 3 counts for 2 prompt sources"),
                                             ("ten", "must be a count"), ("0", "must be >= 1")])
def test_train_draft_refuses_bad_prompt_counts(tmp_path, capsys, counts, message):
    code = main(["train-draft", "--kind", "eagle", "--prompts", "builtin,builtin-tasks", "--num-prompts", counts,
                 "--out", str(tmp_path / "head")])
    assert code == 2 and message in capsys.readouterr().err


def test_train_draft_reads_a_prompt_file_beside_a_builtin_set(tmp_path, capsys):
    bad = tmp_path / "mine.jsonl"
    bad.write_text(json.dumps({"prompt": "Hello"}) + "\n" + "{oops\n")
    code = main(["train-draft", "--kind", "medusa", "--prompts", f"builtin,{bad}", "--num-prompts", "4,4",
                 "--out", str(tmp_path / "head")])
    assert code == 2 and "mine.jsonl line 2" in capsys.readouterr().err
