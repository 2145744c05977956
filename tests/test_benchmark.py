"""The benchmark: metrics on hand-built records (known tau, speedups, acceptance by position), the lossless
check, question files and CLI errors, and whole runs on a tiny random Llama (our engine and transformers on
the same weights): outputs, Spec-Bench answer files, two-turn prompts, interruption and --resume.
"""

import json
from dataclasses import dataclass

import pytest

from paradecode.api import Model
from paradecode.benchmark import commands, metrics, peers, questions, runner
from paradecode.benchmark.peers import Peer, PeerRun
from paradecode.backends.int8_llama import Int8LlamaBackend
from paradecode.backends.llama import LlamaBackend
from paradecode.cli import main
from paradecode.errors import ParadecodeError
from tiny import tiny_llama


# -- hand-built records --------------------------------------------------------------------------------------
def turn(tokens, wall, forwards=None, drafts=None, accepts=None, per_step=None, ids=None):
    return dict(token_ids=ids if ids is not None else list(range(tokens)), new_tokens=tokens, wall_time_s=wall,
                forward_passes=forwards, draft_lengths=drafts, accepted_lengths=accepts, accepted_per_step=per_step,
                text="x")


def record(method, qid, category, *turns, error=None):
    return dict(method=method, question_id=qid, category=category, turns=list(turns), error=error, tstamp=1.0)


RECORDS = [
    # ar: 1 token per forward; 10 tok/s on q1, 20 tok/s on q2
    record("ar", 1, "math", turn(10, 1.0, 10, [0] * 10, [0] * 10, [1] * 10)),
    record("ar", 2, "code", turn(20, 1.0, 20, [0] * 20, [0] * 20, [1] * 20)),
    # pld: q1 at 20 tok/s in 5 forwards (tau 2), q2 at 40 tok/s in 8 forwards (tau 2.5)
    record("pld", 1, "math", turn(10, 0.5, 5, [3, 3, 2, 0, 2], [3, 1, 0, 0, 2], [4, 2, 1, 1, 2])),
    record("pld", 2, "code", turn(20, 0.5, 8, [4] * 8, [2, 2, 2, 2, 1, 1, 1, 1], [3, 3, 3, 3, 2, 2, 2, 2])),
    # a peer whose forward passes are unknown, and an errored record that must be ignored
    record("hf", 1, "math", turn(10, 2.0)),
    record("hf", 2, "code", turn(20, 2.0)),
    record("pld", 3, "code", error="prompt too long"),
]


def test_acceptance_by_position_counts_only_steps_that_drafted_that_far():
    rates = metrics.acceptance_by_position([3, 3, 2, 0], [3, 1, 0, 0])
    assert rates == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    assert metrics.acceptance_by_position([0, 0], [0, 0]) == []


def test_summary_on_hand_built_records_gives_known_figures():
    summary = metrics.summarize(RECORDS)
    ar, pld, hf = (summary["overall"][m] for m in ("ar", "pld", "hf"))
    assert ar["tokens_per_s"] == pytest.approx(15.0)  # mean of 10 and 20
    assert pld["tokens_per_s"] == pytest.approx(30.0)
    assert hf["tokens_per_s"] == pytest.approx(7.5)
    assert pld["speedup_vs_ar"] == pytest.approx(2.0)
    assert pld["wall_ratio_vs_ar"] == pytest.approx(2.0)  # 2 s / 1 s
    assert pld["speedup_vs_hf"] == pytest.approx(4.0)
    assert ar["speedup_vs_ar"] == pytest.approx(1.0)
    assert pld["mean_accepted"] == pytest.approx(30 / 13)
    assert pld["forwards_per_token"] == pytest.approx(13 / 30)
    assert ar["mean_accepted"] == 1.0
    assert hf["mean_accepted"] is None and hf["acceptance_by_position"] is None  # unknown stays unknown
    assert pld["questions"] == 2  # the errored record is left out
    # q1 steps drafted [3,3,2,0,2] accepted [3,1,0,0,2]; q2 drafted 4 x8 accepted [2,2,2,2,1,1,1,1]
    assert pld["acceptance_by_position"] == pytest.approx([11 / 12, 6 / 12, 1 / 10, 0 / 8])
    math = summary["math"]
    assert math["pld"]["speedup_vs_ar"] == pytest.approx(2.0)
    assert math["pld"]["mean_accepted"] == pytest.approx(2.0)
    assert summary["code"]["pld"]["mean_accepted"] == pytest.approx(2.5)


def test_speedup_uses_only_questions_both_methods_ran():
    partial = [r for r in RECORDS if not (r["method"] == "ar" and r["question_id"] == 2)]
    pld = metrics.summarize(partial)["overall"]["pld"]
    assert pld["speedup_vs_ar"] == pytest.approx(2.0)  # q1 only: 20 / 10


def test_lossless_check_finds_a_deliberately_different_output():
    records = [
        record("ar", 1, "math", turn(6, 1.0, ids=[5, 6, 7, 8, 9, 10])),
        record("ar", 2, "code", turn(3, 1.0, ids=[1, 2, 3]), turn(2, 1.0, ids=[4, 4])),
        record("pld", 1, "math", turn(6, 1.0, ids=[5, 6, 7, 8, 9, 10])),
        record("pld", 2, "code", turn(3, 1.0, ids=[1, 2, 3]), turn(2, 1.0, ids=[4, 4])),
        record("bad", 1, "math", turn(6, 1.0, ids=[5, 6, 7, 0, 9, 10])),  # differs at token 3
        record("bad", 2, "code", turn(3, 1.0, ids=[1, 2, 3]), turn(3, 1.0, ids=[4, 4, 4])),  # longer 2nd turn
    ]
    check = metrics.lossless_check(records, "ar")
    assert check["pld"] == dict(identical=2, compared=2, share=1.0, differences=[])
    assert check["bad"]["identical"] == 0 and check["bad"]["share"] == 0.0
    assert check["bad"]["differences"] == [
        dict(question_id=1, category="math", turn=0, position=3),
        dict(question_id=2, category="code", turn=1, position=2),
    ]
    assert metrics.first_difference([1, 2], [1, 2]) is None


# -- question files ------------------------------------------------------------------------------------------
def write_questions(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


QUESTIONS = [
    dict(question_id=1, category="writing", turns=["Write a poem about the sea.", "Now make it rhyme."]),
    dict(question_id=2, category="writing", turns=["Write a letter.", "Shorter please."]),
    dict(question_id=3, category="coding", turns=["Write a sort function in Python."]),
    dict(question_id=4, category="coding", turns=["Explain recursion."]),
    dict(question_id=5, category="qa", turns=["What is the capital of France?"]),
]


def test_select_keeps_file_order_per_category(tmp_path):
    loaded = questions.load_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    assert [q.question_id for q in questions.select(loaded, 1)] == [1, 3, 5]
    assert [q.question_id for q in questions.select(loaded, None, ["coding"])] == [3, 4]
    with pytest.raises(ParadecodeError, match="no questions in category"):
        questions.select(loaded, 1, ["poetry"])
    for bad in ("0", "-2", "x"):
        with pytest.raises(ParadecodeError, match="per-category"):
            questions.parse_per_category(bad)
    assert questions.parse_per_category("all") is None


def test_a_line_separator_inside_a_question_stays_in_it(tmp_path):
    """U+2028 and U+0085 may stand unescaped in a JSON string (json.dumps(..., ensure_ascii=False)); the file
    is split at newlines only (str.splitlines would cut the line in two); Windows line ends are fine too."""
    row = json.dumps(dict(question_id=7, category="qa", turns=["one\u2028two\x85three"]), ensure_ascii=False)
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\r\n" + row + "\r\n", newline="")
    loaded = questions.load_questions(path)
    assert [q.question_id for q in loaded] == [1, 7] and loaded[1].turns == ("one\u2028two\x85three",)


@pytest.mark.parametrize("line,message", [
    ('{"question_id": 9, "category": "qa", "turns": ["ok"]', "line 3 is not valid JSON"),
    ('[1, 2]', "line 3 is not a JSON object"),
    ('{"question_id": 9, "category": "qa"}', "line 3 lacks turns"),
    ('{"question_id": 9, "category": "qa", "turns": []}', "line 3: turns must be"),
    ('{"question_id": 1, "category": "qa", "turns": ["dup"]}', "line 3: question_id 1 appears twice"),
])
def test_malformed_questions_name_the_line(tmp_path, line, message):
    path = write_questions(tmp_path / "q.jsonl", QUESTIONS[:2] + [line])
    with pytest.raises(ParadecodeError, match=message):
        questions.load_questions(path)


# -- CLI errors (all raised before any model loads) ----------------------------------------------------------
def bench_cli(capsys, *args):
    code = main(["bench", "--no-progress", *args])
    return code, capsys.readouterr()


@pytest.mark.parametrize("args,message", [
    (["--questions", "/nonexistent/q.jsonl"], "does not exist"),
    (["--methods", "ar,warp-drive"], "unknown method 'warp-drive'"),
    (["--methods", "ar,pld,ar"], "listed twice"),
    (["--methods", "ar", "--opt", "num_draft=4"], "METHOD.key=value"),
    (["--methods", "ar", "--opt", "pld.num_draft=4"], "not in --methods"),
    (["--methods", "pld", "--opt", "pld.bogus=1"], "has no option bogus"),
    (["--methods", "hf-draft"], "needs a draft model"),
    (["--per-category", "0"], "per-category"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
])
def test_cli_user_errors_exit_2_without_traceback(tmp_path, capsys, args, message):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    code, out = bench_cli(capsys, "--questions", str(qfile), "--out", str(tmp_path / "out"), *args)
    assert code == 2
    assert message in out.err and "Traceback" not in out.err


def test_cli_malformed_questions_file_exit_2(tmp_path, capsys):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:1] + ["{oops"])
    code, out = bench_cli(capsys, "--questions", str(qfile), "--methods", "ar", "--out", str(tmp_path / "o"))
    assert code == 2 and "line 2 is not valid JSON" in out.err


# -- whole runs on a tiny model ------------------------------------------------------------------------------
class TinyTokenizer:
    """Characters -> ids in [3, 43); ids print as 'tN '. Chat turns are wrapped in role tokens 1 / 2."""

    chat_template = "tiny"
    eos_token_id = None

    def encode(self, text):
        return [3 + ord(c) % 40 for c in text][:24]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"t{int(t)} " for t in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        ids = []
        for message in messages:
            ids += [1 if message["role"] == "user" else 2] + self.encode(message["content"])
        return ids + [2] if add_generation_prompt else ids

    def get_vocab(self):
        return {f"t{i}": i for i in range(48)}


@pytest.fixture
def tiny_model(tmp_path, monkeypatch):
    hf = tiny_llama(3, sharp=4.0)
    model = Model(LlamaBackend.from_hf(hf), TinyTokenizer(), name="tiny", model_dir=tmp_path / "m", chat=True)
    model._hf_model = hf  # transformers peers run on the very same weights
    monkeypatch.setattr(commands, "load_model", lambda args: model)
    return model


@dataclass(frozen=True)
class FakePeerOptions:
    corrupt: bool = False  # change one output token: a deliberately non-lossless peer
    fail_at: int = 0  # raise KeyboardInterrupt on this call (1-based; 0: never)


class FakePeer(Peer):
    """Greedy ar through the model, optionally corrupted or interrupted; counts its calls."""

    Options = FakePeerOptions
    calls = 0

    def generate(self, prompt_ids, max_new_tokens):
        FakePeer.calls += 1
        if FakePeer.calls == self.options.fail_at:
            raise KeyboardInterrupt
        ids = list(self.model.generate(prompt_ids, max_new_tokens=max_new_tokens).token_ids)
        if self.options.corrupt and len(ids) > 3:
            ids[3] = (ids[3] + 1) % 48
        return PeerRun(ids, forward_passes=None)


@pytest.fixture
def fake_peer(monkeypatch):
    FakePeer.calls = 0
    monkeypatch.setitem(peers.PEERS, "fake", FakePeer)
    FakePeer.method_name = "fake"


def test_bench_run_writes_every_output(tmp_path, capsys, tiny_model, fake_peer):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    out = tmp_path / "out"
    code, _ = bench_cli(capsys, "--questions", str(qfile), "--per-category", "2", "--max-new-tokens", "12",
                        "--methods", "ar,pld,hf,hf-pld,fake", "--opt", "fake.corrupt=true",
                        "--opt", "pld.num_draft=4", "--out", str(out))
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and len(results["records"]) == 5 * 5
    assert results["settings"]["options"]["pld"] == {"num_draft": 4}
    assert results["machine"]["cpu_count"] and results["versions"]["torch"]
    from paradecode.profile import cpu_name

    machine = results["machine"]  # every speed table names the CPU and the flags that chose its kernels
    assert machine["cpu"] == cpu_name() and isinstance(machine["isa"], list)
    assert f"- machine: {machine['cpu']} (ISA: " in (out / "report.md").read_text()
    order = [(r["question_id"], r["method"]) for r in results["records"]]
    assert order[:5] == [(1, m) for m in ("ar", "pld", "hf", "hf-pld", "fake")]  # interleaved per question
    assert [qid for qid, _ in order[::5]] == [1, 3, 5, 2, 4]  # one question of every category per round
    by = {(r["method"], r["question_id"]): r["turns"][0] for r in results["records"]}
    for qid in range(1, 6):
        assert len(by["ar", qid]["token_ids"]) == 12
        assert by["hf", qid]["forward_passes"] == 12  # greedy transformers: one forward per token
        hf_pld = by["hf-pld", qid]
        assert sum(hf_pld["accepted_per_step"]) == 12 == hf_pld["forward_passes"] + sum(hf_pld["accepted_lengths"])
    lossless = results["lossless"]
    assert lossless["pld"]["share"] == 1.0  # our engine is lossless
    assert lossless["fake"]["share"] == 0.0 and lossless["fake"]["differences"][0]["position"] == 3
    report = (out / "report.md").read_text()
    assert "## Overall" in report and "## Per category" in report and "first difference at token 3" in report
    assert (out / "speedup_by_category.png").stat().st_size > 1000
    assert (out / "accepted_per_step.png").stat().st_size > 1000

    lines = [json.loads(x) for x in (out / "model_answer" / "pld.jsonl").read_text().splitlines()]
    assert [a["question_id"] for a in lines] == [1, 2, 3, 4, 5]
    answer = lines[0]
    assert set(answer) == {"question_id", "category", "answer_id", "model_id", "tstamp", "choices"}
    choice = answer["choices"][0]
    assert set(choice) == {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}
    assert choice["index"] == 0 and choice["new_tokens"] == [12] and len(choice["turns"]) == 1
    assert sum(choice["accept_lengths"]) == 12 and choice["decoding_steps"] == [len(choice["accept_lengths"])]
    fake = json.loads((out / "model_answer" / "fake.jsonl").read_text().splitlines()[0])
    assert fake["choices"][0]["decoding_steps"] == [None] and fake["choices"][0]["accept_lengths"] == []


def test_second_turn_holds_the_models_own_first_answer(tmp_path, capsys, tiny_model):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:1])
    out = tmp_path / "out"
    code, _ = bench_cli(capsys, "--questions", str(qfile), "--turns", "all", "--max-new-tokens", "6",
                        "--methods", "ar,pld", "--out", str(out))
    assert code == 0
    rec = json.loads((out / "results.json").read_text())["records"][0]
    first, second = rec["turns"]
    q1, q2 = QUESTIONS[0]["turns"]
    tok = TinyTokenizer()
    expected = tok.apply_chat_template([dict(role="user", content=q1), dict(role="assistant", content=first["text"]),
                                        dict(role="user", content=q2)])
    assert second["prompt_tokens"] == len(expected)
    prompt = runner.build_prompt(tiny_model, [q1, q2], [first["text"]])
    assert prompt == expected


def test_encode_takes_text_conversations_and_ids(tiny_model):
    tok = TinyTokenizer()
    conversation = [dict(role="user", content="hi"), dict(role="assistant", content="yo"),
                    dict(role="user", content="?")]
    expected = tok.apply_chat_template(conversation)
    assert tiny_model.encode(conversation) == tiny_model.encode_chat(conversation) == expected
    assert tiny_model.encode("hi") == tok.apply_chat_template(conversation[:1])
    assert tiny_model.encode("hi", chat=False) == tok.encode("hi")
    assert tiny_model.encode([5, 6]) == [5, 6]
    assert tiny_model.generate(conversation, max_new_tokens=3).prompt_token_ids == expected
    for bad, message in (([], "conversation is empty"), ([dict(role="user")], "message 0"),
                         ([dict(role="user", content="a"), "b"], "message 1")):
        with pytest.raises(ParadecodeError, match=message):
            tiny_model.encode_chat(bad)


def test_interrupted_run_leaves_partial_results_and_resume_finishes_it(tmp_path, capsys, tiny_model, fake_peer):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    out = tmp_path / "out"
    common = ["--questions", str(qfile), "--max-new-tokens", "8", "--methods", "ar,fake", "--out", str(out)]
    # call 1 is the warm-up; calls 2 and 3 answer questions 1 and 3; call 4 (question 5) is interrupted
    code, err = bench_cli(capsys, *common, "--opt", "fake.fail_at=4")
    assert code == 130 and "interrupted" in err.err
    partial = json.loads((out / "results.json").read_text())
    assert not partial["complete"]
    assert sorted((r["method"], r["question_id"]) for r in partial["records"]) == [
        ("ar", 1), ("ar", 3), ("ar", 5), ("fake", 1), ("fake", 3)]
    assert "Partial run" in (out / "report.md").read_text()
    stamps = {(r["method"], r["question_id"]): r["tstamp"] for r in partial["records"]}
    with (out / "records.jsonl").open("a") as log:
        log.write('{"method": "ar", "question_id": 5, "categ')  # a record torn by a hard kill

    code, _ = bench_cli(capsys, *common, "--opt", "fake.fail_at=4", "--resume")
    assert code == 0
    assert FakePeer.calls == 4 + 2  # a warm-up and question 5 only (fail_at counts from the first run)
    final = json.loads((out / "results.json").read_text())
    assert final["complete"] and len(final["records"]) == 6
    for r in final["records"]:
        if (r["method"], r["question_id"]) in stamps:
            assert r["tstamp"] == stamps[r["method"], r["question_id"]]  # not redone

    code, out_err = bench_cli(capsys, *common[:-4], "--methods", "ar", "--max-new-tokens", "9", "--out", str(out),
                              "--resume")
    assert code == 2 and "other settings" in out_err.err


def test_resume_with_fewer_questions_reports_that_subset_without_running(tmp_path, capsys, tiny_model, fake_peer):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    out = tmp_path / "out"
    common = ["--questions", str(qfile), "--max-new-tokens", "8", "--methods", "ar,fake", "--out", str(out)]
    assert bench_cli(capsys, *common, "--per-category", "2")[0] == 0
    calls, full = FakePeer.calls, json.loads((out / "results.json").read_text())
    assert bench_cli(capsys, *common, "--per-category", "1", "--resume")[0] == 0
    assert FakePeer.calls == calls  # nothing run again, not even the warm-up
    subset = json.loads((out / "results.json").read_text())
    assert sorted({r["question_id"] for r in subset["records"]}) == [1, 3, 5]
    assert subset["complete"] and subset["questions"]["selected"] == 3
    stamps = {(r["method"], r["question_id"]): r["tstamp"] for r in full["records"]}
    assert all(stamps[r["method"], r["question_id"]] == r["tstamp"] for r in subset["records"])


def test_hf_draft_counts_target_and_draft_forward_passes(tmp_path, capsys, tiny_model):
    tiny_model.hf_model.save_pretrained(tmp_path / "draft")  # the target as its own draft: all accepted
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[2:3])
    out = tmp_path / "out"
    code, _ = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "12", "--methods", "ar,hf-draft",
                        "--draft-model", str(tmp_path / "draft"), "--out", str(out))
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    run = next(r for r in results["records"] if r["method"] == "hf-draft")["turns"][0]
    assert results["lossless"]["hf-draft"]["share"] == 1.0
    assert run["accepted_per_step"][:2] == [5, 5] and run["forward_passes"] == len(run["accepted_per_step"])
    assert run["draft_lengths"][:2] == [4, 4] and run["draft_forward_passes"] >= 8
    assert results["summary"]["overall"]["hf-draft"]["acceptance_by_position"][:4] == [1.0, 1.0, 1.0, 1.0]


def test_unavailable_peer_is_skipped_with_a_note(tmp_path, capsys, tiny_model, monkeypatch):
    monkeypatch.setattr(peers.PEERS["llamacpp"], "unavailable", classmethod(lambda cls, model: "not here"))
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[2:3])
    out = tmp_path / "out"
    code, captured = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "4",
                               "--methods", "ar,llamacpp", "--out", str(out))
    assert code == 0 and "skipping llamacpp: not here" in captured.err
    results = json.loads((out / "results.json").read_text())
    assert results["skipped"] == {"llamacpp": "not here"} and results["methods"] == ["ar"]


def test_variants_compare_option_sets_of_one_method(tmp_path, capsys, tiny_model):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:2])
    out = tmp_path / "out"
    code, _ = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "10", "--methods", "ar,pld,pld1=pld",
                        "--opt", "pld1.num_draft=1", "--opt", "pld1.schedule=fixed", "--out", str(out))
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["variants"] == {"pld1": "pld"}
    assert results["settings"]["options"] == {"pld1": {"num_draft": 1, "schedule": "fixed"}}
    variant = [r["turns"][0] for r in results["records"] if r["method"] == "pld1"]
    assert variant and all(n <= 1 for t in variant for n in t["draft_lengths"])  # its own options, not pld's
    assert results["lossless"]["pld1"]["share"] == 1.0
    assert "`pld1` = `pld` with num_draft=1, schedule=fixed" in (out / "report.md").read_text()
    assert (out / "model_answer" / "pld1.jsonl").is_file()


def test_a_dtype_variant_runs_on_its_own_copy_of_the_model(tmp_path, capsys, monkeypatch):
    hf = tiny_llama(3, sharp=4.0)
    calibration = [list(range(1, 40))]
    by_dtype = {dtype: Model(LlamaBackend.from_hf(hf) if dtype == "fp32" else
                             Int8LlamaBackend.from_hf(hf, calibration=calibration),
                             TinyTokenizer(), name="tiny", model_dir=tmp_path / "m", chat=True)
                for dtype in ("fp32", "int8")}
    monkeypatch.setattr(commands, "load_model", lambda args, dtype=None: by_dtype[dtype or args.dtype])
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:2])
    out = tmp_path / "out"
    code, streams = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "10", "--dtype", "int8",
                              "--methods", "ar,pld,ar-fp32=ar", "--opt", "ar-fp32.dtype=fp32", "--out", str(out))
    assert code == 0, streams.err
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["dtype"] == "int8"
    assert results["settings"]["variant_dtypes"] == {"ar-fp32": "fp32"}
    assert "`ar-fp32` = `ar` on a fp32 copy of the model" in (out / "report.md").read_text()
    assert results["lossless"]["pld"]["share"] == 1.0  # pld on int8 equals ar on int8
    answers = {r["method"]: r["turns"][0]["token_ids"] for r in results["records"] if r["question_id"] == 1}
    assert set(answers) == {"ar", "pld", "ar-fp32"}
    for label, dtype in [("ar", "int8"), ("ar-fp32", "fp32")]:  # each ran on its own model
        assert answers[label] == by_dtype[dtype].generate(QUESTIONS[0]["turns"][0], max_new_tokens=10).token_ids
    code, streams = bench_cli(capsys, "--questions", str(qfile), "--methods", "ar,x=llamacpp",
                              "--opt", "x.dtype=fp32", "--out", str(tmp_path / "o2"))
    assert code == 2 and "peers run their own weights" in streams.err


@pytest.mark.parametrize("methods, message", [
    ("pld,pld", "listed twice"), ("ar=pld", "is itself a method"), ("x=nope", "unknown method 'nope'"),
    ("=pld", "LABEL=METHOD"), ("a.b=pld", "may not contain"),
])
def test_bad_variants_exit_2(tmp_path, capsys, methods, message):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:1])
    code, out = bench_cli(capsys, "--questions", str(qfile), "--methods", methods, "--out", str(tmp_path / "o"))
    assert code == 2 and message in out.err


def test_methods_all_takes_whatever_is_registered():
    from paradecode.registry import method_names

    names = runner.all_methods(None)
    assert "draft" not in names  # needs --draft-model
    runnable = [m for m in method_names() if m in names]
    assert names == runnable + [p for p in peers.PEERS if p != "hf-draft"]
    assert "ar" in names and "pld" in names
    assert "hf-draft" in runner.all_methods("some-draft") and "draft" in runner.all_methods("some-draft")


@pytest.mark.slow
def test_real_model_bench(tmp_path, capsys):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[2:3])
    out = tmp_path / "out"
    code, _ = bench_cli(capsys, "--questions", str(qfile), "--max-new-tokens", "16", "--methods", "ar,pld,hf",
                        "--out", str(out))
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["lossless"]["pld"]["share"] == 1.0
