"""What one client through ``paradecode serve`` is compared with: the same short chat questions as
``server_load.py``, decoded one after another by ``Model.generate`` in this process (no HTTP).

    python benchmarks/library_baseline.py --prompts 16 --max-tokens 64          # the server's default method
    python benchmarks/library_baseline.py --method ar
    paradecode serve --port 8000 &                                              # paired with a running server:
    python benchmarks/library_baseline.py --server http://127.0.0.1:8000 --rounds 10 --prompts 8

Two untimed questions first (as the load test's warm-up); prints generated tokens per second over the timed
ones. Run it on an idle machine, right after (or before) ``serve_compare.py --clients 1``.

With ``--server`` the library and one streaming client of that server (``server_load.py``'s, the same requests;
``--no-stream``: whole answers) take turns, ``--rounds`` times: library, then server, on the same ``--prompts``
questions each round (the rounds walk through the list). Each round's server / library ratio shares the machine's drift, so the median ratio is
the figure to quote; the server's tokens come from its ``usage``. Keep the server otherwise idle.

The client runs on the same cores as the server, so its own work slows the server's forwards. ``--client openai``
(default) is the ``openai`` package's async client, as ``server_load.py`` uses; ``--client http`` is a bare
``http.client`` connection that reads the server-sent events line by line and parses each as JSON (what a lean
client does). Each round also prints the client's CPU time per request (this process's, while it waits on the
server), which is what the two clients differ by.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paradecode  # noqa: E402
import server_load  # noqa: E402
from server_load import QUESTIONS  # noqa: E402


def library_rate(model, questions: list[str], kwargs: dict) -> float:
    """Generated tokens per second of ``Model.generate`` over ``questions``, one after another."""
    tokens, start = 0, time.perf_counter()
    for question in questions:
        tokens += len(model.generate(question, **kwargs).token_ids)
    return tokens / (time.perf_counter() - start)


async def server_rate(client, args, questions: list[str]) -> float:
    """Generated tokens per second of one client (streaming unless ``--no-stream``) sending ``questions`` one
    after another."""
    tokens, start = 0, time.perf_counter()
    for question in questions:
        if args.no_stream:
            answer = await client.chat.completions.create(
                model=args.model, messages=[{"role": "user", "content": question}], max_tokens=args.max_tokens,
                temperature=0, extra_body=server_load.extra_body(args))
            tokens += answer.usage.completion_tokens
        else:
            tokens += (await server_load.one_request(client, args, question))["tokens"]
    return tokens / (time.perf_counter() - start)


class HttpClient:
    """One kept-alive ``http.client`` connection to the server; ``rate`` is ``server_rate`` without the ``openai``
    package: a streamed answer is read event by event (each ``data:`` line parsed as JSON)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=300)
        self.base = parts.path.rstrip("/")

    def _call(self, method: str, path: str, body: dict | None = None) -> http.client.HTTPResponse:
        self.connection.request(method, self.base + path, json.dumps(body) if body is not None else None,
                                {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}: {response.read()[:300]!r}")
        return response

    def model_id(self) -> str:
        return json.loads(self._call("GET", "/v1/models").read())["data"][0]["id"]

    def tokens(self, args, question: str) -> int:
        body = dict(model=args.model, messages=[{"role": "user", "content": question}], max_tokens=args.max_tokens,
                    temperature=0, stream=not args.no_stream, **(server_load.extra_body(args) or {}))
        if args.no_stream:
            return json.loads(self._call("POST", "/v1/chat/completions", body).read())["usage"]["completion_tokens"]
        body["stream_options"] = {"include_usage": True}
        response, tokens = self._call("POST", "/v1/chat/completions", body), None
        while line := response.readline():
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
        if tokens is None:
            raise RuntimeError("the stream ended without a usage chunk")
        return tokens

    def rate(self, args, questions: list[str]) -> float:
        tokens, start = 0, time.perf_counter()
        for question in questions:
            tokens += self.tokens(args, question)
        return tokens / (time.perf_counter() - start)

    async def close(self) -> None:
        self.connection.close()


def paired(model, kwargs: dict, args) -> int:
    import openai

    async def run() -> list[tuple[float, float]]:
        if args.client == "http":
            client = HttpClient(args.server)
            args.model = client.model_id()
        else:
            client = openai.AsyncOpenAI(base_url=f"{args.server}/v1", api_key="unused", max_retries=2, timeout=300)
            args.model = (await client.models.list()).data[0].id

        async def rate(questions: list[str]) -> float:
            return client.rate(args, questions) if args.client == "http" else await server_rate(client, args, questions)

        try:
            await rate(QUESTIONS[:2])
            rows = []
            for k in range(args.rounds):
                start = k * args.prompts % len(QUESTIONS)
                questions = (QUESTIONS + QUESTIONS)[start: start + args.prompts]
                library = library_rate(model, questions, kwargs)
                cpu = time.process_time()
                server = await rate(questions)
                cpu_ms = (time.process_time() - cpu) * 1000 / len(questions)
                rows.append((library, server))
                print(f"round {k + 1}: library {library:.1f} tok/s, server {server:.1f} tok/s, "
                      f"server / library {server / library:.2f}; client CPU {cpu_ms:.1f} ms a request", flush=True)
            return rows
        finally:
            await client.close()

    try:
        rows = asyncio.run(run())
    except Exception as error:  # the server is not there, or failed: say so, no traceback
        print(f"library_baseline: the server at {args.server} did not answer: {type(error).__name__}: {error}",
              file=sys.stderr)
        return 1
    ratios = [server / library for library, server in rows]
    print(f"{args.rounds} rounds of {args.prompts} chat questions ({'not ' * args.no_stream}streamed, "
          f"{args.client} client), "
          f"{args.method or 'default method'}, "
          f"{args.max_tokens} tokens: library median {statistics.median(r[0] for r in rows):.1f} tok/s, server "
          f"median {statistics.median(r[1] for r in rows):.1f} tok/s; server / library per round: median "
          f"{statistics.median(ratios):.3f}, min {min(ratios):.2f}, max {max(ratios):.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--method", help="decoding method (default: the library's default; with --server it is "
                                         "sent with each request too)")
    parser.add_argument("--prompts", type=int, default=16, help="questions, in server_load.py's order (default: 16)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per answer (default: 64)")
    parser.add_argument("--server", help="base URL of a running paradecode serve to pair with, round by round")
    parser.add_argument("--rounds", type=int, default=10, help="with --server: library/server pairs (default: 10)")
    parser.add_argument("--no-stream", action="store_true",
                        help="with --server: the client asks for whole answers instead of streaming them")
    parser.add_argument("--client", choices=("openai", "http"), default="openai",
                        help="with --server: the openai package's async client (default), or a bare http.client "
                             "connection (see above)")
    args = parser.parse_args()
    if not 1 <= args.prompts <= len(QUESTIONS):
        parser.error(f"--prompts must be between 1 and {len(QUESTIONS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    model = paradecode.load(args.model)
    kwargs = dict(max_new_tokens=args.max_tokens, **({"method": args.method} if args.method else {}))
    for question in QUESTIONS[:2]:
        model.generate(question, **kwargs)
    if args.server:
        return paired(model, kwargs, args)
    start = time.perf_counter()
    rate = library_rate(model, QUESTIONS[: args.prompts], kwargs)
    print(f"Model.generate, {args.prompts} chat questions one after another, {args.method or 'default method'}, "
          f"{args.max_tokens} tokens: {rate:.1f} tok/s ({time.perf_counter() - start:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
