"""Which thread holds an OpenMP team: the forwards' parallel loops are fast only while one team is alive.

torch (and the native forward, linked to torch's OpenMP runtime) runs its parallel loops on a *team*: the calling
thread and its pool of worker threads, which libgomp keeps after the loop so the next one starts at once. Each
thread that ever ran a parallel loop keeps its own pool until it gives it up or ends. libgomp counts the workers
of every pool in the process, and once they outnumber the cores it stops spinning between parallel loops (100
spins, whatever ``OMP_WAIT_POLICY`` says) and its workers sleep in the kernel instead. A forward of a small model
is a few hundred short parallel loops, so each then waits for a woken worker: on a 2-core Intel Xeon,
``Model.generate`` on a second thread while the loading (main) thread still kept its pool ran 88 tok/s against
243 tok/s with the pool given up (35,000 context switches against none, for three 64-token answers).

So paradecode keeps at most one team alive for its work (``generation_team`` decides, around every generation):
- ``load`` gives up the loading thread's team (its torch work made one).
- While one thread has run every generation so far (a script's main thread, a server's one decoding thread), it
  keeps its team between generations: the next one starts at once (a new team cost ~0.3-0.7 ms, 1.6% of a
  1- or 16-token answer; no more than the noise of a 64-token one).
- Once generations run on more than one thread (a pool of request threads), each gives its team up when it ends.
  The thread that kept its team before that keeps it until it generates again: harmless for a pool, whose
  threads come back; when it is the main thread (a warm-up there, then a pool serving), a warning says to call
  ``paradecode.release_threads()`` on the main thread after its last generation.
- Batching (``backends.sequences``): request threads run their torch work on one thread (``one_thread_here``)
  while the batcher's thread runs the shared forwards; the server's threads give their teams up between requests.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from typing import Iterator

import torch

log = logging.getLogger("paradecode")
_local = threading.local()
_lock = threading.Lock()
_keeper: threading.Thread | None = None  # the thread that kept its team after its last generation
_generating: set[threading.Thread] = set()  # the threads that have run a generation (until there are two)
_warned = False


def fills_cores() -> bool:
    """Whether a forward's OpenMP threads (torch's thread count) take every core this process may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return torch.get_num_threads() >= cores


@functools.cache
def libgomp():
    """torch's OpenMP runtime where it is libgomp (already loaded by torch), else None; looked up once."""
    try:
        import ctypes

        library = ctypes.CDLL("libgomp.so.1")
        library.omp_pause_resource_all, library.omp_set_num_threads, library.omp_get_max_threads  # noqa: B018
        return library
    except (OSError, AttributeError):
        return None


def release_team() -> None:
    """Give up this thread's OpenMP team (its worker threads end; torch makes a new one on its next parallel
    loop). Called where a thread that ran torch work goes quiet while another runs the forwards."""
    global _keeper
    library = libgomp()
    if library is not None:
        threads = library.omp_get_max_threads()  # this thread's setting, which the pause resets
        library.omp_pause_resource_all(1)  # omp_pause_soft: frees the calling thread's pool
        library.omp_set_num_threads(threads)
    with _lock:
        if _keeper is threading.current_thread():
            _keeper = None


def release_threads() -> None:
    """Give up this thread's OpenMP worker threads, which a thread that has run every generation so far keeps
    for its next one. Call it on the main thread after its last generation there (a warm-up, say) when other
    threads generate from then on: while it keeps them, their forwards run up to ~2.7x slower (see
    ``paradecode.backends.openmp``)."""
    release_team()


@contextlib.contextmanager
def generation_team() -> Iterator[None]:
    """Around one generation's decoding on this thread (nested ones count as one): at its end the thread keeps
    its team while it is the only thread that has generated, else gives it up; see the module's docstring."""
    global _keeper, _warned
    depth = getattr(_local, "generations", 0)
    _local.generations = depth + 1
    thread = threading.current_thread()
    if depth == 0:
        with _lock:
            if len(_generating) < 2:
                _generating.add(thread)
            other = _keeper if _keeper is not None and _keeper is not thread and _keeper.is_alive() else None
            warn = other is threading.main_thread() and not _warned
            _warned = _warned or warn
        if warn:
            log.warning("paradecode: the main thread keeps the OpenMP worker threads of its last generation, so the "
                        "forwards of generations on other threads run up to ~2.7x slower (libgomp stops spinning "
                        "once its workers outnumber the cores). Call paradecode.release_threads() on the main "
                        "thread after its last generation there.")
    try:
        yield
    finally:
        _local.generations = depth
        if depth == 0:
            with _lock:
                keep = _generating == {thread}
                if keep:
                    _keeper = thread
            if not keep:
                release_team()


def one_thread_here() -> None:
    """This thread (a request's, whose passes the batcher's thread runs) runs its own torch work on one OpenMP
    thread, so it makes no team of its own; only this thread's setting changes. Undone by ``team_here``."""
    if getattr(_local, "team_threads", None) is not None:
        return  # already on one thread
    library = libgomp()
    if library is None:
        _local.team_threads = 0
        return
    torch.get_num_threads()  # torch's per-thread setup first, or it would override what follows
    _local.team_threads = library.omp_get_max_threads()
    library.omp_pause_resource_all(1)
    library.omp_set_num_threads(1)


def team_here() -> None:
    """This thread (a lone request's) runs its passes itself: back to the thread count it had before
    ``one_thread_here``, its team made on its next parallel loop."""
    threads = getattr(_local, "team_threads", None)
    if threads is None:
        return  # never set to one thread
    _local.team_threads = None
    library = libgomp()
    if library is not None and threads:
        library.omp_set_num_threads(threads)
