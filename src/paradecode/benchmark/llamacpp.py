"""The llama.cpp peers, each run in a child process so that a crash is a failed row, not a dead benchmark.

- ``llamacpp``: llama-cpp-python, plain greedy decoding on the GGUF file, one thread per core;
- ``llamacpp-pld``: the same with llama-cpp-python's own prompt lookup (``LlamaPromptLookupDecoding``).

The child (``llamacpp_worker.py``, run as a script) loads the GGUF once and serves one generate request per
turn; it measures each generation's wall time itself, so the figures leave out the pipe. If it dies (SIGILL
from a llama.cpp build for another CPU, a segfault, an exit), the turn fails with a ``WorkerDied`` error that
names the signal, the benchmark records it for that question, and the next request starts a new child;
after ``max_crashes`` deaths in a row the peer stops restarting it and records every later question as failed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from paradecode.benchmark import llamacpp_worker
from paradecode.benchmark.peers import Peer, PeerRun, gguf_path, register_peer
from paradecode.errors import ParadecodeError

PORTABLE_BUILD = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
                  "pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python")


class WorkerDied(ParadecodeError):
    """The llama.cpp child process ended while it owed a reply."""


class Worker:
    """A running child process that answers JSON-line requests on its stdin/stdout."""

    def __init__(self, command: list[str], label: str) -> None:
        self.label = label
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True)

    def request(self, message: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError:  # a broken pipe: the child is gone
            line = ""
        if not line:
            raise WorkerDied(self.death())
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise ParadecodeError(f"{self.label}: llama.cpp failed: {reply['error']}")
        return reply

    def death(self) -> str:
        """Why the child ended, with the last line it wrote to stderr."""
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # it closed its output but lives on: end it
            self.process.kill()
            code = self.process.wait()
        if code < 0:
            how = f"was killed by {signal.Signals(-code).name} ({signal.strsignal(-code)})"
        else:
            how = f"exited with code {code}"
        self.stderr.seek(0)
        last = [line for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()][-1:]
        self.close()
        hint = f" This llama-cpp-python build does not run on this CPU; rebuild it: {PORTABLE_BUILD}." \
            if code == -signal.SIGILL else ""
        return (f"{self.label}: the llama.cpp worker process {how}" + (f" (its last words: {last[0]!r})"
                if last else "") + "; it restarts for the next question." + hint)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # end of input ends the worker
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.stderr):
            if not stream.closed:
                stream.close()


@dataclass(frozen=True)
class LlamaCppOptions:
    n_threads: int = 0  # 0: one per core
    n_ctx: int = 0  # 0: the target backend's context length
    max_crashes: int = 3  # worker deaths in a row after which the peer is not restarted again
    # the Python that runs the worker: another environment's llama-cpp-python, e.g. one built for this CPU
    # (CMAKE_ARGS="-DGGML_NATIVE=ON") beside the portable build, to compare both in one run; "": this one
    python: str = ""


class _LlamaCppPeer(Peer):
    Options = LlamaCppOptions

    def worker_command(self) -> list[str]:
        # the worker file runs as a script: it needs only the standard library and llama_cpp, so the child
        # starts without importing paradecode (and torch)
        return [self.options.python or sys.executable, llamacpp_worker.__file__]

    @classmethod
    def unavailable(cls, model) -> str | None:
        if importlib.util.find_spec("llama_cpp") is None:  # found, not imported: its native code runs in the child
            return "llama-cpp-python is not installed (pip install llama-cpp-python)"
        return None if gguf_path(model) else f"no GGUF file is known for model {model.name!r}"

    def __init__(self, options, model, draft_model: str | None = None) -> None:
        super().__init__(options, model, draft_model)
        python = options.python
        if python and not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ParadecodeError(f"option python of {self.method_name!r} names {python!r}, which is not an executable "
                                  "file; give the path of a Python interpreter whose environment has llama-cpp-python.")

    def worker_config(self) -> dict:
        return dict(engine="llamacpp", model_path=str(gguf_path(self.model)), n_ctx=self.n_ctx(),
                    n_threads=self.options.n_threads or os.cpu_count(), draft=None)

    def n_ctx(self) -> int:
        return self.options.n_ctx or int(getattr(self.model.backend, "max_length", 4096))

    def prepare(self) -> None:
        self.worker: Worker | None = None
        self.crashes, self.last_crash = 0, ""
        try:
            self._start()
        except ParadecodeError:
            pass  # recorded with the first question, which tries again

    def _start(self) -> None:
        self.worker = Worker(self.worker_command(), self.method_name)
        try:
            self.worker.request(dict(op="load", config=self.worker_config()))
        except ParadecodeError as error:
            self._failed(error)
            raise

    def _failed(self, error: ParadecodeError) -> None:
        self.worker.close()
        self.worker = None
        self.crashes += 1
        self.last_crash = str(error)

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> PeerRun:
        if len(prompt_ids) + max_new_tokens > self.n_ctx():
            raise ParadecodeError(f"the prompt ({len(prompt_ids)} tokens) and {max_new_tokens} new tokens exceed "
                                  f"llama.cpp's context of {self.n_ctx()}: set --opt {self.method_name}.n_ctx=N.")
        if self.worker is None:
            if self.crashes >= self.options.max_crashes:
                raise ParadecodeError(f"{self.method_name}: not restarted after {self.crashes} failures in a row; "
                                      f"the last: {self.last_crash}")
            self._start()
        try:
            reply = self.worker.request(dict(op="generate", prompt_ids=list(prompt_ids), max_new_tokens=max_new_tokens,
                                             stop_ids=sorted(self.model.eos_ids)))  # every method's stop tokens
        except WorkerDied as error:
            self._failed(error)
            raise
        self.crashes = 0
        return PeerRun(token_ids=reply["token_ids"], wall_time_s=reply["wall_time_s"],
                       forward_passes=reply["forward_passes"], draft_forward_passes=0,
                       draft_lengths=reply["draft_lengths"], accepted_lengths=reply["accepted_lengths"],
                       accepted_per_step=reply["accepted_per_step"])

    def close(self) -> None:
        if getattr(self, "worker", None) is not None:
            self.worker.close()
            self.worker = None


@register_peer("llamacpp")
class LlamaCpp(_LlamaCppPeer):
    """llama-cpp-python, plain greedy decoding on the GGUF file"""


@dataclass(frozen=True)
class LlamaCppPLDOptions(LlamaCppOptions):
    # llama-cpp-python's LlamaPromptLookupDecoding defaults (also hf-pld's): 10 tokens, n-grams up to 2
    num_pred_tokens: int = 10  # tokens drafted per lookup
    max_ngram_size: int = 2  # longest n-gram matched (then shorter ones)


@register_peer("llamacpp-pld")
class LlamaCppPromptLookup(_LlamaCppPeer):
    """llama-cpp-python with its own prompt lookup decoding (LlamaPromptLookupDecoding)"""

    Options = LlamaCppPLDOptions

    def worker_config(self) -> dict:
        draft = dict(num_pred_tokens=self.options.num_pred_tokens, max_ngram_size=self.options.max_ngram_size)
        return dict(super().worker_config(), draft=draft)
