"""Prometheus metrics of one server (``/metrics``), through ``prometheus_client`` in a registry of its own.

Per decoding method: finished requests by finish reason, prompt and generated tokens, target and draft forward
passes, drafted and accepted tokens, and histograms of time to first token and request latency (both from the
request's arrival, queueing included). Per endpoint: HTTP requests by status code, counted by ``CountRequests``.
With a batcher, histograms of the rows and requests of each shared forward pass, read from the batcher's own counts
when /metrics is scraped (``BatchCollector``): a pass does no metrics work of its own.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from paradecode.stats import DecodeStats

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
# Seconds: from a few ms (a cached tiny prompt) to minutes (a long answer on a busy CPU).
_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # rows or requests per shared forward pass
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        by_method = ["method"]

        def counter(name: str, doc: str, labels=by_method) -> Counter:
            return Counter(f"paradecode_{name}", doc, labels, registry=self.registry)

        self.http_requests = counter("http_requests", "HTTP requests by endpoint and status code",
                                     ["endpoint", "status"])
        self.requests = counter("requests", "generation requests that ended, by method and finish reason "
                                            "(stop, length, cancelled, error)", ["method", "finish_reason"])
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of generation requests")
        self.generated_tokens = counter("generated_tokens", "tokens generated")
        self.forward_passes = counter("target_forward_passes", "target-model forward passes in decode steps")
        self.draft_forward_passes = counter("draft_forward_passes", "forward passes run by drafters")
        self.drafted_tokens = counter("drafted_tokens", "tokens proposed by the drafter")
        self.accepted_tokens = counter("accepted_tokens", "drafted tokens the target accepted")
        self.time_to_first_token = Histogram(
            "paradecode_time_to_first_token_seconds", "seconds from a request's arrival to its first text",
            by_method, buckets=_BUCKETS, registry=self.registry)
        self.latency = Histogram(
            "paradecode_request_latency_seconds", "seconds from a request's arrival to its last token",
            by_method, buckets=_BUCKETS, registry=self.registry)
        self.running = Gauge("paradecode_requests_running", "generations running now", registry=self.registry)
        self.waiting = Gauge("paradecode_requests_waiting", "generations waiting for the model",
                             registry=self.registry)
        self.queue_wait = Histogram("paradecode_queue_wait_seconds", "seconds from a request's arrival to the start "
                                    "of its decoding (waiting for a slot and for cache room)", buckets=_BUCKETS,
                                    registry=self.registry)
        self.cache_used = Gauge("paradecode_cache_used_slots", "KV cache slots reserved by running requests",
                                registry=self.registry)
        self.cache_slots = Gauge("paradecode_cache_slots", "KV cache slots the running requests share",
                                 registry=self.registry)

    def watch(self, batcher) -> None:
        """Report ``batcher``'s shared forward passes (``paradecode_batch_rows``, ``paradecode_batch_sequences``)."""
        self.registry.register(BatchCollector(batcher))

    def observe_cache(self, used_slots: int, slots: int) -> None:
        self.cache_used.set(used_slots)
        self.cache_slots.set(slots)

    def finished(self, method: str, finish_reason: str, stats: DecodeStats | None, latency_s: float | None) -> None:
        """Record a generation that ended (``stats`` None: it never started decoding)."""
        self.requests.labels(method, finish_reason).inc()
        if latency_s is not None:
            self.latency.labels(method).observe(latency_s)
        if stats is None:
            return
        for counter, value in ((self.prompt_tokens, stats.prompt_tokens), (self.generated_tokens, stats.new_tokens),
                               (self.forward_passes, stats.forward_passes),
                               (self.draft_forward_passes, stats.draft_forward_passes),
                               (self.drafted_tokens, stats.drafted_tokens),
                               (self.accepted_tokens, stats.accepted_tokens)):
            counter.labels(method).inc(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class BatchCollector(Collector):
    """The histograms of a batcher's shared forward passes, made from its counts at each scrape."""

    def __init__(self, batcher) -> None:
        self.batcher = batcher

    def collect(self):
        rows, sequences = self.batcher.pass_counts()
        for name, doc, counts in (("paradecode_batch_rows", "rows (tokens) of each shared forward pass", rows),
                                  ("paradecode_batch_sequences", "requests sharing each forward pass", sequences)):
            below = [sum(n for size, n in counts.items() if size <= bound) for bound in _ROWS]
            yield HistogramMetricFamily(name, doc, buckets=[*zip((str(float(b)) for b in _ROWS), below),
                                                            ("+Inf", sum(counts.values()))],
                                        sum_value=sum(size * n for size, n in counts.items()))


class CountRequests:
    """ASGI middleware: counts every HTTP request by endpoint (unknown paths as "other") and status code."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the client gets if the app fails before it answers

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
            self.metrics.http_requests.labels(endpoint, str(status)).inc()
