"""Native kernels: the int8 Llama forward pass as one compiled call (``int8_forward.cpp``).

Compiled on first use with PyTorch's extension builder, for the CPU at hand (``-march=native``), and cached in
the model cache under a key made of the source, torch's version, the compiler flags and this CPU's instruction
set flags, so a home directory shared between machines never loads code built for another CPU. Building takes
about a minute once per machine; it needs a C++ compiler (the install already needs one for llama-cpp-python).
When the build fails, ``load`` warns once and returns None and the backend keeps its pure-PyTorch forward,
which computes the same model (with float64 attention instead of per-row float32 loops).

``PARADECODE_NATIVE=0`` turns the native path off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("int8_forward.cpp")
HEADERS = ("lanes.h", "projection.h")  # included by SOURCE; part of the build key
# -ffp-contract=off: no fused multiply-adds chosen by the compiler, so a loop's vectorized body and its scalar
# tail round alike (the per-row exactness of the forward must not depend on where a row starts in memory).
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-std=c++17")
_loaded: dict[str, ModuleType | None] = {}


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


def build_key() -> str:
    headers = [SOURCE.with_name(name) for name in HEADERS]
    parts = [SOURCE.read_bytes(), *(h.read_bytes() for h in headers if h.is_file()), torch.__version__.encode(), " ".join(FLAGS).encode(), cpu_flags().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def load() -> ModuleType | None:
    """The compiled module (built on first use), or None when disabled or the build fails."""
    if not enabled():
        return None
    key = build_key()
    if key not in _loaded:
        _loaded[key] = _build(key)
    return _loaded[key]


def _build(key: str) -> ModuleType | None:
    from torch.utils import cpp_extension

    from paradecode.models import cache_root

    if shutil.which("ninja") is None:  # the `ninja` wheel's binary, when its venv's bin/ is not on PATH
        try:
            import ninja

            os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
        except ImportError:
            pass
    build_dir = cache_root() / "native" / key
    fresh = not any(build_dir.glob("*.so"))
    if fresh:
        print("paradecode: compiling the native int8 kernels for this CPU (once per machine, about a minute)...",
              file=sys.stderr, flush=True)
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cpp_extension.load(name=f"paradecode_int8_{key}", sources=[str(SOURCE)],
                                      extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"],
                                      build_directory=str(build_dir), verbose=False)
    except Exception as error:  # no compiler, no ninja, a compile error: keep the PyTorch forward
        message = str(error).strip().splitlines()
        warnings.warn(f"paradecode: the native int8 kernels could not be built ({message[-1] if message else error}); "
                      "using the slower PyTorch forward. Set PARADECODE_NATIVE=0 to skip the attempt.", stacklevel=3)
        return None
