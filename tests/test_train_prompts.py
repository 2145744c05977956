"""The built-in training prompt sets: distinct, reproducible, shaped like the tasks they stand for, sharing no
text with the benchmark's questions; ``train-draft`` reads several sources with one count each, and refuses bad
counts with a clear message before any model is loaded.
"""

import json

import pytest

from paradecode.errors import ParadecodeError
from paradecode.cli import main
from paradecode.training.prompts import builtin_prompts, mix_prompts, read_prompts
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


def test_a_folder_of_prompt_files_is_an_even_mix_without_repeats(tmp_path):
    """Water-filling: files smaller than their share give all their prompts, the rest share the remainder
    evenly; a prompt in two files counts once; the same seed gives the same mix; a line separator inside a
    JSON string (U+2028, which str.splitlines would split at) stays inside its prompt."""
    sizes = {"a": 3, "b": 50, "c": 80, "d": 200}
    for name, size in sizes.items():
        lines = [json.dumps({"prompt": f"{name} prompt {i}"}) for i in range(size)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "e.jsonl").write_text(json.dumps({"prompt": "a prompt 0"}) + "\n" +  # a repeat of a's first
                                      json.dumps({"prompt": "one\u2028line", "source": "x"}, ensure_ascii=False) + "\n")
    mix = mix_prompts(tmp_path, 100)
    assert len(mix) == len(set(mix)) == 100 and mix == read_prompts(str(tmp_path), 100)
    per_file = {name: sum(p.startswith(f"{name} prompt") for p in mix) for name in sizes}
    assert per_file["a"] == 3 and "one\u2028line" in mix  # the small files whole (e: its one new prompt)
    assert per_file["b"] == 32 and per_file["c"] == 32 and per_file["d"] == 32  # 96 shared out evenly
    assert mix_prompts(tmp_path, 100, seed=1) != mix
    everything = mix_prompts(tmp_path, 1000)
    assert len(everything) == len(set(everything)) == 3 + 50 + 80 + 200 + 1  # every prompt, once
    (tmp_path / "empty").mkdir()
    with pytest.raises(ParadecodeError, match="holds no .jsonl prompt files"):
        mix_prompts(tmp_path / "empty", 5)


def test_train_draft_reads_a_prompt_file_beside_a_builtin_set(tmp_path, capsys):
    bad = tmp_path / "mine.jsonl"
    bad.write_text(json.dumps({"prompt": "Hello"}) + "\n" + "{oops\n")
    code = main(["train-draft", "--kind", "medusa", "--prompts", f"builtin,{bad}", "--num-prompts", "4,4",
                 "--out", str(tmp_path / "head")])
    assert code == 2 and "mine.jsonl line 2" in capsys.readouterr().err


class _ListWriter:
    """Stands in for the model in make_prompts: continues the list with fixed items, one set per call."""

    def __init__(self, continuations):
        self.continuations, self.calls = continuations, []

    def generate(self, text, **kwargs):
        from types import SimpleNamespace

        self.calls.append((text, kwargs))
        return SimpleNamespace(text=self.continuations[(len(self.calls) - 1) % len(self.continuations)])


def test_make_prompts_keeps_new_request_like_items_and_resumes(tmp_path):
    from paradecode.training.self_prompts import make_prompts, parse_items

    assert parse_items("4. First one here?\n5. Second one here.\n\n6. after a blank") == ["First one here?",
                                                                                         "Second one here."]
    continuations = [
        " How do I grow tomatoes on a balcony?\n5. ok\n6. Write a letter to my future self.\nThe end",
        " Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences.",
        " How do I grow tomatoes on a balcony?\n5. Explain why the sky looks blue at noon.\n6. Name three rivers in Africa.",
        " What is 12 times 12, and why?\n5. Describe a quiet morning in a fishing village.",
    ]
    writer = _ListWriter(continuations)
    out = tmp_path / "self.jsonl"
    kept = make_prompts(writer, 4, out, log=lambda m: None)
    # "ok" is too short, the benchmark's own question is refused, the repeat is dropped, "The end" ends a list
    assert kept == ["How do I grow tomatoes on a balcony?", "Write a letter to my future self.",
                    "Explain why the sky looks blue at noon.", "Name three rivers in Africa."]
    text, options = writer.calls[0]
    assert text.startswith("Here are some requests") and text.endswith("\n4.") and options["chat"] is False
    assert writer.calls[0][1]["seed"] != writer.calls[1][1]["seed"]  # each call samples anew
    more = make_prompts(_ListWriter(continuations[3:]), 6, out, log=lambda m: None)  # resumes, then extends
    assert more == kept + ["What is 12 times 12, and why?", "Describe a quiet morning in a fishing village."]
    assert [json.loads(line)["prompt"] for line in out.read_text().splitlines()] == more
    assert read_prompts(str(out), 10) == more


@pytest.mark.parametrize("args, message", [(["--out", "p.txt"], "must name a .jsonl file"),
                                           (["--out", "p.jsonl", "--count", "0"], "--count and --threads")])
def test_make_prompts_refuses_bad_arguments_before_loading(tmp_path, capsys, args, message):
    assert main(["make-prompts", *args]) == 2 and message in capsys.readouterr().err


def test_make_prompts_refuses_a_file_it_did_not_write(tmp_path):
    from paradecode.errors import ParadecodeError
    from paradecode.training.self_prompts import make_prompts

    out = tmp_path / "other.jsonl"
    out.write_text(json.dumps({"prompt": "Hello there, how are you?"}) + "\n")  # no "call": not ours
    with pytest.raises(ParadecodeError, match="line 1 is not a make-prompts line"):
        make_prompts(_ListWriter([" Anything at all here?"]), 3, out, log=lambda m: None)
