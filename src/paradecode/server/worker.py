"""One worker thread runs a model's generations, one at a time, first come first served.

The event loop never decodes: a request becomes a ``Job`` whose ``start`` (run in the worker thread) encodes
the prompt and returns one ``Model.stream(...)`` per choice (``n``). The worker runs the choices one after
another (the seam where a batching scheduler would step them together) and hands each event (started, a chunk of
a choice, a choice done, error) to the job's asyncio queue with ``loop.call_soon_threadsafe``. A job whose
client went away is cancelled: the worker skips it if it has not started, or stops it before its next chunk and
closes its generator, so the model is free for the next request.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from paradecode.errors import ParadecodeError
from paradecode.server.metrics import Metrics

log = logging.getLogger("paradecode.server")
POLL_S = 0.25  # how often a waiting handler checks whether its client disconnected
FINISH_REASONS = {"eos": "stop", "stop": "stop", "max_new_tokens": "length", "context": "length"}


class Disconnected(Exception):
    """The client went away before its generation ended."""


class Busy(Exception):
    """Too many requests are already waiting for the model."""


@dataclass
class Event:
    kind: str  # "started" | "delta" | "done" (one choice ended) | "error"
    index: int = 0  # delta, done: the choice
    chunk: Any = None  # delta: the choice's next paradecode.api.Chunk (text, tokens, logprobs)
    result: Any = None  # done: the choice's GenerationResult
    error: Optional[BaseException] = None  # error: what went wrong


class Job:
    """One generation request, shared by the handler (event loop) and the worker thread."""

    def __init__(self, start: Callable[[], Any], method: str, loop: asyncio.AbstractEventLoop) -> None:
        self.start = start  # runs in the worker: () -> [TextStream per choice]; raises ParadecodeError for bad input
        self.method = method
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.arrived = time.perf_counter()
        self.started_at: Optional[float] = None  # set by the worker before the "started" event
        self.first_text_at: Optional[float] = None  # set by the worker before the first "delta" event
        self._next_check = 0.0  # when next_event next asks whether the client is still there

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, event: Event) -> None:
        """Worker thread -> event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody listens any more
            self.cancel()

    async def next_event(self, is_disconnected: Callable[[], Awaitable[bool]]) -> Event:
        """The next event; raises ``Disconnected`` (and cancels the job) when the client goes away meanwhile."""
        while True:
            now = time.perf_counter()
            if now >= self._next_check:  # checked by the clock: a busy stream of events must not skip it
                self._next_check = now + POLL_S
                if await is_disconnected():
                    self.cancel()
                    raise Disconnected
            try:
                return await asyncio.wait_for(self.events.get(), POLL_S)
            except asyncio.TimeoutError:
                pass

    def timings(self) -> dict:
        """Seconds spent waiting for the model and until the first text, from the request's arrival."""
        since = lambda t: None if t is None else t - self.arrived  # noqa: E731
        return dict(queue_time_s=since(self.started_at), time_to_first_token_s=since(self.first_text_at))


class Worker:
    """The thread that owns the model; ``submit`` queues a job, ``close`` stops after cancelling the current one."""

    def __init__(self, metrics: Metrics, max_waiting: int) -> None:
        self.metrics = metrics
        self.max_waiting = max_waiting
        self._jobs: queue.Queue[Optional[Job]] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._current: Optional[Job] = None
        self._thread = threading.Thread(target=self._serve, name="paradecode-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._waiting >= self.max_waiting:
                raise Busy(f"{self._waiting} requests are already waiting for the model; try again later.")
            self._waiting += 1
            self.metrics.waiting.set(self._waiting)
        self._jobs.put(job)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float = 5.0) -> None:
        current = self._current
        if current is not None:
            current.cancel()
        self._jobs.put(None)
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
                self.metrics.waiting.set(self._waiting)
            if job.cancelled.is_set():
                self.metrics.finished(job.method, "cancelled", None, None)
                continue
            self._current = job
            self.metrics.running.set(1)
            try:
                self._run(job)
            finally:
                self._current = None
                self.metrics.running.set(0)

    def _run(self, job: Job) -> None:
        try:
            streams = job.start()
        except Exception as error:
            if not isinstance(error, ParadecodeError):
                log.exception("a request failed before decoding")
            self.metrics.finished(job.method, "error", None, None)
            job.emit(Event("error", error=error))
            return
        job.started_at = time.perf_counter()
        job.emit(Event("started"))
        for index, stream in enumerate(streams):  # one choice after another
            if not self._run_choice(job, index, stream):
                break

    def _run_choice(self, job: Job, index: int, stream) -> bool:
        """Stream one choice's chunks to the job; False when the job ended (cancelled or failed)."""
        chunks = stream.chunks()
        reason = "cancelled"
        try:
            for chunk in chunks:
                if job.cancelled.is_set():
                    break
                if job.first_text_at is None:
                    job.first_text_at = time.perf_counter()
                    self.metrics.time_to_first_token.labels(job.method).observe(job.first_text_at - job.arrived)
                job.emit(Event("delta", index=index, chunk=chunk))
            else:
                reason = FINISH_REASONS.get(stream.result.stats.stop_reason, "stop")
                job.emit(Event("done", index=index, result=stream.result))
        except Exception as error:
            reason = "error"
            if not isinstance(error, ParadecodeError):
                log.exception("a request failed while decoding")
            job.emit(Event("error", error=error))
        finally:
            chunks.close()  # a cancelled generation stops here; the model is free for the next job
            self.metrics.finished(job.method, reason, stream.run.stats, time.perf_counter() - job.arrived)
        return reason not in ("cancelled", "error")
