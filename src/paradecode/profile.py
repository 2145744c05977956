"""The verify cost curve: time of one forward pass over T new tokens after a fixed context, per backend and dtype.

On a CPU a forward over 8 tokens may cost anywhere from about 1x to 4x a one-token forward, depending on the
kernels and the machine; how many draft tokens are worth verifying follows from that curve. ``measure_curve``
times it on the machine at hand (median of a few repeats after a warm-up, the context rolled back after each
pass so every repeat sees the same cache); ``cached_curve`` keeps one per machine, model and dtype in the model
cache, so the ``cost`` draft schedule starts from this machine's curve instead of a guess.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Sequence

import torch

SIZES = (1, 2, 4, 8, 16, 32)
CONTEXT = 256


def machine_key() -> str:
    """What a curve depends on besides the model: the CPU model, its cores and torch's thread count."""
    return f"{cpu_name()}|{platform.machine()}|threads={torch.get_num_threads()}|torch={torch.__version__}"


ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
             "amx_bf16", "asimd", "sve")  # the /proc/cpuinfo flags that decide which kernels can run


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def isa_flags() -> list[str]:
    """The ``ISA_FLAGS`` this CPU has, in that order."""
    from paradecode.backends import native

    flags = set(native.cpu_flags().split())
    return [flag for flag in ISA_FLAGS if flag in flags]


def isa_text(isa: Sequence[str]) -> str:
    """``isa_flags()``'s answer for a speed table's machine line."""
    return " ".join(isa) or "none of " + ", ".join(ISA_FLAGS)


def machine_report() -> dict:
    """The CPU a measurement ran on: its name, the instruction-set flags that matter for the kernels, torch's
    threads, and the memory read bandwidth (where the native kernels are built), for every speed table."""
    from paradecode.backends import native

    report = dict(cpu=cpu_name(), machine=platform.machine(), threads=torch.get_num_threads(), isa=isa_flags())
    module = native.load()
    if module is not None:
        report["read_gb_per_s"] = round(module.read_bandwidth(512, 5), 1)
    return report


WARMUP_PASSES = 3  # untimed passes of each size before the timed rounds
STEADY_SPREAD = 0.25  # timings whose spread is wider were taken while other work shared the machine


def spread(seconds: Sequence[float]) -> float:
    """The interquartile range of repeated timings over their median: how unsteady the machine was."""
    quartiles = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else [seconds[0]] * 3
    return (quartiles[2] - quartiles[0]) / statistics.median(seconds)


@torch.inference_mode()
def measure_curve(backend, sizes: Sequence[int] = SIZES, context: int = CONTEXT, repeats: int = 7,
                  progress=None, spreads: dict[int, float] | None = None) -> dict[int, float]:
    """Median seconds of a forward over T new tokens after ``context`` cached tokens, for each T in ``sizes``.

    Every size first gets ``WARMUP_PASSES`` untimed passes, then the sizes take turns, one pass each per round,
    so a drift in the machine's speed (a process's first passes, a neighbour) spreads over all of them. Timed
    one size after the other with one warm-up pass, the first size took the slow start alone: the curves kept
    on an Intel Xeon (2 threads, SmolLM2-135M q4) read T=2 and T=4 at 0.74-0.89x of T=1, and ``auto``, which
    prices the drafts it only peeks at by that shape, over-priced plain decoding by ~8% and drafted where
    drafting lost (0.91-0.97x ``ar`` on a prompt where no drafter pays). ``spreads``, when given, gets each
    size's interquartile range over its median (other work on the machine widens it). Full logits after
    unrelated tokens: any tokens do, the cost is in the shape."""
    curves = measure_curves(backend, (True,), sizes, context, repeats, spreads=spreads)
    curve = curves[True]
    if progress is not None:
        for t in sizes:
            progress(t, curve[t])
    return curve


@torch.inference_mode()
def measure_curves(backend, modes: Sequence, sizes: Sequence[int] = SIZES, context: int = CONTEXT,
                   repeats: int = 7, text: Sequence[int] | None = None,
                   spreads: dict[int, float] | None = None) -> dict:
    """``measure_curve`` for each of several ``forward(logits=...)`` modes at once, {mode: curve}: the modes take
    turns within each round as the sizes do, so their ratios are not a drift of the machine. With ``base.ARGMAX``
    (greedy verification's pass) the cost depends on how peaked the predictions are, so ``text`` (token ids,
    repeated to fill the context and the new tokens) times it on text rather than on unrelated tokens."""
    context = min(context, backend.max_length - max(sizes))
    if context < 1:
        raise ValueError(f"the model's context ({backend.max_length}) is too short to profile T={max(sizes)}")
    ids = _context_ids(backend, context + max(sizes), text)
    backend.reset()
    backend.forward(ids[:context])

    def one_pass(t: int, mode) -> float:
        start = time.perf_counter()
        backend.forward(ids[context : context + t], logits=mode)
        seconds = time.perf_counter() - start
        backend.rollback(context)
        return seconds

    for t in sizes:
        for mode in modes:
            for _ in range(WARMUP_PASSES):
                one_pass(t, mode)
    times: dict = {(t, mode): [] for t in sizes for mode in modes}
    for _ in range(repeats):
        for t in sizes:
            for mode in modes:
                times[t, mode].append(one_pass(t, mode))
    if spreads is not None:
        spreads.update({t: spread(times[t, modes[0]]) for t in sizes})
    backend.reset()
    return {mode: {t: statistics.median(times[t, mode]) for t in sizes} for mode in modes}


def _context_ids(backend, length: int, text: Sequence[int] | None) -> torch.Tensor:
    if not text:
        return torch.arange(length) % backend.vocab_size
    return torch.tensor(list(text), dtype=torch.long).repeat(length // len(text) + 1)[:length]


@torch.inference_mode()
def measure_stages(backend, sizes: Sequence[int] = SIZES, context: int = CONTEXT,
                   repeats: int = 7) -> dict[int, dict[str, float]]:
    """Mean seconds per stage of one forward over T new tokens after ``context`` cached tokens, for each T, from
    the native int8 pass's own clock ({} on a backend without one)."""
    if getattr(backend, "stage_seconds", None) is None:
        return {}
    context = min(context, backend.max_length - max(sizes))
    ids = torch.arange(context + max(sizes)) % backend.vocab_size
    backend.reset()
    backend.forward(ids[:context])
    stages = {}
    for t in sizes:
        def passes() -> None:
            for _ in range(repeats):
                backend.forward(ids[context : context + t])
                backend.rollback(context)

        seconds = backend.stage_seconds(passes)
        if seconds is None:
            break
        stages[t] = {stage: total / repeats for stage, total in seconds.items()}
    backend.reset()
    return stages


def model_key(model_dir: str | Path, backend) -> str:
    """What a kept curve is measured for: ``folder|backend class|dtype|kernels`` (``kept_curves`` reads it back)."""
    return f"{Path(model_dir).resolve()}|{type(backend).__name__}|{backend.dtype}|{backend.kernels}"


def _seconds(record: dict) -> dict[int, float]:
    """A kept record's curve: {T: seconds per forward}."""
    return {int(t): float(s) for t, s in record["seconds"].items()}


CURVE_FORMAT = "interleaved"  # how kept curves were measured: one measured otherwise is measured again


def cached_curve(backend, cache_root: Path, model_key: str, sizes: Sequence[int] = (1, 2, 4, 8, 16)) -> dict[int, float]:
    """This machine's curve for ``model_key`` (model and dtype), measured once and kept in the cache; a curve
    measured while the machine was busy (a size's interquartile range over ``STEADY_SPREAD`` of its median) is
    used now and measured again by the next process, as the kernels' choice is (``choose_kernels``)."""
    key = hashlib.sha256(f"{machine_key()}|{model_key}|{list(sizes)}|{CURVE_FORMAT}".encode()).hexdigest()[:16]
    path = cache_root / "profiles" / f"{key}.json"
    if path.is_file():
        try:
            return _seconds(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: measure again
    spreads: dict[int, float] = {}
    curve = measure_curve(backend, sizes, repeats=7, spreads=spreads)
    if max(spreads.values()) > STEADY_SPREAD:
        return curve
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": machine_key(), "model": model_key, "seconds": curve}))
    except OSError:
        pass
    return curve


def kept_curves(cache_root: Path, model_dir: str | Path) -> dict[str, tuple[dict[int, float], float]]:
    """The cost curves ``cached_curve`` kept for the model in ``model_dir`` on this machine, the newest per dtype:
    dtype -> ({T: seconds per forward}, when it was measured as a POSIX time); what ``paradecode models`` shows as
    the model's speed here."""
    prefix = f"{Path(model_dir).resolve()}|"
    folder = cache_root / "profiles"
    found: dict[str, tuple[dict[int, float], float]] = {}
    for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            if record["machine"] != machine_key() or not record["model"].startswith(prefix):
                continue
            dtype = record["model"][len(prefix):].split("|")[1]  # model_key: folder|backend|dtype|kernels
            found[dtype] = _seconds(record), path.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            continue  # another writer's half-written or foreign file
    return found


def relative(curve: dict[int, float]) -> dict[int, float]:
    """The curve divided by its one-token time."""
    return {t: s / curve[min(curve)] for t, s in sorted(curve.items())}


def plot(curves: dict[str, dict[int, float]], path: Path) -> None:
    """One line per backend/dtype: ms per forward against T (log-2 x axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        ax.plot(list(curve), [1000 * s for s in curve.values()], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("new tokens per forward (T)")
    ax.set_ylabel(f"ms per forward ({CONTEXT}-token context)")
    ax.set_title(machine_key().split("|")[0], fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
