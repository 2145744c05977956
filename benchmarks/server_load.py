"""Load test for an OpenAI-compatible server (``paradecode serve``, llama.cpp's ``llama-server``): concurrent
streaming clients through the official ``openai`` client, one or several client counts per invocation.

    paradecode serve --model smollm2-135m --method pld --port 8000 &
    python benchmarks/server_load.py --url http://127.0.0.1:8000 --clients 16 --requests 2 --max-tokens 32
    python benchmarks/server_load.py --url http://127.0.0.1:8000 --clients 1,4,16,64 --requests 1 \\
        --min-requests 16 --max-tokens 32 --verify --out results/load.json

    python benchmarks/llama_server.py start --parallel 64 --port 8012        # the llama.cpp peer
    python benchmarks/server_load.py --url http://127.0.0.1:8012 --clients 1,4,16,64 --requests 1 --min-requests 16
    python benchmarks/llama_server.py stop --port 8012

``--clients`` takes one count or a comma list; the levels run in turn against the same server. At each level
every client sends its requests one after another (``stream: true``, greedy); all clients run at once. A level
sends max(clients x ``--requests``, ``--min-requests``) requests, dealt round-robin to the clients, so
``--requests 1 --min-requests 16`` gives 1 client 16 requests in sequence and 64 clients one each. Before the
levels, ``--warmup`` requests are sent one at a time and not measured. With ``--verify`` every prompt is first
answered once without streaming (which also warms up), and each streamed answer must equal it (complete, in
order, not mixed with another's).

Per level it reports requests/s, generated tokens/s, time to first token (p50/p95, from sending the request to
the first text), latency per request (p50/p95), incomplete and mismatched answers, as a table and (``--out``) as
JSON with every level. Generated tokens come from the ``usage`` the server sends after the last chunk
(``stream_options: {include_usage: true}``; both paradecode serve and llama-server send it); where a response
has none, its streamed chunks with text are counted instead and the table says so (``tokens_from``).
The ``paradecode`` request field (``extra_body``) is sent only with ``--method``, so plain OpenAI servers work.
Where the server's ``/metrics`` has paradecode's shared-pass histograms, each level also records how its passes
were filled (``batch``: passes, mean rows and requests per pass, passes by rows), read as the difference of the
histograms before and after the level.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx
import openai

QUESTIONS = [
    "Name three primary colors.", "What is the capital of France?", "Write a haiku about rain.",
    "Explain what a CPU does in one sentence.", "List the days of the week.", "What is 12 times 12?",
    "Give a synonym for happy.", "Describe the moon in two sentences.", "What do bees make?",
    "Translate 'good morning' into Spanish.", "Write a Python function that adds two numbers.",
    "Why is the sky blue?", "Name a famous painter.", "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet cat.", "Summarize the plot of Cinderella in one sentence.",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def extra_body(args) -> dict | None:
    return {"paradecode": {"method": args.method}} if args.method else None


async def one_request(client, args, prompt: str) -> dict:
    sent = time.perf_counter()
    first, texts, finish, usage, chunks = None, [], None, None, 0
    stream = await client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=extra_body(args))
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta.content or ""
        if delta:
            chunks += 1
            if first is None:
                first = time.perf_counter()
        texts.append(delta)
        finish = chunk.choices[0].finish_reason or finish
    done = time.perf_counter()
    has_usage = usage is not None and usage.completion_tokens is not None
    return dict(prompt=prompt, text="".join(texts), finish_reason=finish, ttft_s=(first or done) - sent,
                latency_s=done - sent, tokens=usage.completion_tokens if has_usage else chunks,
                tokens_from="usage" if has_usage else "chunks")


def parse_clients(text: str) -> list[int]:
    try:
        levels = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clients wants an int or a comma list of ints, not {text!r}")
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--clients wants counts >= 1, not {text!r}")
    return levels


async def run_level(client, args, clients: int, expected: dict[str, str]) -> dict:
    total = max(clients * args.requests, args.min_requests)
    prompts = [QUESTIONS[i % len(QUESTIONS)] for i in range(total)]

    async def one_client(c: int) -> list[dict]:
        return [await one_request(client, args, prompts[i]) for i in range(c, total, clients)]

    start = time.perf_counter()
    per_client = await asyncio.wait_for(asyncio.gather(*(one_client(c) for c in range(clients))), args.timeout)
    wall = time.perf_counter() - start
    results = [r for rows in per_client for r in rows]
    incomplete = [r["prompt"] for r in results if r["finish_reason"] not in ("stop", "length")]
    mismatched = [r["prompt"] for r in results if args.verify and r["text"] != expected[r["prompt"]]]
    ttft, latency = [r["ttft_s"] for r in results], [r["latency_s"] for r in results]
    tokens = sum(r["tokens"] for r in results)
    sources = sorted({r["tokens_from"] for r in results})
    return dict(clients=clients, requests=len(results), wall_s=wall, requests_per_s=len(results) / wall,
                generated_tokens=tokens, tokens_per_s=tokens / wall, tokens_from="+".join(sources),
                ttft_p50_s=statistics.median(ttft), ttft_p95_s=percentile(ttft, 0.95),
                latency_p50_s=statistics.median(latency), latency_p95_s=percentile(latency, 0.95),
                incomplete=len(incomplete), mismatched=len(mismatched),
                mismatched_prompts=sorted(set(mismatched)))


BATCH_METRICS = ("paradecode_batch_rows", "paradecode_batch_sequences")  # histograms of each shared forward pass


async def batch_histograms(url: str) -> dict | None:
    """{metric: {"le" bounds as str: cumulative count, "sum": total}} of the shared-pass histograms in the server's
    /metrics, or None where it has none (another server, or one that does not batch)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(f"{url}/metrics")
        if response.status_code != 200:
            return None
        found = {}
        for family in text_string_to_metric_families(response.text):
            if family.name in BATCH_METRICS:
                values = found.setdefault(family.name, {})
                for sample in family.samples:
                    if sample.name.endswith("_bucket"):
                        values[sample.labels["le"]] = sample.value
                    elif sample.name.endswith("_sum"):
                        values["sum"] = sample.value
        return found or None
    except (httpx.HTTPError, ValueError):
        return None


def batch_report(before: dict | None, after: dict | None) -> dict | None:
    """How a level's shared passes were filled, from the histograms before and after it."""
    if not before or not after or set(before) != set(after):
        return None
    delta = {m: {k: after[m].get(k, 0.0) - before[m].get(k, 0.0) for k in after[m]} for m in after}
    rows, sequences = delta["paradecode_batch_rows"], delta["paradecode_batch_sequences"]
    passes = rows.get("+Inf", 0.0)
    if not passes:
        return None
    bounds = sorted((float(k), v) for k, v in rows.items() if k not in ("sum", "+Inf"))
    by_rows, below, low = {}, 0.0, 0
    for bound, cumulative in bounds:
        if cumulative - below:
            by_rows[f"{low + 1}-{int(bound)}" if int(bound) > low + 1 else str(int(bound))] = int(cumulative - below)
        below, low = cumulative, int(bound)
    if passes - below:
        by_rows[f">{low}"] = int(passes - below)
    return dict(passes=int(passes), rows_per_pass=rows["sum"] / passes, requests_per_pass=sequences["sum"] / passes,
                passes_by_rows=by_rows)


def format_batch(clients: int, batch: dict) -> str:
    spread = ", ".join(f"{rows}: {n}" for rows, n in batch["passes_by_rows"].items())
    return (f"{clients} clients: {batch['passes']} shared passes, {batch['rows_per_pass']:.1f} rows and "
            f"{batch['requests_per_pass']:.1f} requests per pass; passes by rows: {spread}")


async def run(args) -> dict:
    """All levels of ``args.clients`` against ``args.url``; returns the report (``levels``: one dict each)."""
    levels = args.clients if isinstance(args.clients, list) else parse_clients(args.clients)
    # Two retries of a request that got no response: llama-server (cpp-httplib) closes a kept-alive connection
    # after 5 s idle or 100 requests, and a request sent on it as it closes fails with "Connection error" before
    # the server sees it (every level then failed there, at 1 client already). A retry only resends what never
    # arrived; a request that fails again still fails the level.
    client = openai.AsyncOpenAI(base_url=f"{args.url}/v1", api_key="unused", max_retries=2, timeout=args.timeout)
    try:
        if args.model is None:
            args.model = (await client.models.list()).data[0].id
        expected = {}
        if args.verify:
            for prompt in QUESTIONS[:max(max(levels) * args.requests, args.min_requests)]:
                answer = await client.chat.completions.create(
                    model=args.model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
                    temperature=0, extra_body=extra_body(args))
                expected[prompt] = answer.choices[0].message.content
        else:
            for k in range(args.warmup):
                await one_request(client, args, QUESTIONS[k % len(QUESTIONS)])
        rows = []
        for clients in levels:
            before = await batch_histograms(args.url)
            rows.append(await run_level(client, args, clients, expected))
            rows[-1]["batch"] = batch_report(before, await batch_histograms(args.url))
            if not args.quiet:
                r = rows[-1]
                print(f"[server_load] {clients} clients: {r['requests']} requests in {r['wall_s']:.1f} s",
                      file=sys.stderr, flush=True)
    finally:
        await client.close()
    return dict(url=args.url, model=args.model, method=args.method or "(server default)", max_tokens=args.max_tokens,
                requests_per_client=args.requests, min_requests=args.min_requests, verified=args.verify,
                levels=rows)


HEADER = ("| clients | requests | requests/s | generated tokens/s | TTFT p50 / p95 (s) | latency p50 / p95 (s) "
          "| incomplete | mismatched |\n|---:|---:|---:|---:|---:|---:|---:|---:|")


def format_row(r: dict) -> str:
    tps = f"{r['tokens_per_s']:.1f}" + ("" if r["tokens_from"] == "usage" else f" ({r['tokens_from']})")
    return (f"| {r['clients']} | {r['requests']} | {r['requests_per_s']:.2f} | {tps} "
            f"| {r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f} | {r['latency_p50_s']:.2f} / {r['latency_p95_s']:.2f} "
            f"| {r['incomplete']} | {r['mismatched']} |")


def format_table(report: dict) -> str:
    lines = [HEADER, *(format_row(r) for r in report["levels"])]
    if any(r["tokens_from"] != "usage" for r in report["levels"]):
        lines.append("\n(chunks): the server sent no `usage`; generated tokens counted as streamed chunks with text")
    if not report["verified"]:
        lines.append("\nmismatched: not checked (no --verify)")
    batches = [format_batch(r["clients"], r["batch"]) for r in report["levels"] if r.get("batch")]
    if batches:
        lines += ["", "Shared forward passes (the server's /metrics):", *(f"- {b}" for b in batches)]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default: %(default)s)")
    parser.add_argument("--model", help="model id to send (default: the first one /v1/models lists)")
    parser.add_argument("--method", help="decoding method per request, sent as extra_body "
                        "{'paradecode': {'method': ...}} (default: none sent, the server's)")
    parser.add_argument("--clients", type=parse_clients, default=[16],
                        help="concurrent clients: one count or a comma list, e.g. 1,4,16,64 (default: 16)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client, in sequence (default: 2)")
    parser.add_argument("--min-requests", type=int, default=0,
                        help="at least this many requests per level, dealt round-robin to the clients (default: 0)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default: 32)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="unmeasured requests before the levels, without --verify (default: 1)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per level (default: 900)")
    parser.add_argument("--verify", action="store_true", help="streamed answers must equal non-streamed ones")
    parser.add_argument("--quiet", action="store_true", help="no per-level progress on stderr")
    parser.add_argument("--out", help="write the report (all levels) as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = asyncio.run(run(args))
    print(f"{report['url']}  model {report['model']}  method {report['method']}  max_tokens {report['max_tokens']}")
    print(format_table(report))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if any(r["incomplete"] or r["mismatched"] for r in report["levels"]) else 0


if __name__ == "__main__":
    sys.exit(main())
