"""Many sequences in one int8 forward: a paged KV cache shared by several requests, and the batcher that packs
their passes into one native call.

Each request decodes on a ``Sequence``: a ``Backend`` of its own (a page table into the shared cache and a
length), so the engine, every drafter and every verifier run on it unchanged. Each request's decode loop runs
in a thread of its own; ``Sequence.forward`` hands its pass (a prefill chunk, one decode row, a draft chain or
tree to verify) to the ``Batcher`` and waits. The batcher runs one native forward over the waiting passes when
every running sequence is waiting (or the oldest pass has waited ``max_wait_s``: a request busy elsewhere does
not hold the others up for long). One thread of the batcher's own runs every forward of a batch (the native call
releases the GIL, so the requests' Python work goes on meanwhile; and the forward's OpenMP workers stay one team).
A sequence running alone (no other has a pass queued or in flight) runs its pass on its own thread instead: the
same call on the same rows, without the two thread hand-overs per step that a lone request would pay for nothing
(about 5% of a decode step). One lock keeps the two from ever running a forward at the same time.

Exactness: the native forward computes every row on its own, in an order that does not depend on the other rows
of the pass (``native/int8_forward.cpp``), so a request's tokens are the same alone or in any batch, under
greedy decoding and seeded sampling alike. Long prompts are prefilled in chunks of ``prefill_chunk`` rows while
other sequences run, so a new request does not stall the ones decoding; a chunked prefill computes the same
bits as one pass.

Speculation under load: each sequence keeps moving means of the rows it puts into a decode step's pass and the
tokens it commits per step (a prompt's chunks do not count: they pass once); ``Sequence.load()`` sums the other
running sequences' (``backends.base.Load``), and a ``cost`` draft schedule weighs its own draft rows against the
whole pass with it (``drafters.schedule``): a request drafts less when the pass is full of others' rows, as much
as alone when it is alone.

Memory: the cache is ``pages`` pages of ``page`` slots. A sequence reserves every page it may need when it opens
(prompt + answer budget + draft room), so a running request never runs out; a request that does not fit waits
for pages (``open(wait=True)``) or is refused (``CacheFull``); one that needs more than the whole cache is an
error. Closing a sequence returns its pages at once.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence as Seq

import torch

from paradecode.backends.base import ForwardOutput, Load, Logits, SlotCache
from paradecode.backends.native import FULL_LOGITS, logits_mode
from paradecode.backends.openmp import fills_cores, one_thread_here, release_team, team_here
from paradecode.errors import ParadecodeError

DRAFT_ROOM = 64  # slots a sequence reserves beyond prompt + answer: a verify pass's drafts sit there for a moment
LOAD_WEIGHT = 0.25  # weight of a sequence's newest pass in its moving means of rows and tokens per pass


class CacheFull(ParadecodeError):
    """The shared cache has no room for this request now."""


class PagePool:
    """Free pages of the shared cache; sequences take what they reserve and give it back when they close."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self._free = list(range(pages - 1, -1, -1))  # pop() hands out low pages first

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int] | None:
        if count > len(self._free):
            return None
        return [self._free.pop() for _ in range(count)]

    def give(self, pages: Seq[int]) -> None:
        self._free.extend(reversed(list(pages)))


@dataclass
class _Pass:
    sequence: "Sequence"
    ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    mask: torch.Tensor | None  # [T, start + T] bool, None: causal
    start: int  # the sequence's cache length before the pass
    layers: tuple[int, ...]
    logits: Logits
    aux_layers: tuple[int, ...] = ()
    arrived: float = field(default_factory=time.perf_counter)
    finished: threading.Event = field(default_factory=threading.Event)
    hidden: torch.Tensor | None = None
    out_logits: torch.Tensor | None = None
    aux: torch.Tensor | None = None
    error: BaseException | None = None

    @property
    def rows(self) -> int:
        return self.ids.shape[0]


class Batcher:
    """Packs the passes of many ``Sequence``s into one native forward (see the module's docstring)."""

    def __init__(self, backend, stack, cache: tuple[torch.Tensor, ...], pages: int, page: int, *,
                 max_rows: int = 256, prefill_chunk: int = 64, max_wait_s: float = 0.05) -> None:
        if max_rows < 1 or prefill_chunk < 1:
            raise ValueError("max_rows and prefill_chunk must be at least 1")
        self.backend = backend  # the model's own backend: weights, shape, hidden-state scale, layer checks
        self.page = page
        self.pool = PagePool(pages)
        self.max_rows, self.prefill_chunk, self.max_wait_s = max_rows, prefill_chunk, max_wait_s
        self.hold_gil = fills_cores()  # see _forward
        self._stack, self._cache = stack, cache  # the native forward and the cache tensors it writes
        self._cond = threading.Condition()
        self._forwarding = threading.Lock()  # held by whichever thread runs a forward (the batcher's or a lone one)
        self._pending: list[_Pass] = []
        self._running: dict[int, Sequence] = {}  # open sequences that have sent a pass (the ones a batch waits for)
        self._thread: threading.Thread | None = None  # runs the passes (started with the first one)
        self._stopping = False  # set by ``stop``: the thread ends once no pass is pending
        self._open = 0
        # what /metrics and the benchmark report: passes run, rows and sequences per pass
        self.passes = 0
        self.rows_histogram: Counter[int] = Counter()
        self.sequences_histogram: Counter[int] = Counter()

    # -- sequences -------------------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.pool.pages * self.page

    @property
    def used_slots(self) -> int:
        return (self.pool.pages - self.pool.free) * self.page

    @property
    def open_sequences(self) -> int:
        return self._open

    def pages_for(self, length: int) -> int:
        return -(-min(length, self.backend.max_length) // self.page)

    def open(self, length: int, *, wait: bool = False, timeout_s: float | None = None) -> "Sequence":
        """A new sequence with room for ``length`` tokens (capped at the model's context). ``wait``: block until
        enough pages are free (at most ``timeout_s``); else raise ``CacheFull`` at once."""
        need = self.pages_for(length)
        if need > self.pool.pages:
            raise ParadecodeError(
                f"the request needs {need * self.page} cache slots (prompt + max_tokens) but the whole cache holds "
                f"{self.slots}: lower max_tokens or shorten the prompt, or give the server more cache.")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while (pages := self.pool.take(need)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if not wait or (left is not None and left <= 0):
                    raise CacheFull(f"the cache has {self.pool.free * self.page} free slots, this request needs "
                                    f"{need * self.page}; try again when running requests finish.")
                self._cond.wait(left)
            self._open += 1
        return Sequence(self, pages, min(need * self.page, self.backend.max_length))

    def _close(self, sequence: "Sequence") -> None:
        with self._cond:
            self.pool.give(sequence.pages)
            self._running.pop(id(sequence), None)
            self._open -= 1
            self._cond.notify_all()  # waiting passes may now be the whole batch; waiting opens may fit

    def alone(self, sequence: "Sequence") -> bool:
        """Whether no other sequence is running (a lone prefill need not be chunked)."""
        return not (self._running.keys() - {id(sequence)})

    def load(self, sequence: "Sequence") -> Load:
        """What the other running sequences put into each pass (their moving means), for ``Sequence.load``. Each
        counts at least one row and one token: a decode step scores one and commits one, and a sequence that has
        only passed its prompt so far is about to."""
        others = [s for key, s in list(self._running.items()) if key != id(sequence)]
        return Load(rows=sum(max(s.rows_per_pass, 1.0) for s in others),
                    tokens=sum(max(s.tokens_per_pass, 1.0) for s in others), requests=len(others))

    # -- passes ----------------------------------------------------------------------------------------
    def run_alone(self, sequence: "Sequence", ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                  start: int, layers: tuple[int, ...], logits: Logits, aux_layers: tuple[int, ...]) -> tuple | None:
        """A lone sequence's pass (no other has a pass queued or running) on this thread: the native call's
        ``(hidden, logits, aux)``, with none of a queued pass's hand-over (its ``_Pass``, event and slices): a
        one-token pass of SmolLM2-135M took 0.48 ms longer than its native call that way, 0.32 ms now (Intel Xeon;
        Python after a forward runs on caches the weights have flushed, ~10x slower than warm). None when others
        run: then ``run`` queues it."""
        with self._cond:
            self._enter(sequence)
            if self._pending or len(self._running) != 1:
                return None
        team_here()  # the batcher's thread gives its team up once it sees one sequence left (_serve)
        rows = ids.shape[0]
        with self._forwarding, torch.inference_mode():
            out = self._stack.forward(ids, positions, [(sequence.page_table, start, rows, mask)], layers,
                                      logits_mode(logits), aux_layers, False)  # lets go of the GIL: see _forward
        self._count(rows, 1)
        return out

    def run(self, item: _Pass) -> _Pass:
        """Queue a pass for the batcher's thread and wait for its rows (a lone sequence's go through
        ``run_alone``)."""
        with self._cond:
            self._enter(item.sequence)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="paradecode-batcher", daemon=True)
                self._thread.start()
                _started.add(self)
            self._pending.append(item)
            self._cond.notify_all()
        one_thread_here()
        item.finished.wait()
        if item.error is not None:
            raise item.error
        return item

    def _enter(self, sequence: "Sequence") -> None:
        """A pass of ``sequence`` is coming (under ``_cond``): it counts as running from now on."""
        if self._stopping:
            raise RuntimeError("this batcher is stopped (the process is exiting)")
        self._running[id(sequence)] = sequence

    def _serve(self) -> None:
        """The batcher's thread: one thread runs every native forward. libgomp counts the threads of every OpenMP
        team in the process, and with more than the cores its workers stop spinning between a forward's
        parallel loops (a forward then takes about twice as long). So the passes run on this thread's team, the
        request threads run their own torch work on one thread (``one_thread_here``), the thread that
        starts a batch gives its team up (``release_team``), and this thread gives its own up when at most
        one sequence is left (a lone sequence runs its passes on its own thread with a team of its own, and the
        model's own one-request forwards, on another thread, run at full speed)."""
        team = False  # whether this thread holds an OpenMP team (since its last pass)
        with self._cond:
            while True:
                while not self._ready():
                    if self._stopping and not self._pending:
                        return  # the thread's OpenMP team ends with it, before the process tears libraries down
                    if team and not self._pending and len(self._running) <= 1:
                        release_team()  # idle: the model's own forwards elsewhere get the cores' team
                        team = False
                    self._cond.wait(self._wait_left())
                batch = self._take()
                team = True
                self._cond.release()
                try:
                    self._forward(batch)
                finally:
                    self._cond.acquire()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the batcher's thread once the pending passes have run (at exit: a daemon thread that still holds an
        OpenMP team when the process tears its libraries down made it abort, now and then, with "terminate called
        without an active exception"). Later passes raise."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _ready(self) -> bool:
        if not self._pending:
            return False
        waiting = {id(p.sequence) for p in self._pending}
        return len(waiting) >= len(self._running) or self._wait_left() <= 0

    def _wait_left(self) -> float | None:
        if not self._pending:
            return None
        return max(0.0, self._pending[0].arrived + self.max_wait_s - time.perf_counter())

    def _take(self) -> list[_Pass]:
        """The oldest pass and, in arrival order, every later one running the same layers while the rows fit."""
        first = self._pending[0]
        batch, rows, rest = [first], first.rows, []
        for item in self._pending[1:]:
            if (item.layers, item.aux_layers) == (first.layers, first.aux_layers) and rows + item.rows <= self.max_rows:
                batch.append(item)
                rows += item.rows
            else:
                rest.append(item)
        self._pending = rest
        return batch

    def _forward(self, batch: list[_Pass]) -> None:
        try:
            ids = torch.cat([p.ids for p in batch]) if len(batch) > 1 else batch[0].ids
            positions = torch.cat([p.positions for p in batch]) if len(batch) > 1 else batch[0].positions
            segments = [(p.sequence.page_table, p.start, p.rows, p.mask) for p in batch]
            modes = {logits_mode(p.logits) for p in batch}  # full logits where any pass reads them, else the most asked
            want = FULL_LOGITS if FULL_LOGITS in modes else max(modes)
            # Python that runs during a pass takes a core from one of its OpenMP threads, and every one of the
            # pass's parallel loops waits for that thread: with one thread spinning in Python beside a 12-row pass
            # of SmolLM2-135M (2 cores), the pass took 180 ms instead of 14. So where the pass's threads fill the
            # cores, a shared pass keeps the GIL: the requests' Python (their steps, the server's event loop) waits
            # for it instead. Up to a prefill chunk's rows at a time, so that long passes do not hold every other
            # thread up for long; and not a lone request's own pass (``run_alone`` lets go), where the server's event
            # loop, sending its text, ran beside the pass at less cost than after it (one client, 6 x 2 paired
            # rounds of benchmarks/library_baseline.py: server / library 0.81-0.85 holding, 0.85-0.88 not).
            hold = self.hold_gil and ids.shape[0] <= self.prefill_chunk
            with self._forwarding, torch.inference_mode():
                hidden, logits, aux = self._stack.forward(ids, positions, segments, batch[0].layers, want,
                                                          batch[0].aux_layers, hold)
        except BaseException as error:  # every pass of the batch fails with it; the others' threads go on
            for p in batch:
                p.error = error
                p.finished.set()
            return
        row = 0
        for p in batch:
            p.hidden = hidden[row : row + p.rows]
            p.out_logits = logits[row : row + p.rows] if p.logits else None
            p.aux = aux[row : row + p.rows] if aux is not None else None
            row += p.rows
        self._count(row, len(batch))  # before any of its requests goes on: what they report afterwards includes it
        for p in batch:
            p.finished.set()

    def _count(self, rows: int, sequences: int) -> None:
        with self._cond:
            self.passes += 1
            self.rows_histogram[rows] += 1
            self.sequences_histogram[sequences] += 1

    def pass_counts(self) -> tuple[dict[int, int], dict[int, int]]:
        """Copies of the passes counted so far: how many had each number of rows, and of sequences."""
        with self._cond:
            return dict(self.rows_histogram), dict(self.sequences_histogram)

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self._stack.move_slots(src, dst)


_started: "weakref.WeakSet[Batcher]" = weakref.WeakSet()  # batchers whose thread ran: stopped at exit


@atexit.register
def _stop_batchers() -> None:
    for batcher in list(_started):
        batcher.stop()


class Sequence(SlotCache):
    """One request's view of the shared cache; implements ``paradecode.backends.base.Backend``."""

    supports_tree = True

    def __init__(self, batcher: Batcher, pages: list[int], capacity: int) -> None:
        backend = batcher.backend
        self.batcher = batcher
        self.pages = pages
        self.page_table = torch.tensor(pages, dtype=torch.int32)
        self.max_length = capacity
        self.vocab_size, self.num_layers, self.dtype = backend.vocab_size, backend.num_layers, backend.dtype
        self._len = 0
        self._closed = False
        self.rows_per_pass = self.tokens_per_pass = 0.0  # moving means (``Batcher.load``)
        self._committed = 0  # tokens committed since this sequence's last pass

    def load(self) -> Load:
        """What the other sequences sharing this one's passes put into each pass (``backends.base.Load``)."""
        return self.batcher.load(self)

    def commit(self, start: int, keep: Seq[int]) -> None:
        super().commit(start, keep)
        self._committed += len(keep)

    def _count_pass(self, rows: int) -> None:
        """Fold a pass of ``rows`` rows, and the tokens committed since the last one, into the moving means."""
        if self.rows_per_pass == 0.0:
            self.rows_per_pass, self.tokens_per_pass = float(rows), float(self._committed)
        else:
            self.rows_per_pass += LOAD_WEIGHT * (rows - self.rows_per_pass)
            self.tokens_per_pass += LOAD_WEIGHT * (self._committed - self.tokens_per_pass)
        self._committed = 0

    @property
    def kernels(self) -> str:
        return self.batcher.backend.kernels

    def _physical(self, logical: torch.Tensor) -> torch.Tensor:
        page = self.batcher.page
        return self.page_table.long()[logical // page] * page + logical % page

    def _move(self, kept: torch.Tensor, start: int) -> None:
        dst = self._physical(torch.arange(start, start + len(kept)))
        self.batcher.move_slots(self._physical(kept), dst)  # this sequence's own slots: no pass of another's

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                *, return_hidden: bool = False, exit_layer: int | None = None, layers: Seq[int] | None = None,
                logits: Logits = True, aux_layers: Seq[int] = ()) -> ForwardOutput:
        if self._closed:
            raise RuntimeError("this sequence is closed")
        t, start = token_ids.shape[0], self._len
        if t < 1:
            raise ValueError("a forward needs at least one token")
        if start + t > self.max_length:
            raise ValueError(f"{start + t} tokens do not fit this sequence's cache ({self.max_length} slots)")
        if mask is not None and mask.shape != (t, start + t):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(t, start + t)}")
        run_layers, aux_layers = self.batcher.backend.pass_layers(exit_layer, layers, aux_layers), tuple(aux_layers)
        if positions is None:
            positions = torch.arange(start, start + t)
        ids, positions = token_ids.long().contiguous(), positions.long().contiguous()
        hidden, scores, aux, done = [], [], [], 0
        chunk = self.batcher.prefill_chunk
        while done < t:  # a long causal pass (a prompt) in chunks, so that it does not stall the others
            size = t - done if mask is not None or t - done <= chunk or self.batcher.alone(self) else chunk
            if logits:  # a decode step's pass; a prompt's chunks pass once and would swell the rows for long after
                self._count_pass(size)
            part_ids, part_positions = (ids, positions) if size == t else (ids[done : done + size],
                                                                           positions[done : done + size])
            out = self.batcher.run_alone(self, part_ids, part_positions, mask, start + done, run_layers, logits,
                                         aux_layers)
            if out is None:
                item = self.batcher.run(_Pass(self, part_ids, part_positions, mask, start + done, run_layers, logits,
                                              aux_layers))
                out = item.hidden, item.out_logits, item.aux
            hidden.append(out[0])
            if logits:
                scores.append(out[1])
            aux.append(out[2])
            done += part_ids.shape[0]
            self._len = start + done
        out_hidden = torch.cat(hidden) if len(hidden) > 1 else hidden[0]
        return ForwardOutput(logits=(torch.cat(scores) if len(scores) > 1 else scores[0]) if logits else None,
                             hidden=self.batcher.backend._returned_hidden(out_hidden) if return_hidden else None,
                             aux=(torch.cat(aux) if len(aux) > 1 else aux[0]) if aux_layers else None)

    def close(self) -> None:
        """Give the pages back (at once: the next request may take them). Closing twice is harmless."""
        if not self._closed:
            self._closed = True
            self.batcher._close(self)

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
