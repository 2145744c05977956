"""Many requests in one forward (``backends.sequences``): every request's output is exactly its solo run,
whatever shares its passes (mixed methods, lengths, sampling with a seed, a request joining or cancelled
mid-batch); the passes really are shared; the cache budget is enforced and freed."""

import json
import os
import sys
import threading
import time

import pytest
import torch

import paradecode
from paradecode.backends import native
from paradecode.backends.base import Load
from paradecode.backends.sequences import CacheFull
from paradecode.errors import ParadecodeError
from tiny import PROMPTS, WORDS, run, tiny_int8_backend, tiny_model_dir

pytestmark = pytest.mark.skipif(native.load() is None, reason="the native int8 forward could not be built here")

# (method, options, temperature): greedy methods of every kind that runs on the target alone, and sampling
CASES = [("ar", {}, 0.0), ("pld", {}, 0.0), ("ngram", {}, 0.0), ("pld-tree", {}, 0.0), ("jacobi", {}, 0.0),
         ("lookahead", {}, 0.0), ("layerskip", {}, 0.0), ("auto", {"keep": False}, 0.0), ("ar", {}, 0.8),
         ("pld", {}, 0.8)]


@pytest.fixture(scope="module")
def backend():
    backend = tiny_int8_backend(3, sharp=4.0)
    assert backend._native is not None
    return backend


def solo(backend, method, options, temperature, prompt, max_new_tokens, seed):
    out, _ = run(backend, method, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                 **options)
    return out


def in_threads(batcher, jobs, *, stagger_s=0.0, together=False):
    """Run each job (method, options, temperature, prompt, max_new_tokens, seed) in its own thread on a sequence
    of the batcher; returns the outputs in order. ``together``: every thread has its sequence open before any
    decodes (on a busy machine threads started one after another may otherwise each run alone)."""
    results, errors = [None] * len(jobs), []
    opened = threading.Barrier(len(jobs)) if together else None

    def work(i, job):
        method, options, temperature, prompt, max_new, seed = job
        try:
            with batcher.open(len(prompt) + max_new + 64, wait=True) as sequence:
                if opened is not None:
                    opened.wait(60)
                results[i] = solo(sequence, method, options, temperature, prompt, max_new, seed)
        except BaseException as error:  # reported by the test
            errors.append(error)

    threads = []
    for i, job in enumerate(jobs):
        threads.append(threading.Thread(target=work, args=(i, job)))
        threads[-1].start()
        time.sleep(stagger_s)
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return results


def test_concurrent_requests_get_exactly_their_solo_outputs(backend):
    jobs = [(method, options, temperature, PROMPTS[i % len(PROMPTS)], 12 + 5 * (i % 3), i)
            for i, (method, options, temperature) in enumerate(CASES)]
    expected = [solo(backend, *job) for job in jobs]
    batcher = backend.batcher(8 << 20)
    assert in_threads(batcher, jobs, together=True) == expected
    # the passes were shared: fewer passes than the requests' steps, several sequences in most of them
    assert batcher.passes > 0 and max(batcher.sequences_histogram) >= 4
    assert batcher.pool.free == batcher.pool.pages and batcher.open_sequences == 0  # every page came back


def test_a_lone_request_runs_its_passes_on_its_own_thread_and_joins_batches_as_others_come(backend):
    """A sequence alone runs its passes itself (no hand-over to the batcher's thread); when others come it joins
    their batches, and when they are gone it runs alone again: the same tokens throughout."""
    batcher = backend.batcher(8 << 20)
    ran_on = []  # (thread, sequences) of each native forward
    stack = batcher._stack

    class Recording:
        def __getattr__(self, name):
            return getattr(stack, name)

        def forward(self, ids, positions, segments, *args):
            ran_on.append((threading.current_thread().name, len(segments)))
            return stack.forward(ids, positions, segments, *args)

    batcher._stack = Recording()
    job = ("pld", {}, 0.0, PROMPTS[0], 40, 0)
    assert in_threads(batcher, [job]) == [solo(backend, *job)]
    assert batcher._thread is None and ran_on and all(name != "paradecode-batcher" for name, _ in ran_on)
    ran_on.clear()
    first = ("ar", {}, 0.0, PROMPTS[0], 150, 0)
    others = [(m, o, t, PROMPTS[i % len(PROMPTS)], 8, i) for i, (m, o, t) in enumerate(CASES[1:4], 1)]
    outputs = []
    alone = threading.Thread(target=lambda: outputs.extend(in_threads(batcher, [first])))
    alone.start()
    while len(ran_on) < 3 and alone.is_alive():  # the first request runs alone for a few steps
        time.sleep(0.001)
    assert in_threads(batcher, others) == [solo(backend, *job) for job in others]
    alone.join(120)
    assert outputs == [solo(backend, *first)]
    shared = [i for i, (name, size) in enumerate(ran_on) if size > 1]
    assert shared and all(ran_on[i][0] == "paradecode-batcher" for i in shared)
    assert ran_on[-1] == (ran_on[-1][0], 1) and ran_on[-1][0] != "paradecode-batcher"  # alone again at the end
    assert batcher.pool.free == batcher.pool.pages


def test_sliding_window_layers_batch_exactly():
    """Each sequence's window is read from its own positions: requests on a tiny Gemma-3 (a sliding layer of 8
    slots with its own RoPE base, then a full layer), all longer than the window, get their solo outputs."""
    import transformers

    from paradecode.backends.int8_llama import Int8LlamaBackend

    config = transformers.Gemma3TextConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                           max_position_embeddings=256, sliding_window=8, tie_word_embeddings=False,
                                           layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0, 0.5)
        model.lm_head.weight.mul_(4.0)
    windowed = Int8LlamaBackend.from_hf(model, calibration=[list(range(1, 60))])
    assert windowed.shape.windows == (8, None) and windowed._native is not None
    jobs = [(method, options, temperature, PROMPTS[i % len(PROMPTS)], 24 + 4 * (i % 3), i)
            for i, (method, options, temperature) in enumerate(CASES[:7])]
    expected = [solo(windowed, *job) for job in jobs]
    batcher = windowed.batcher(8 << 20)
    assert in_threads(batcher, jobs, together=True) == expected
    assert max(batcher.sequences_histogram) >= 3


def test_requests_joining_mid_batch_and_a_long_prompt_in_chunks_leave_the_others_unchanged(backend):
    long_prompt = [(7 * i + 3) % 48 for i in range(150)]  # prefilled in chunks of 16 alongside the others
    jobs = [("pld", {}, 0.0, PROMPTS[0], 40, 0), ("ar", {}, 0.8, PROMPTS[2], 40, 5),
            ("ngram", {}, 0.0, long_prompt, 20, 0), ("jacobi", {}, 0.0, PROMPTS[4], 30, 0)]
    expected = [solo(backend, *job) for job in jobs]
    batcher = backend.batcher(8 << 20, prefill_chunk=16)
    assert in_threads(batcher, jobs, stagger_s=0.01) == expected


def test_a_cancelled_request_leaves_the_others_unchanged_and_frees_its_pages(backend):
    batcher = backend.batcher(8 << 20)
    keep = ("pld-tree", {}, 0.0, PROMPTS[1], 40, 0)
    expected = solo(backend, *keep)
    from paradecode.config import GenerationConfig
    from paradecode.engine import decode
    from paradecode.registry import get_method

    sequence = batcher.open(200)
    steps = decode(sequence, get_method("ar").create({}), PROMPTS[4], GenerationConfig(max_new_tokens=100))
    next(steps)  # the cancelled request has started: its prefill and first step ran
    result = []
    other = threading.Thread(target=lambda: result.append(in_threads(batcher, [keep])[0]))
    other.start()
    next(steps)
    steps.close()  # cancelled mid-batch (the server closes the stream the same way)
    sequence.close()
    other.join(60)
    assert result == [expected]
    assert batcher.pool.free == batcher.pool.pages


def test_the_cache_budget_is_enforced_never_shared(backend):
    batcher = backend.batcher(backend.slot_bytes * 3 * 64)  # three pages of 64 slots
    assert batcher.pool.pages == 3
    first = batcher.open(100)  # two pages
    with pytest.raises(CacheFull, match="free slots"):
        batcher.open(100)
    with pytest.raises(ParadecodeError, match="whole cache holds 192"):
        batcher.open(300)  # the model's 256 positions need four pages
    second = batcher.open(60)  # the last page
    assert not set(first.pages) & set(second.pages)
    # a request that waits for room gets it as soon as a running one closes
    threading.Timer(0.2, first.close).start()
    started = time.perf_counter()
    third = batcher.open(100, wait=True, timeout_s=10)
    assert time.perf_counter() - started >= 0.15 and len(third.pages) == 2
    with pytest.raises(CacheFull):
        batcher.open(100, wait=True, timeout_s=0.05)
    second.close(), third.close(), third.close()
    assert batcher.pool.free == 3


class FailingOnce:
    """The batcher's native forward, failing its first call (as a forward that raises would)."""

    def __init__(self, inner) -> None:
        self.inner, self.failed = inner, False

    def forward(self, *args):
        if not self.failed:
            self.failed = True
            raise RuntimeError("the forward failed")
        return self.inner.forward(*args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_failed_pass_fails_its_requests_and_the_batcher_serves_the_next(backend):
    batcher = backend.batcher(8 << 20)
    batcher._stack = FailingOnce(batcher._stack)
    job = ("pld", {}, 0.0, PROMPTS[0], 20, 0)
    with pytest.raises(RuntimeError, match="the forward failed"):
        with batcher.open(100) as sequence:
            solo(sequence, *job)
    assert batcher.pool.free == batcher.pool.pages
    assert in_threads(batcher, [job, ("ar", {}, 0.8, PROMPTS[2], 20, 1)]) == [solo(backend, *job),
                                                                             solo(backend, "ar", {}, 0.8, PROMPTS[2],
                                                                                  20, 1)]


def test_a_sequence_refuses_passes_past_its_room(backend):
    batcher = backend.batcher(8 << 20)
    with batcher.open(64) as sequence:
        with pytest.raises(ValueError, match="do not fit"):
            sequence.forward(torch.arange(65) % 40)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return paradecode.load(str(tiny_model_dir(tmp_path_factory.mktemp("tiny-batch"))), dtype="int8")


def test_generate_batch_equals_generate_for_each_request(model):
    prompts = ["w3 w4 w5 w3 w4 w5 w3 w4", "w7 w8 w9 w7 w8", "w10 w11 w12 w13 w14 w10 w11", "w20"]
    requests = [dict(prompt=p, method=m, temperature=t, seed=s, max_new_tokens=n)
                for p, (m, t, s, n) in zip(prompts * 2, [("pld", 0, None, 20), ("ngram", 0, None, 15),
                                                         ("ar", 0.9, 3, 18), ("pld-tree", 0, None, 12),
                                                         ("jacobi", 0, None, 20), ("ar", 0.9, 4, 10),
                                                         ("lookahead", 0, None, 16), ("layerskip", 0, None, 14)])]
    expected = [model.generate(r["prompt"], **{k: v for k, v in r.items() if k != "prompt"}) for r in requests]
    seen = []
    results = model.generate_batch(requests, max_batch=8, progress=lambda done, total: seen.append((done, total)))
    assert [r.token_ids for r in results] == [e.token_ids for e in expected]
    assert [r.text for r in results] == [e.text for e in expected]
    assert seen[-1] == (8, 8) and len(seen) == 8
    assert model.batcher().passes > 0 and model.batcher().open_sequences == 0


def test_generate_batch_rejects_a_request_without_prompt(model):
    with pytest.raises(ParadecodeError, match="no 'prompt'"):
        model.generate_batch([{"method": "ar"}])
    with pytest.raises(ParadecodeError, match="max_batch"):
        model.generate_batch(["w3"], max_batch=0)


def test_a_backend_that_cannot_batch_runs_the_requests_one_after_another(tmp_path):
    model = paradecode.load(str(tiny_model_dir(tmp_path)), dtype="fp32")
    assert model.batcher() is None
    results = model.generate_batch(["w3 w4 w5 w3 w4", "w7 w8"], method="pld", max_new_tokens=8)
    assert [r.token_ids for r in results] == [model.generate(p, method="pld", max_new_tokens=8).token_ids
                                              for p in ["w3 w4 w5 w3 w4", "w7 w8"]]


def test_request_threads_run_torch_on_one_thread_and_a_released_team_keeps_the_setting(backend):
    """One OpenMP team at a time (``Batcher._serve``): a request thread's own torch work runs on one thread,
    other threads keep their setting, and a thread that gives its team up keeps its thread count."""
    from paradecode.backends.openmp import libgomp, one_thread_here, release_team

    if libgomp() is None:
        pytest.skip("torch does not run on libgomp here")
    before = torch.get_num_threads()
    seen = []

    def request_thread():
        one_thread_here()
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=request_thread)
    thread.start()
    thread.join()
    assert seen == [1] and torch.get_num_threads() == before
    backend.reset()
    expected = backend.forward(torch.arange(20) % 40).logits
    release_team()
    assert torch.get_num_threads() == before
    backend.reset()
    assert torch.equal(backend.forward(torch.arange(20) % 40).logits, expected)  # the forward runs on as before


def test_a_shared_pass_keeps_the_gil_where_its_threads_fill_the_cores(backend):
    """Python running beside a pass takes a core from one of its OpenMP threads, and each of the pass's parallel
    loops then waits for that thread, so where the pass's threads fill the cores a shared pass keeps the GIL: no
    other thread runs Python through it. A lone request's own pass, and one longer than a prefill chunk, let
    them. The rows are the same bits either way."""
    from paradecode.backends.openmp import fills_cores
    from paradecode.backends.sequences import _Pass

    batcher = backend.batcher(8 << 20)
    assert batcher.hold_gil == fills_cores() == (torch.get_num_threads() >= len(os.sched_getaffinity(0)))
    batcher.hold_gil = True  # whatever this machine's cores: the rule under test is what a pass does with it
    stack, calls = batcher._stack, []

    class Timed:  # the native forward, with when each call ran
        def __getattr__(self, name):
            return getattr(stack, name)

        def forward(self, *args):
            start = time.perf_counter()
            out = stack.forward(*args)
            calls.append((start, time.perf_counter(), args[-1]))
            return out

    batcher._stack = Timed()
    sequences = [batcher.open(200) for _ in range(2)]
    layers = tuple(range(backend.num_layers))
    prompt = torch.arange(1, 101) % backend.vocab_size

    def passes(rows: int) -> list:  # each sequence's first `rows` tokens
        return [_Pass(s, prompt[:rows], torch.arange(rows), None, 0, layers, True) for s in sequences]

    stamps, stop = [], threading.Event()

    def tick():  # Python that wants to run all the time, as a busy server's threads do (time.sleep(0) lets go)
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)  # the GIL changes hands only where a thread lets go of it, never by the clock
    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        results = {}
        for hold_gil in (True, False):
            for s in sequences:
                s.rollback(0)
            batch = passes(20)
            for _ in range(20):
                batcher.hold_gil = hold_gil
                batcher._forward(batch)
                for s in sequences:
                    s.rollback(0)
            results[hold_gil] = [p.out_logits.clone() for p in batch]
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        ticker.join()
    assert [hold for _, _, hold in calls] == [True] * 20 + [False] * 20

    def ran_inside(hold: bool) -> int:
        return sum(start < t < end for start, end, held in calls if held == hold for t in stamps)

    assert ran_inside(True) == 0  # nothing ran Python while a held pass ran
    assert ran_inside(False) > 0  # and the ticker did run through the passes that let go
    assert all(torch.equal(a, b) for a, b in zip(results[True], results[False]))
    calls.clear()
    batcher.hold_gil = True
    batcher._forward(passes(batcher.prefill_chunk + 1)[:1])  # longer than a chunk: lets the others run
    assert calls[-1][2] is False
    for s in sequences:
        s.close()


def test_each_sequence_sees_the_others_rows_and_tokens_per_pass(backend):
    """``Sequence.load()``: the moving means of what the other running sequences put into a pass (rows scored,
    tokens committed), what a cost schedule weighs its drafts against; nothing when alone or once they close."""
    batcher = backend.batcher(8 << 20)
    a, b = batcher.open(200), batcher.open(200)
    assert a.load() == Load()  # nobody has sent a pass yet
    steps = threading.Barrier(2)

    def decode(sequence, rows, kept):
        for _ in range(30):
            steps.wait()
            start = sequence.cache_len
            sequence.forward(torch.tensor([5] * rows))
            sequence.commit(start, list(range(kept)))

    threads = [threading.Thread(target=decode, args=(a, 1, 1)), threading.Thread(target=decode, args=(b, 4, 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert a.load().rows == pytest.approx(4.0) and a.load().tokens == pytest.approx(3.0, rel=0.01)
    assert b.load().rows == pytest.approx(1.0) and b.load().tokens == pytest.approx(1.0, rel=0.01)
    with batcher.open(200) as c:  # a prompt passes once (no logits): it does not count, but c is about to decode
        c.forward(torch.arange(60) % 40, logits=False)
        assert c.rows_per_pass == 0.0
        assert a.load().rows == pytest.approx(4.0 + 1.0) and a.load().tokens == pytest.approx(3.0 + 1.0, rel=0.01)
    b.close()
    assert a.load() == Load()
    a.close()


def test_bench_batch_answers_exactly_as_one_at_a_time_and_times_the_batch(model, tmp_path, capsys, monkeypatch):
    """``paradecode bench --batch N``: every answer (both turns) equals the one-at-a-time run's; each batch's wall
    time is shared out by tokens, so the answers' times add up to it; the report says so."""
    from paradecode.benchmark import commands
    from paradecode.cli import main

    monkeypatch.setattr(commands, "load_model", lambda args: model)
    rows = [dict(question_id=i, category=("writing", "coding", "qa")[i % 3],
                 turns=[" ".join(WORDS[3 + (i * 7 + j) % 40] for j in range(4 + i % 5)), "w5 w6 w7"])
            for i in range(1, 8)]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = {}
    for batch in (1, 4):
        out = tmp_path / f"out{batch}"
        code = main(["bench", "--no-progress", "--questions", str(questions), "--per-category", "all",
                     "--turns", "all", "--max-new-tokens", "10", "--methods", "ar,pld,ngram", "--batch", str(batch),
                     "--out", str(out)])
        assert code == 0, capsys.readouterr().err
        runs[batch] = json.loads((out / "results.json").read_text())
    answers = lambda results: {(r["method"], r["question_id"]): [t["token_ids"] for t in r["turns"]]  # noqa: E731
                               for r in results["records"]}
    assert len(runs[4]["records"]) == 21 and answers(runs[4]) == answers(runs[1])
    assert runs[4]["settings"]["batch"] == 4 and "batch" not in runs[1]["settings"]
    batches = {}
    for record in runs[4]["records"]:
        for turn in record["turns"]:
            info = turn["info"]
            batches.setdefault((record["method"], info["batch_wall_time_s"]), []).append(turn)
    sizes = sorted(len(turns) for turns in batches.values())
    assert sizes == [3] * 6 + [4] * 6  # 7 questions: groups of 4 and 3, two turns each, three methods
    for (method, wall), turns in batches.items():
        assert sum(t["wall_time_s"] for t in turns) == pytest.approx(wall)
        assert all(t["info"]["batch_size"] == len(turns) for t in turns)
    assert "Batched: each method answered 4 questions at once" in (tmp_path / "out4" / "report.md").read_text()
    assert runs[4]["lossless"]["pld"]["share"] == 1.0


def test_bench_batch_is_for_paradecode_methods(tmp_path, capsys):
    from paradecode.cli import main

    for args, message in [(["--batch", "0"], "--batch must be a positive integer"),
                          (["--batch", "2", "--methods", "ar,hf"], "paradecode methods only")]:
        code = main(["bench", "--no-progress", "--out", str(tmp_path / "o"), *args])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err


def test_a_stopped_batcher_ends_its_thread_and_refuses_passes(backend):
    """``Batcher.stop`` (run at exit for every batcher whose thread ran): the thread ends, with its OpenMP team,
    before the process tears its libraries down; a later pass is a clear error, not a hang."""
    from paradecode.backends import sequences

    batcher = backend.batcher(8 << 20)
    with batcher.open(64) as sequence, batcher.open(64) as other:
        sequence.forward(torch.arange(5) % 40)  # alone: on this thread
        assert batcher._thread is None
        other.forward(torch.arange(4) % 40)  # not alone (sequence is running): the batcher's thread runs it
        thread = batcher._thread
        assert thread.is_alive() and batcher in sequences._started
        batcher.stop()
        assert not thread.is_alive()
        with pytest.raises(RuntimeError, match="stopped"):
            sequence.forward(torch.arange(3) % 40)


EXIT_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import torch
from tiny import tiny_int8_backend
backend = tiny_int8_backend(3, sharp=4.0)
batcher = backend.batcher(8 << 20)
import threading
def work(i):
    with batcher.open(64) as sequence:
        for _ in range(4):
            sequence.forward(torch.arange(3 + i) % 40)
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("done")
"""


def test_a_process_that_batched_exits_cleanly(tmp_path):
    """It aborted at exit now and then ("terminate called without an active exception", exit code 134) while the
    batcher's daemon thread still held its OpenMP team; several runs, each must exit 0 with nothing on stderr
    about it."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT.format(tests=str(Path(__file__).parent)))
    for _ in range(6):
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-2000:]
        assert "terminate called" not in run.stderr


def test_a_shared_pass_computes_full_logits_where_any_of_its_passes_reads_them(backend):
    """Greedy verification asks for ARGMAX logits, a sampling or log-probability request for full ones: a batch
    runs the native head in the mode every pass in it can take (full where any wants full; none where none wants
    logits), and each pass gets its own rows."""
    from paradecode.backends.base import ARGMAX
    from paradecode.backends.native import ARGMAX_LOGITS, FULL_LOGITS, NO_LOGITS
    from paradecode.backends.sequences import _Pass

    batcher = backend.batcher(8 << 20)
    stack, modes = batcher._stack, []

    class Recording:  # the native forward, with the logits mode of each call
        def __getattr__(self, name):
            return getattr(stack, name)

        def forward(self, *args):
            modes.append(args[4])
            return stack.forward(*args)

    batcher._stack = Recording()
    sequences = [batcher.open(64) for _ in range(2)]
    layers = tuple(range(backend.num_layers))
    prompt = torch.arange(1, 9) % backend.vocab_size
    for wants, mode in [((True, ARGMAX), FULL_LOGITS), ((ARGMAX, ARGMAX), ARGMAX_LOGITS),
                        ((ARGMAX, False), ARGMAX_LOGITS), ((False, False), NO_LOGITS), ((True, False), FULL_LOGITS)]:
        for s in sequences:
            s.rollback(0)
        batch = [_Pass(s, prompt, torch.arange(8), None, 0, layers, want) for s, want in zip(sequences, wants)]
        batcher._forward(batch)
        assert modes[-1] == mode, wants
        for p, want in zip(batch, wants):
            assert (p.out_logits is None) == (not want) and (p.out_logits is None or p.out_logits.shape[0] == 8)
    for s in sequences:
        s.close()
