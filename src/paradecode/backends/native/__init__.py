"""Native kernels: the int8 Llama forward pass as one compiled call (``int8_forward.cpp``).

Compiled on first use with PyTorch's extension builder, for the CPU at hand (``-march=native``), and cached in
the model cache under a key made of the source, torch's version, the compiler flags and this CPU's instruction
set flags, so a home directory shared between machines never loads code built for another CPU. Building takes
about a minute once per machine; it needs a C++ compiler (the install already needs one for llama-cpp-python).
The build and one tiny forward run first in a child process (``check``), so a compiler failure or a crash of
the new code (say, an illegal instruction) ends the child, not the caller; only a build that passed is loaded.
When it fails, ``load`` warns once and returns None and the backend keeps its pure-PyTorch forward,
which computes the same model (with float64 attention instead of per-row float32 loops).

``PARADECODE_NATIVE=0`` turns the native path off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

from paradecode.backends.base import ARGMAX

SOURCE = Path(__file__).with_name("int8_forward.cpp")
# included by SOURCE; part of the build key
HEADERS = ("lanes.h", "projection.h", "gemm.h", "gemm_amx.h", "gemm_q4.h", "gemm_q4_amx.h", "attention.h")
# -ffp-contract=off: no fused multiply-adds chosen by the compiler, so a loop's vectorized body and its scalar
# tail round alike (the per-row exactness of the forward must not depend on where a row starts in memory).
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-std=c++17")
BUILD_SECONDS = 900  # a build and check that takes longer than this (a compiler stuck on a busy machine) is given up
_loaded: dict[str, ModuleType | None] = {}
_active: ModuleType | None = None  # the module load() last returned: row_argmax uses it, never builds one


def enabled() -> bool:
    return os.environ.get("PARADECODE_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


NO_COMPILER = "no C++ compiler found (g++ or c++): install one (e.g. apt install g++)."


def program_command(source: Path, output: Path, march: str = "native", *, openmp: bool = True,
                    assembly: bool = False) -> list[str] | None:
    """The command that compiles ``source``, a program of its own that includes the kernel headers (the tests'
    and benchmarks' builds of one kernel), as the native build compiles them: ``FLAGS`` with ``-march=<march>``
    and this folder on the include path; ``-fopenmp`` only with ``openmp``; an assembly listing with
    ``assembly``. None where no C++ compiler (g++ or c++) is installed."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return None
    flags = [f"-march={march}" if flag.startswith("-march") else flag for flag in FLAGS if openmp or flag != "-fopenmp"]
    return [compiler, *flags, "-I", str(Path(__file__).parent), *(["-S"] if assembly else []), str(source), "-o",
            str(output)]


def build_key() -> str:
    headers = [SOURCE.with_name(name) for name in HEADERS]
    parts = [SOURCE.read_bytes(), *(h.read_bytes() for h in headers if h.is_file()), torch.__version__.encode(),
             " ".join(FLAGS).encode(), cpu_flags().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def load() -> ModuleType | None:
    """The compiled module (built and checked on first use), or None when disabled or the build fails."""
    if not enabled():
        return None
    global _active
    key = build_key()
    if key not in _loaded:
        _loaded[key] = _build(key)
    if _loaded[key] is not None:
        _active = _loaded[key]
    return _loaded[key]


# The native forward's ``logits_mode`` (kNoLogits, kFullLogits, kArgmaxLogits in int8_forward.cpp)
NO_LOGITS, FULL_LOGITS, ARGMAX_LOGITS = 0, 1, 2


def logits_mode(logits) -> int:
    """A backend's ``forward(logits=...)`` (False, True or ``base.ARGMAX``) as the native forward's
    ``logits_mode``: no LM head, full logits, or each row's argmax exact (``Projection::apply_argmax``)."""
    return ARGMAX_LOGITS if logits == ARGMAX else FULL_LOGITS if logits else NO_LOGITS


def row_argmax(logits: torch.Tensor) -> list[int]:
    """Each row's argmax of ``logits`` [T, V] as a list, as ``logits.argmax(-1).tolist()`` gives it (the first
    of equal maxima, the first NaN): by the native loop when a native forward has loaded the module (this never
    builds it), else by torch. Greedy verification asks for nothing else of the logits; torch's reduction took
    ~40 us a row of 49,152 (AMD EPYC Zen 4), 3% of an 8-row verify pass."""
    module = _active
    if module is not None and logits.dtype == torch.float32 and logits.dim() == 2 and logits.is_contiguous() \
            and logits.shape[1] > 0:
        return module.row_argmax(logits)
    return logits.argmax(dim=-1).tolist()


# Run by a child process: build the extension and push one tiny forward through every kernel, so that a compiler
# failure or a crash (an illegal instruction, a bad memory access) ends the child, never the caller.
CHECK = ("import sys; sys.path[:0] = sys.argv[4:]; from paradecode.backends import native; "
         "native.check(sys.argv[1], sys.argv[2], sys.argv[3])")


def _compile(key: str, build_dir: Path, source: Path) -> ModuleType:
    from torch.utils import cpp_extension

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cpp_extension.load(name=f"paradecode_int8_{key}", sources=[str(source)], extra_cflags=list(FLAGS),
                                  extra_ldflags=["-fopenmp"], build_directory=str(build_dir), verbose=False)


def check(key: str, build_dir: str, source: str) -> None:
    """Build, then forwards of a random one-layer model (int8 projections, attention, LM head) on every kernel,
    of the same model with 4-bit projections (the q4 kernel), and of an EAGLE and an EAGLE-3 head's step."""
    from paradecode.backends import q4

    module = _compile(key, Path(build_dir), Path(source))
    torch.manual_seed(0)
    d, hd, heads, kv, inter, vocab, slots = 64, 32, 2, 1, 64, 11, 20  # k of 64: the AMX kernel runs too

    def projection(n: int, k: int, precise: bool = False) -> tuple:
        return torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n) + 0.5, None, None, precise

    def projection_q4(n: int, k: int) -> tuple:
        groups = k // q4.GROUP
        blocks = q4.Blocks(torch.randint(0, 16, (n, k), dtype=torch.uint8), (torch.rand(n, groups) * 0.1).half(),
                           (torch.rand(n, groups) * -0.1).half())
        return q4.Q4Linear.from_blocks(blocks).parts()

    page = 16
    pages = torch.tensor([1, 0], dtype=torch.int32)

    def cache(count: int) -> tuple:
        """The RoPE tables cos, sin and a cache of ``count`` pages (values, keys_t), in the forward's argument order."""
        return (torch.ones(slots, hd), torch.zeros(slots, hd),
                torch.zeros(1, kv, count * page, hd, dtype=torch.float16),
                torch.zeros(1, kv, count * page // 16, hd, 16, dtype=torch.float16))

    def stack(qkv, o, gate_up):
        forward = module.Int8Forward(heads, kv, hd, 1e-5, torch.randn(vocab, d), torch.ones(d), *cache(2), page)
        forward.add_layer(torch.ones(d), torch.ones(d), qkv, o, gate_up, projection(d, inter, precise=True),
                          torch.empty(0), torch.empty(0))
        forward.set_head(projection(vocab, d, precise=True))
        return forward

    int8 = stack(projection((heads + 2 * kv) * hd, d), projection(d, heads * hd), projection(2 * inter, d))
    four_bit = stack(projection_q4((heads + 2 * kv) * hd, d), projection_q4(d, heads * hd), projection_q4(2 * inter, d))
    for forward, label in [(int8, "the {} kernel"), (four_bit, "4-bit projections and the {} kernel")]:
        for kernel in forward.kernels():
            forward.set_kernels([kernel] * 3)
            logits = forward.forward(torch.tensor([1, 2, 3]), torch.arange(3), [(pages, 0, 3, None)], [0], True)[1]
            if not torch.isfinite(logits).all():
                raise SystemExit(f"the native forward returned non-finite logits with {label.format(kernel)}")
    # an EAGLE head's step (heads/eagle_native.py): rows through an input projection, no input or final norm, on a
    # forward sharing another's weights over a cache of its own
    none = torch.empty(0)
    head = module.Int8Forward(heads, kv, hd, 1e-5, torch.empty(0, d), none, *cache(1), page)
    head.set_input(projection(d, 2 * d, precise=True))
    head.add_layer(none, torch.ones(d), projection((heads + 2 * kv) * hd, d), projection(d, heads * hd),
                   projection(2 * inter, d), projection(d, inter, precise=True), none, none)
    head.set_head(projection(vocab, d))
    cos, sin, values, keys_t = cache(2)
    head = head.with_cache(values, keys_t, cos, sin)
    logits = head.forward(torch.empty(0, dtype=torch.long), None, [(pages, 0, 3, None)], [0], True,
                          inputs=torch.randn(3, 2 * d))[1]
    if not torch.isfinite(logits).all():
        raise SystemExit("the native forward returned non-finite logits for an EAGLE head's step")
    # an EAGLE-3 head's step: [embedding ; feature] rows as they are, a [2D] attention norm over both halves, a final
    # norm before the LM head and the residual stream returned
    head3 = module.Int8Forward(heads, kv, hd, 1e-5, torch.empty(0, d), torch.ones(d), *cache(2), page)
    head3.add_layer(torch.ones(2 * d), torch.ones(d), projection((heads + 2 * kv) * hd, 2 * d),
                    projection(d, heads * hd), projection(2 * inter, d), projection(d, inter, precise=True), none, none)
    head3.set_head(projection(vocab, d))
    head3.set_output_residual(True)
    out, logits, _ = head3.forward(torch.empty(0, dtype=torch.long), None, [(pages, 0, 3, None)], [0], True,
                                   inputs=torch.randn(3, 2 * d))
    if not (torch.isfinite(logits).all() and torch.isfinite(out).all()):
        raise SystemExit("the native forward returned non-finite logits for an EAGLE-3 head's step")


def _build(key: str) -> ModuleType | None:
    from paradecode.models import cache_root

    if shutil.which("ninja") is None:  # the `ninja` wheel's binary, when its venv's bin/ is not on PATH
        try:
            import ninja

            os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
        except ImportError:
            pass
    build_dir = cache_root() / "native" / key
    build_dir.mkdir(parents=True, exist_ok=True)
    with _build_lock(build_dir):
        source = _copy_sources(build_dir)
        checked = build_dir / "checked"  # written once a child built this key and ran it without failing
        if not checked.is_file():
            print("paradecode: compiling the native int8 kernels for this CPU (once per machine, about a minute)...",
                  file=sys.stderr, flush=True)
            try:
                child = subprocess.run([sys.executable, "-c", CHECK, key, str(build_dir), str(source),
                                        *(entry for entry in sys.path if entry)], capture_output=True, text=True,
                                       timeout=BUILD_SECONDS)
            except subprocess.TimeoutExpired:
                _clear_baton(build_dir)  # the killed child's compiler may have left it
                return _fallback(f"building and checking them took more than {BUILD_SECONDS} s")
            if child.returncode != 0:
                lines = child.stderr.strip().splitlines()
                reason = (f"the check process died of signal {-child.returncode}" if child.returncode < 0
                          else lines[-1] if lines else f"exit code {child.returncode}")
                return _fallback(reason)
            checked.write_text("ok\n")
        try:
            return _compile(key, build_dir, source)
        except Exception as error:  # e.g. the cache was emptied between the check and this load
            message = str(error).strip().splitlines()
            return _fallback(message[-1] if message else repr(error))


def _copy_sources(build_dir: Path) -> Path:
    """The source and its headers copied into the build folder, where they are compiled: the compiler's command
    line is then the same whichever checkout or install the package runs from, so two checkouts of one source
    share one build instead of rebuilding it for each other (ninja rebuilds when the command line changes)."""
    folder = build_dir / "source"
    folder.mkdir(exist_ok=True)
    for path in (SOURCE, *(SOURCE.with_name(name) for name in HEADERS)):
        if path.is_file():
            copy = folder / path.name
            if not copy.is_file() or copy.read_bytes() != path.read_bytes():
                shutil.copyfile(path, copy)
    return folder / SOURCE.name


@contextlib.contextmanager
def _build_lock(build_dir: Path):
    """One paradecode process at a time builds or loads ``build_dir``: an exclusive ``flock`` on a file there,
    which the kernel releases when its holder exits however it ends. Holding it, any ``lock`` file PyTorch's
    builder left behind is stale (its builder was killed mid-build), and would make the next build wait for its
    removal forever, so it is removed first."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, and PyTorch's own stays in charge
        yield
        return
    with open(build_dir / "build.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            _clear_baton(build_dir)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _clear_baton(build_dir: Path) -> None:
    """Remove PyTorch's build baton (``build_dir/lock``), which its builder deletes when it finishes."""
    with contextlib.suppress(FileNotFoundError):
        (build_dir / "lock").unlink()


def _fallback(reason: str) -> None:
    warnings.warn(f"paradecode: the native int8 kernels could not be built ({reason}); using the slower PyTorch "
                  "forward. Set PARADECODE_NATIVE=0 to skip the attempt.", stacklevel=4)
    return None
