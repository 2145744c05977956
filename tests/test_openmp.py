"""One OpenMP team at a time (``backends.openmp``): libgomp's workers stop spinning between parallel loops once the
teams' workers outnumber the cores, so a thread that generated keeps its team only while it is the only thread
that has generated, and the main thread keeping one while others generate is named in a warning."""

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import paradecode
from paradecode.backends import openmp
from tiny import tiny_model_dir

SCRIPT = """
import json, logging, os, queue, threading
import torch
from paradecode.backends import openmp

if openmp.libgomp() is None:
    print(json.dumps("no libgomp")); raise SystemExit
torch.set_num_threads(2)
warnings = []
logging.getLogger("paradecode").addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: warnings.append(r.getMessage())})())

def workers():  # native threads that Python did not start: the OpenMP teams' workers, and torch's own
    return len(set(map(int, os.listdir("/proc/self/task"))) - {t.native_id for t in threading.enumerate()})

def generation():
    with openmp.generation_team():
        torch.ones(1 << 22).mul_(2)  # a parallel loop: this thread's team

class Kept(threading.Thread):  # a thread that stays alive between its generations (a pool's)
    def __init__(self):
        super().__init__(daemon=True); self.jobs, self.done = queue.Queue(), queue.Queue(); self.start()
    def run(self):
        while True:
            self.jobs.get()(); self.done.put(workers())
    def call(self, job):
        self.jobs.put(job); return self.done.get()

openmp.release_team()
start = workers()  # torch's own threads, if any
counts = {}
if os.environ["CASE"] == "pool":
    first, second = Kept(), Kept()
    counts["first alone"] = first.call(generation)  # the only thread that generated: keeps its team
    counts["second"] = second.call(generation)  # gives its own up; the first still keeps its
    counts["first again"] = first.call(generation)  # more than one thread generates now: gives it up
    generation()
    counts["main"] = workers()
else:  # a warm-up on the main thread, then another thread generates
    generation()
    counts["main alone"] = workers()
    other = Kept()
    counts["other"] = other.call(generation)
    openmp.release_threads()
    counts["after release_threads"] = workers()
print(json.dumps({"counts": {k: n - start for k, n in counts.items()}, "warnings": warnings}))
"""


def run_case(case: str) -> dict:
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "CASE": case, "OMP_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    if result == "no libgomp":
        pytest.skip("torch does not run on libgomp here")
    return result


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts threads in Linux's /proc/self/task")
def test_a_thread_keeps_its_team_only_while_it_is_the_only_one_that_generated():
    result = run_case("pool")
    assert result["counts"] == {"first alone": 1, "second": 1, "first again": 0, "main": 0}
    assert result["warnings"] == []  # the thread that kept its team was a pool's, which comes back


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts threads in Linux's /proc/self/task")
def test_the_main_thread_keeping_its_team_while_another_generates_is_warned_and_can_be_released():
    result = run_case("main")
    assert result["counts"] == {"main alone": 1, "other": 1, "after release_threads": 0}
    assert len(result["warnings"]) == 1 and "paradecode.release_threads()" in result["warnings"][0]


def test_a_generation_decodes_inside_one_team_scope_on_its_own_thread(tmp_path, monkeypatch):
    """``TextStream`` enters ``generation_team`` once per generation, on the thread that decodes, and leaves it
    when the generation ends or is closed early."""
    model = paradecode.load(str(tiny_model_dir(tmp_path)), dtype="fp32")
    scopes = []

    @contextlib.contextmanager
    def recorded():
        scope = {"thread": threading.current_thread(), "left": False}
        scopes.append(scope)
        try:
            yield
        finally:
            scope["left"] = True

    monkeypatch.setattr(paradecode.api, "generation_team", recorded)
    thread = threading.Thread(target=lambda: model.generate("w3 w4 w5", method="ar", max_new_tokens=6))
    thread.start()
    thread.join()
    assert [(s["thread"], s["left"]) for s in scopes] == [(thread, True)]
    stream = model.stream("w3 w4 w5", method="ar", max_new_tokens=20)
    chunks = stream.chunks()
    next(chunks)
    assert scopes[-1]["thread"] is threading.current_thread() and not scopes[-1]["left"]
    chunks.close()
    assert scopes[-1]["left"] and len(scopes) == 2


def test_release_threads_is_public():
    assert paradecode.release_threads is openmp.release_threads
