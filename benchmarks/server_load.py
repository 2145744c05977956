"""Load test for ``paradecode serve``: concurrent streaming clients through the official ``openai`` client.

    paradecode serve --model smollm2-135m --method pld --port 8000 &
    python benchmarks/server_load.py --url http://127.0.0.1:8000 --clients 16 --requests 2 --max-tokens 32

Each client sends its requests one after another (``stream: true``, greedy); all clients run at once. With
``--verify`` every prompt is first answered once without streaming, and each streamed answer must equal it
(complete, in order, not mixed with another's). Prints and writes (``--out``) requests/s, generated tokens/s,
time to first token (p50/p95, from sending the request to the first text) and latency per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

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


async def one_request(client, args, prompt: str) -> dict:
    sent = time.perf_counter()
    first, texts, finish, usage = None, [], None, None
    stream = await client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"paradecode": {"method": args.method}} if args.method else None)
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta.content or ""
        if delta and first is None:
            first = time.perf_counter()
        texts.append(delta)
        finish = chunk.choices[0].finish_reason or finish
    done = time.perf_counter()
    return dict(prompt=prompt, text="".join(texts), finish_reason=finish, ttft_s=(first or done) - sent,
                latency_s=done - sent, tokens=usage.completion_tokens if usage else 0)


async def run(args) -> dict:
    client = openai.AsyncOpenAI(base_url=f"{args.url}/v1", api_key="unused", max_retries=0, timeout=args.timeout)
    if args.model is None:
        args.model = (await client.models.list()).data[0].id
    prompts = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.clients * args.requests)]
    expected = {}
    if args.verify:
        for prompt in dict.fromkeys(prompts):
            answer = await client.chat.completions.create(
                model=args.model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
                temperature=0, extra_body={"paradecode": {"method": args.method}} if args.method else None)
            expected[prompt] = answer.choices[0].message.content

    async def one_client(c: int) -> list[dict]:
        return [await one_request(client, args, prompts[c + k * args.clients]) for k in range(args.requests)]

    start = time.perf_counter()
    per_client = await asyncio.wait_for(asyncio.gather(*(one_client(c) for c in range(args.clients))), args.timeout)
    wall = time.perf_counter() - start
    results = [r for rows in per_client for r in rows]
    incomplete = [r["prompt"] for r in results if r["finish_reason"] not in ("stop", "length")]
    mismatched = [r["prompt"] for r in results if args.verify and r["text"] != expected[r["prompt"]]]
    ttft, latency = [r["ttft_s"] for r in results], [r["latency_s"] for r in results]
    tokens = sum(r["tokens"] for r in results)
    return dict(url=args.url, model=args.model, method=args.method or "(server default)", clients=args.clients,
                requests=len(results), max_tokens=args.max_tokens, wall_s=wall, requests_per_s=len(results) / wall,
                generated_tokens=tokens, tokens_per_s=tokens / wall,
                ttft_p50_s=statistics.median(ttft), ttft_p95_s=percentile(ttft, 0.95),
                latency_p50_s=statistics.median(latency), latency_p95_s=percentile(latency, 0.95),
                incomplete=len(incomplete), verified=args.verify, mismatched=len(mismatched))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default: %(default)s)")
    parser.add_argument("--model", help="model id to send (default: the first one /v1/models lists)")
    parser.add_argument("--method", help="decoding method per request (default: the server's)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default: 16)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client, in sequence (default: 2)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default: 32)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole run (default: 900)")
    parser.add_argument("--verify", action="store_true", help="streamed answers must equal non-streamed ones")
    parser.add_argument("--out", help="write the summary as JSON here")
    args = parser.parse_args()
    summary = asyncio.run(run(args))
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    return 1 if summary["incomplete"] or summary["mismatched"] else 0


if __name__ == "__main__":
    sys.exit(main())
