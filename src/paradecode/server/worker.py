"""The worker runs a model's generations: many at once where the model can batch, first come first served.

The event loop never decodes: a request becomes a ``Job`` whose ``start`` encodes the prompt and returns one
``Model.stream(...)`` per choice (``n``). One dispatcher thread takes jobs in arrival order, starts each (with a
batcher, ``start`` also reserves each choice's room in the shared cache, waiting for it when the cache is full)
and runs every choice on a thread of its own, at most ``max_running`` at once; their forward passes are packed
into shared ones by ``backends.sequences``, so each answer is exactly what it would be alone. The choices' threads
are kept for the next ones (``Threads``): a new thread's first forward cost ~4 ms more (its memory is new). Without a batcher
(a backend that cannot batch, or ``--max-batch 1``) the dispatcher runs each job itself, its choices one after
another: the model's forwards stay on one thread, hence one OpenMP team. Each event (a chunk of a choice, a choice
done, error) goes to the job's asyncio queue with ``loop.call_soon_threadsafe``. A job whose client went away is
cancelled: the dispatcher skips it if it has not started, or each choice stops before its next chunk and closes
its generator, which frees its cache at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
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
    kind: str  # "delta" | "done" (one choice ended) | "error"
    index: int = 0  # delta, done: the choice
    chunk: Any = None  # delta: the choice's next paradecode.api.Chunk (text, tokens, logprobs)
    result: Any = None  # done: the choice's GenerationResult
    error: Optional[BaseException] = None  # error: what went wrong


class Job:
    """One generation request, shared by the handler (event loop) and the worker thread."""

    def __init__(self, start: Callable[[], Any], method: str, loop: asyncio.AbstractEventLoop, stream: bool) -> None:
        self.start = start  # runs in the worker: () -> [TextStream per choice]; raises ParadecodeError for bad input
        self.method = method
        self.stream = stream  # whether the handler sends text as it comes ("delta" events); else only results
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.arrived = time.perf_counter()
        self.started_at: Optional[float] = None  # set by the worker when the job starts decoding
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


class Threads:
    """Daemon threads kept for reuse: ``submit(fn, *args, then=...)`` runs ``fn`` on an idle one, or on a new one
    when none is idle (``fn`` handles its own errors), and ``then()`` once the thread counts as idle again (so a
    caller that waits for ``then`` finds it idle: no more threads than tasks at once). Each gives its OpenMP team
    up after each call, so an idle thread holds no workers that would crowd the cores of the forwards running
    elsewhere."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads that will take the next task without one being started
        self.started = 0

    def submit(self, fn: Callable[..., None], *args: Any, then: Callable[[], None] = lambda: None) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self.started += 1
                threading.Thread(target=self._loop, name=f"{self.name}-{self.started}", daemon=True).start()
        self._tasks.put((fn, args, then))

    def _loop(self) -> None:
        from paradecode.backends.openmp import release_team

        while True:
            fn, args, then = self._tasks.get()
            try:
                fn(*args)
            finally:
                release_team()
                with self._lock:
                    self._idle += 1
                then()


class Worker:
    """The dispatcher thread and the choices' threads; ``submit`` queues a job, ``close`` stops after cancelling
    the running ones."""

    def __init__(self, metrics: Metrics, max_waiting: int, max_running: int, batched: bool,
                 stream_interval_s: float) -> None:
        self.metrics = metrics
        self.stream_interval_s = stream_interval_s  # see _run_choice
        self.max_waiting = max_waiting
        self.max_running = max_running if batched else 1
        self.batched = batched  # choices of one job run concurrently too
        self._jobs: queue.Queue[Optional[Job]] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running: set[Job] = set()
        self._choices = 0  # choices decoding now
        self._slots = threading.Semaphore(self.max_running)
        self._choice_threads = Threads("paradecode-choice")
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
        with self._lock:
            running = list(self._running)
        for job in running:
            job.cancel()
        self._jobs.put(None)
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        while True:
            self._slots.acquire()  # a slot for the next job's first choice (its others take theirs in _run)
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                self._slots.release()
                self._left_queue()
                self.metrics.finished(job.method, "cancelled", None, None)
                continue
            try:
                streams = job.start()  # waits for cache room when the running requests fill it
            except Exception as error:
                self._slots.release()
                self._left_queue()
                if not isinstance(error, ParadecodeError):
                    log.exception("a request failed before decoding")
                self.metrics.finished(job.method, "error", None, None)
                job.emit(Event("error", error=error))
                continue
            self._left_queue()
            job.started_at = time.perf_counter()
            self.metrics.queue_wait.observe(job.started_at - job.arrived)
            # no event: the handler wakes for the first text (or the end), so the event loop does not run beside the
            # prompt's forward, whose OpenMP threads fill the cores of a small machine (no gain measurable on its own
            # among the run-to-run noise of one client on 2 cores)
            with self._lock:
                self._running.add(job)
            self._update_running(len(streams) if self.batched else 1)
            if self.batched:
                threading.Thread(target=self._run, args=(job, streams), name="paradecode-job", daemon=True).start()
            else:  # one at a time: on this thread, the one that runs the model's forwards (one OpenMP team)
                self._run(job, streams)

    def _left_queue(self) -> None:
        with self._lock:
            self._waiting -= 1
            self.metrics.waiting.set(self._waiting)

    def _update_running(self, change: int) -> None:
        with self._lock:
            self._choices += change
            self.metrics.running.set(self._choices)

    def _run(self, job: Job, streams: list) -> None:
        """Run a job's choices: concurrently when batched (each in its own thread, each holding a slot), else one
        after another on the job's one slot."""
        if not self.batched:
            try:
                for index, stream in enumerate(streams):
                    if not self._run_choice(job, index, stream):
                        break
            finally:
                for stream in streams:  # choices never run (the job ended) free what they hold
                    stream.close()
                self._update_running(-1)
                self._done(job)
                self._slots.release()
            return
        ended = threading.Semaphore(0)
        for index, stream in enumerate(streams):
            if index:
                self._slots.acquire()
            self._choice_threads.submit(self._run_held, job, index, stream, then=lambda: self._ended(ended))
        for _ in streams:
            ended.acquire()
        self._done(job)

    def _run_held(self, job: Job, index: int, stream) -> None:
        try:
            if not job.cancelled.is_set():
                self._run_choice(job, index, stream)
            else:
                stream.close()
        finally:
            self._update_running(-1)

    def _ended(self, ended: threading.Semaphore) -> None:
        """A choice's thread is idle again: its slot is free for the next choice."""
        self._slots.release()
        ended.release()

    def _done(self, job: Job) -> None:
        with self._lock:
            self._running.discard(job)

    def _run_choice(self, job: Job, index: int, stream) -> bool:
        """Stream one choice's chunks to the job; False when the job ended (cancelled or failed). The first chunk
        goes out at once; the steps that commit within ``stream_interval_s`` of the last chunk sent wait and go out
        merged with the next (each chunk wakes the event loop, renders JSON and is parsed by the client: on a
        machine with few cores that work slows the forwards). A job that does not stream gets no chunks."""
        chunks = stream.chunks()
        reason, done = "cancelled", None
        waiting, sent_at = None, -math.inf  # the text not sent yet, and when the last chunk went out
        try:
            for chunk in chunks:
                if job.cancelled.is_set():  # checked each step, whatever is sent
                    break
                now = time.perf_counter()
                if job.first_text_at is None:
                    job.first_text_at = now
                    self.metrics.time_to_first_token.labels(job.method).observe(now - job.arrived)
                if not job.stream:
                    continue
                waiting = chunk if waiting is None else waiting + chunk
                if now - sent_at >= self.stream_interval_s:
                    job.emit(Event("delta", index=index, chunk=waiting))
                    waiting, sent_at = None, now
            else:
                if waiting is not None:
                    job.emit(Event("delta", index=index, chunk=waiting))
                reason = FINISH_REASONS.get(stream.result.stats.stop_reason, "stop")
                done = Event("done", index=index, result=stream.result)
        except Exception as error:
            reason = "error"
            job.cancel()  # the job's other choices stop too: its client gets this error, not their answers
            if not isinstance(error, ParadecodeError):
                log.exception("a request failed while decoding")
            job.emit(Event("error", error=error))
        finally:
            chunks.close()  # a cancelled generation stops here; its cache is free for the next job
            stream.close()
            self.metrics.finished(job.method, reason, stream.run.stats, time.perf_counter() - job.arrived)
        if done is not None:  # after the metrics: a client that reads them once answered finds its request there
            job.emit(done)
        return reason not in ("cancelled", "error")
