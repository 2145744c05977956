"""The OpenAI-compatible server, run for real on loopback and driven by the official ``openai`` client and httpx:
greedy answers equal ``Model.generate``, streams are complete and unmixed under 16 concurrent clients, a client
that disconnects frees the model, and every bad request gets OpenAI's error object with the right status."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
import httpx
import openai
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

import paradecode
from paradecode import cli
from paradecode.server.app import create_app
from paradecode.server.inputs import ServerDefaults
from paradecode.server.commands import bind
from tiny import tiny_model_dir

# Role markers are vocabulary words, so the tiny word-level tokenizer encodes templated chats exactly.
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
                 "w2 {{ m['content'] }} w3 {% endfor %}{% if add_generation_prompt %}w4{% endif %}")
PROMPT = "w3 w4 w5 w3 w4 w5 w3 w4"
CHAT = [{"role": "user", "content": "w7 w8 w9 w7 w8"}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory.mktemp("tiny-chat"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(chat_dir):
    """A second copy of the model for expected outputs (the server's copy is busy in its worker thread)."""
    return paradecode.load(chat_dir)


@contextlib.contextmanager
def serving(model, **defaults):
    """Run the app in a background thread on a free loopback port; yields the base URL. Streams send a chunk per
    step unless ``stream_interval_s`` says otherwise."""
    listener = bind("127.0.0.1", 0)
    app = create_app(model, ServerDefaults(**{"model_name": "tiny", "stream_interval_s": 0.0, **defaults}))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[listener]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


@pytest.fixture(scope="module")
def url(chat_dir):
    with serving(paradecode.load(chat_dir), method="pld", max_new_tokens=24, max_body_bytes=20_000) as base:
        yield base


def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def metric(url, name: str, **labels) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.parametrize("method", [None, "ar", "ngram", "auto"])  # None: the server's default, pld
def test_greedy_answers_equal_generate(url, reference, method):
    extra = {"paradecode": {"method": method}} if method else None
    expected_chat = reference.generate(CHAT, method=method or "pld", max_new_tokens=24)
    expected_text = reference.generate(PROMPT, method=method or "pld", max_new_tokens=24, chat=False)
    openai_client = client(url)

    chat = openai_client.chat.completions.create(model="tiny", messages=CHAT, temperature=0, extra_body=extra)
    assert chat.choices[0].message.content == expected_chat.text
    assert chat.usage.completion_tokens == len(expected_chat.token_ids)
    assert chat.usage.prompt_tokens == len(expected_chat.prompt_token_ids)
    stats = chat.model_extra["paradecode"]
    assert stats["method"] == (method or "pld") and stats["new_tokens"] == len(expected_chat.token_ids)
    assert stats["forward_passes"] == len(stats["accepted_per_step"]) and sum(stats["accepted_per_step"]) == 24

    completion = openai_client.completions.create(model="tiny", prompt=PROMPT, extra_body=extra)
    assert completion.choices[0].text == expected_text.text

    chunks = list(openai_client.chat.completions.create(model="tiny", messages=CHAT, stream=True, extra_body=extra,
                                                        stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == expected_chat.text and len(deltas) > 2
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].model_extra["paradecode"]["new_tokens"] == len(expected_chat.token_ids)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected_chat.token_ids)
    assert len({c.id for c in chunks}) == 1

    pieces = [c.choices[0].text for c in openai_client.completions.create(
        model="tiny", prompt=PROMPT, stream=True, extra_body=extra)]
    assert "".join(pieces) == expected_text.text


@pytest.mark.parametrize("dtype", ["fp32", "int8"])  # one request at a time; int8: through the batcher
def test_a_stream_merges_the_steps_within_its_interval(chat_dir, reference, tmp_path, dtype):
    """The first text goes out at once; later steps that commit within ``stream_interval_s`` of the last chunk
    go out merged, here (an interval longer than the answer) as one chunk at the end. Text and usage as ever."""
    expected = reference.generate(CHAT, method="ngram", max_new_tokens=24)
    assert expected.stats.forward_passes > 2  # steps enough to merge
    model = paradecode.load(chat_dir, dtype=dtype, cache_dir=tmp_path)
    if dtype == "int8":
        expected = model.generate(CHAT, method="ngram", max_new_tokens=24)
    with serving(model, method="ngram", max_new_tokens=24, stream_interval_s=30.0) as base:
        started = time.monotonic()
        chunks = list(client(base).chat.completions.create(model="tiny", messages=CHAT, stream=True,
                                                           stream_options={"include_usage": True}))
        assert time.monotonic() - started < 20  # the end of the answer does not wait for the interval
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert len(deltas) == 2 and "".join(deltas) == expected.text
        assert chunks[-1].usage.completion_tokens == len(expected.token_ids)
        pieces = [c.choices[0].text for c in client(base).completions.create(
            model="tiny", prompt=PROMPT, stream=True, max_tokens=24) if c.choices[0].text]
        assert len(pieces) == 2


def test_token_prompt_stop_length_and_seeded_sampling(url, reference):
    openai_client = client(url)
    ids = reference.encode(PROMPT, chat=False)
    by_ids = openai_client.completions.create(model="tiny", prompt=ids, max_tokens=5)
    assert by_ids.choices[0].text == reference.generate(ids, method="pld", max_new_tokens=5).text
    assert by_ids.choices[0].finish_reason == "length" and by_ids.usage.completion_tokens == 5

    full = reference.generate(PROMPT, method="pld", max_new_tokens=24, chat=False).text
    stop = full.split()[4]
    stopped = openai_client.completions.create(model="tiny", prompt=PROMPT, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].text
    assert full.startswith(stopped.choices[0].text)

    sampled = openai_client.completions.create(model="tiny", prompt=PROMPT, temperature=0.9, seed=7, top_p=0.9,
                                               extra_body={"paradecode": {"method": "ar"}})
    expected = reference.generate(PROMPT, method="ar", max_new_tokens=24, chat=False, temperature=0.9, seed=7,
                                  top_p=0.9)
    assert sampled.choices[0].text == expected.text


def test_models_health_and_metrics(url):
    assert [m.id for m in client(url).models.list().data] == ["tiny"]
    assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
    generated = metric(url, "paradecode_generated_tokens_total", method="pld")
    forwards = metric(url, "paradecode_target_forward_passes_total", method="pld")
    ttft = metric(url, "paradecode_time_to_first_token_seconds_count", method="pld")
    answer = client(url).completions.create(model="tiny", prompt=PROMPT, max_tokens=10)
    stats = answer.model_extra["paradecode"]
    assert metric(url, "paradecode_generated_tokens_total", method="pld") == generated + 10
    assert metric(url, "paradecode_target_forward_passes_total", method="pld") == forwards + stats["forward_passes"]
    assert metric(url, "paradecode_time_to_first_token_seconds_count", method="pld") == ttft + 1
    assert metric(url, "paradecode_http_requests_total", endpoint="/v1/completions", status="200") >= 1
    assert metric(url, "paradecode_requests_running") == 0


def test_sixteen_concurrent_streams_are_complete_and_unmixed(url, reference):
    words = [f"w{i}" for i in range(5, 45)]
    prompts = [" ".join(words[i: i + 6] * 2) for i in range(32)]  # a different prompt, hence text, per request
    expected = [reference.generate(p, method="pld", max_new_tokens=24, chat=False).text for p in prompts]
    assert len(set(expected)) > 16

    async def one_client(async_client, mine: list[int]) -> list[tuple[int, str, str]]:
        results = []
        for i in mine:
            stream = await async_client.completions.create(model="tiny", prompt=prompts[i], stream=True)
            texts, finish = [], None
            async for chunk in stream:
                texts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            results.append((i, "".join(texts), finish))
        return results

    async def load() -> list:
        async_client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        clients = [one_client(async_client, [c, c + 16]) for c in range(16)]
        return await asyncio.wait_for(asyncio.gather(*clients), timeout=120)

    results = [r for per_client in asyncio.run(load()) for r in per_client]
    assert sorted(i for i, _, _ in results) == list(range(32))
    for i, text, finish in results:
        assert text == expected[i], f"request {i} got another's or a partial answer"
        assert finish in ("stop", "length")


def test_concurrent_requests_share_passes_and_each_equals_its_solo_run(chat_dir):
    """Continuous batching on the native int8 forward: 8 concurrent requests (mixed methods, lengths, streaming
    or not, seeded sampling with n=2) get exactly what each gets alone, and their passes were shared."""
    model, reference = paradecode.load(chat_dir, dtype="int8"), paradecode.load(chat_dir, dtype="int8")
    if model.batcher() is None:
        pytest.skip("the native int8 forward could not be built here")
    words = [f"w{i}" for i in range(5, 45)]
    cases = [dict(method="pld", max_tokens=30), dict(method="ngram", max_tokens=20), dict(method="ar", max_tokens=25),
             dict(method="pld-tree", max_tokens=18), dict(method="jacobi", max_tokens=22),
             dict(method="ar", max_tokens=20, temperature=0.9, seed=5, n=2), dict(method="lookahead", max_tokens=16),
             dict(method="auto", max_tokens=28)]
    prompts = [" ".join(words[3 * i: 3 * i + 5] * 2) for i in range(len(cases))]
    expected = []
    for prompt, case in zip(prompts, cases):
        seeds = [case["seed"] + i for i in range(case.get("n", 1))] if "seed" in case else [None]
        expected.append([reference.generate(prompt, chat=False, method=case["method"], max_new_tokens=case["max_tokens"],
                                            temperature=case.get("temperature", 0.0), seed=seed).text
                         for seed in seeds])

    async def one(async_client, i: int) -> list[str]:
        case = dict(cases[i])
        extra = {"paradecode": {"method": case.pop("method")}}
        if i % 2:  # streamed
            texts = [""] * case.get("n", 1)
            stream = await async_client.completions.create(model="tiny", prompt=prompts[i], stream=True,
                                                           extra_body=extra, **case)
            async for chunk in stream:
                for choice in chunk.choices:
                    texts[choice.index] += choice.text
            return texts
        answer = await async_client.completions.create(model="tiny", prompt=prompts[i], extra_body=extra, **case)
        return [choice.text for choice in sorted(answer.choices, key=lambda c: c.index)]

    async def load() -> list:
        async_client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        return await asyncio.wait_for(asyncio.gather(*(one(async_client, i) for i in range(len(cases)))), 120)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import server_load  # the load test reads the same histograms per level

    with serving(model, method="pld", max_batch=16) as base:
        before = asyncio.run(server_load.batch_histograms(base))
        assert asyncio.run(load()) == expected
        shared = metric(base, "paradecode_batch_sequences_sum") / metric(base, "paradecode_batch_sequences_count")
        assert shared > 1.5, "the requests' passes were not shared"
        level = server_load.batch_report(before, asyncio.run(server_load.batch_histograms(base)))
        assert level["passes"] == metric(base, "paradecode_batch_rows_count") - before["paradecode_batch_rows"]["+Inf"]
        assert sum(level["passes_by_rows"].values()) == level["passes"] and level["requests_per_pass"] > 1.5
        assert level["rows_per_pass"] >= level["requests_per_pass"]
        assert metric(base, "paradecode_cache_used_slots") == 0 and metric(base, "paradecode_cache_slots") > 0
        assert metric(base, "paradecode_queue_wait_seconds_count") == len(cases)


def test_a_client_leaving_a_batch_frees_its_cache_and_the_others_go_on(chat_dir):
    model, reference = paradecode.load(chat_dir, dtype="int8"), paradecode.load(chat_dir, dtype="int8")
    if model.batcher() is None:
        pytest.skip("the native int8 forward could not be built here")
    model.batcher()._stack = SlowBackend(model.batcher()._stack, pause_s=0.02)  # every shared pass takes >= 20 ms
    expected = reference.generate(PROMPT, chat=False, method="ngram", max_new_tokens=60).text
    with serving(model, method="ar", max_new_tokens=200) as base:
        kept = []
        other = threading.Thread(target=lambda: kept.append(client(base).completions.create(
            model="tiny", prompt=PROMPT, max_tokens=60, extra_body={"paradecode": {"method": "ngram"}})))
        with httpx.stream("POST", f"{base}/v1/completions", json=dict(model="tiny", prompt=PROMPT, stream=True),
                          timeout=10) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            other.start()
            deadline = time.monotonic() + 5
            while metric(base, "paradecode_requests_running") < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert metric(base, "paradecode_cache_used_slots") > 0
        left = time.monotonic()  # the streaming client left mid-batch: its room must be free within a few steps
        while metric(base, "paradecode_requests_total", finish_reason="cancelled") < 1 and time.monotonic() - left < 3:
            time.sleep(0.02)
        assert metric(base, "paradecode_requests_total", finish_reason="cancelled") == 1
        assert metric(base, "paradecode_generated_tokens_total") < 150  # it stopped long before its 200 tokens
        other.join(30)
        assert kept and kept[0].choices[0].text == expected
        assert metric(base, "paradecode_cache_used_slots") == 0


def test_a_failed_shared_pass_is_a_500_and_the_server_goes_on(chat_dir, caplog):
    from test_batching import FailingOnce

    model, reference = paradecode.load(chat_dir, dtype="int8"), paradecode.load(chat_dir, dtype="int8")
    if model.batcher() is None:
        pytest.skip("the native int8 forward could not be built here")
    model.batcher()._stack = FailingOnce(model.batcher()._stack)
    with serving(model, method="pld", max_new_tokens=16) as base:
        failed = httpx.post(f"{base}/v1/completions", json=dict(model="tiny", prompt=PROMPT), timeout=30)
        assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
        answer = client(base).completions.create(model="tiny", prompt=PROMPT)
        assert answer.choices[0].text == reference.generate(PROMPT, chat=False, method="pld", max_new_tokens=16).text
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
        assert metric(base, "paradecode_cache_used_slots") == 0


class SlowBackend:
    """The model's backend with a pause in every forward pass, so a generation lasts long enough to interrupt."""

    def __init__(self, inner, pause_s: float) -> None:
        self.inner, self.pause_s = inner, pause_s

    def forward(self, *args, **kwargs):
        time.sleep(self.pause_s)
        return self.inner.forward(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_disconnect_stops_generation_and_frees_the_model(tmp_path):
    model = paradecode.load(str(tiny_model_dir(tmp_path / "tiny")))  # no chat template: chat requests get 400
    model.backend = SlowBackend(model.backend, pause_s=0.03)  # 200 tokens would take >= 6 s
    with serving(model, method="ar", max_new_tokens=200, max_waiting=1) as base:
        request = dict(model="tiny", prompt=PROMPT, stream=True)
        with httpx.stream("POST", f"{base}/v1/completions", json=request, timeout=10) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            start = time.monotonic()  # the event loop answers while the worker decodes
            assert httpx.get(f"{base}/health", timeout=5).status_code == 200 and time.monotonic() - start < 1
            assert metric(base, "paradecode_requests_running") == 1
            with pytest.raises(httpx.ReadTimeout):  # queued behind the stream; its client gives up waiting
                httpx.post(f"{base}/v1/completions", json=dict(model="tiny", prompt=PROMPT), timeout=0.3)
            busy = httpx.post(f"{base}/v1/completions", json=dict(model="tiny", prompt=PROMPT), timeout=5)
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_error"  # the queue holds 1
        # The stream's client left after a few tokens: the model must be free long before 6 s.
        # The server notices the disconnect on its own schedule (a busy machine delays it), so a request may
        # still find the queue full for a moment: ask again until the slot frees, within the time limit.
        start = time.monotonic()
        answer = httpx.post(f"{base}/v1/completions", json=dict(model="tiny", prompt=PROMPT, max_tokens=3), timeout=5)
        while answer.status_code == 503 and time.monotonic() - start < 3:
            time.sleep(0.05)
            answer = httpx.post(f"{base}/v1/completions", json=dict(model="tiny", prompt=PROMPT, max_tokens=3),
                                timeout=5)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
        assert time.monotonic() - start < 3
        assert metric(base, "paradecode_requests_total", finish_reason="cancelled") == 2
        assert metric(base, "paradecode_generated_tokens_total") < 60  # the cancelled stream stopped early
        chat = httpx.post(f"{base}/v1/chat/completions", json=dict(messages=CHAT), timeout=5)
        assert chat.status_code == 400 and "no chat template" in chat.json()["error"]["message"]


LONG = " ".join(["w5"] * 300)  # more tokens than the tiny model's 256-token context
CHAT_BODY = dict(model="tiny", messages=CHAT)


@pytest.mark.parametrize("path, body, status, fragment, param", [
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, "not valid JSON", None),
    ("/v1/chat/completions", b"[1, 2]", 400, "valid dictionary", None),
    ("/v1/chat/completions", dict(model="tiny"), 400, "messages", "messages"),
    ("/v1/chat/completions", dict(CHAT_BODY, model="gpt-4"), 404, "not served here", "model"),
    ("/v1/chat/completions", dict(CHAT_BODY, paradecode={"method": "nope"}), 400, "unknown method", None),
    ("/v1/chat/completions", dict(CHAT_BODY, paradecode={"method": "pld", "options": {"depth": 3}}), 400,
     "no option depth", None),
    ("/v1/chat/completions", dict(CHAT_BODY, paradecode={"options": {"num_draft": "many"}}), 400, "integer", None),
    ("/v1/chat/completions", dict(CHAT_BODY, paradecode={"method": "draft", "options": {"draft_model": "/etc"}}),
     400, "cannot load other models", "paradecode.options.draft_model"),
    ("/v1/chat/completions", dict(CHAT_BODY, paradecode={"speed": "max"}), 400, "Extra inputs", "paradecode.speed"),
    ("/v1/chat/completions", dict(CHAT_BODY, temperature=-1), 400, "temperature", None),
    ("/v1/chat/completions", dict(CHAT_BODY, top_p=1.5), 400, "top-p", None),
    ("/v1/chat/completions", dict(CHAT_BODY, max_tokens=0), 400, "max_tokens", "max_tokens"),
    ("/v1/chat/completions", dict(CHAT_BODY, max_tokens="lots"), 400, "integer", "max_tokens"),
    ("/v1/chat/completions", dict(CHAT_BODY, n=9), 400, "n must be at most 8", "n"),
    ("/v1/chat/completions", dict(CHAT_BODY, n=0), 400, "greater than or equal to 1", "n"),
    ("/v1/chat/completions", dict(CHAT_BODY, top_logprobs=2), 400, "needs logprobs", "top_logprobs"),
    ("/v1/chat/completions", dict(CHAT_BODY, logprobs=True, top_logprobs=21), 400, "less than or equal to 20",
     "top_logprobs"),
    ("/v1/completions", dict(model="tiny", prompt="w3", logprobs=21), 400, "less than or equal to 20", "logprobs"),
    ("/v1/chat/completions", dict(CHAT_BODY, presence_penalty=0.5), 400, "supported: n, logprobs",
     "presence_penalty"),
    ("/v1/chat/completions", dict(CHAT_BODY, stop=[""]), 400, "stop strings", None),
    ("/v1/chat/completions", dict(CHAT_BODY, seed=2**70), 400, "less than", "seed"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "w3"}], "temperature": Infinity}', 400,
     "finite number", "temperature"),
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
     400, "only text", "messages.0.content"),
    ("/v1/chat/completions", dict(model="tiny", messages=[]), 400, "messages is empty", "messages"),
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "narrator", "content": "w3"}]), 400,
     "unknown role 'narrator'", "messages.0.role"),
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "tool", "content": "w3"}]), 400, "no tool role",
     "messages"),
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "user", "content": LONG}]), 400,
     "context holds 256", "messages"),
    ("/v1/chat/completions", dict(CHAT_BODY, stream=True, messages=[{"role": "user", "content": LONG}]), 400,
     "context holds 256", "messages"),
    ("/v1/completions", dict(model="tiny", prompt=LONG), 400, "context holds 256", "prompt"),
    ("/v1/completions", dict(model="tiny", prompt="  "), 400, "prompt is empty", None),
    ("/v1/completions", dict(model="tiny", prompt=["w3", "w4"]), 400, "one prompt per request", "prompt"),
    ("/v1/completions", dict(model="tiny", prompt=[3, 99999]), 400, "token ids", "prompt"),
    ("/v1/completions", dict(model="tiny", prompt="w3", echo=True), 400, "echo", "echo"),
    ("/v1/completions", dict(model="tiny", prompt=" ".join(["w5"] * 10_000)), 413, "larger than", None),
    ("/v1/embeddings", dict(model="tiny", input="w3"), 404, "Not Found", None),
])
def test_bad_requests_get_openai_errors(url, path, body, status, fragment, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json"}, timeout=10)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and fragment in error["message"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if "context holds" in fragment:
        assert error["code"] == "context_length_exceeded"


def test_server_survives_bad_input(url):
    chunked = (piece for piece in [b'{"model": "tiny", "prompt": "', b"w5 " * 10_000, b'"}'])  # no content-length
    assert httpx.post(f"{url}/v1/completions", content=chunked, timeout=10).status_code == 413
    assert httpx.get(f"{url}/v1/completions", timeout=10).status_code == 405
    with pytest.raises(openai.NotFoundError):
        client(url).chat.completions.create(model="other", messages=CHAT)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert client(url).completions.create(model="tiny", prompt=PROMPT, max_tokens=4).usage.completion_tokens == 4


def test_choice_threads_are_reused_never_more_than_the_running_choices():
    """The worker keeps its choices' threads (a new thread's first forward cost ~4 ms more); with at most 3
    choices running at once (the worker's slots), 40 choices run on at most 3 threads."""
    from paradecode.server.worker import Threads

    threads, slots, ended = Threads("test-choice"), threading.Semaphore(3), threading.Semaphore(0)
    names = []

    def then():
        slots.release()
        ended.release()

    for _ in range(40):
        slots.acquire()
        threads.submit(lambda: names.append(threading.current_thread().name), then=then)
    for _ in range(40):
        assert ended.acquire(timeout=10)
    assert len(names) == 40 and len(set(names)) == threads.started <= 3


def test_connections_send_without_waiting_for_acks():
    """The server's connections have Nagle's algorithm off: with it on, a keep-alive response's body (sent after
    its headers) waited for the client's delayed ACK, 40 ms per request on Linux. uvicorn serves ``bind``'s socket
    with asyncio's ``create_server(sock=...)``, as here."""
    listener = bind("127.0.0.1", 0)
    listener.listen()

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        made = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                made.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await loop.create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(made, 10)
        finally:
            writer.close()
            server.close()

    try:
        assert asyncio.run(accepted_nodelay()) != 0
    finally:
        listener.close()


def test_serve_command_errors(capsys, chat_dir, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert cli.main(["serve", "--model", chat_dir, "--port", port]) == 2
        assert "in use" in capsys.readouterr().err
    assert cli.main(["serve", "--model", chat_dir, "--method", "nope"]) == 2
    assert "unknown method" in capsys.readouterr().err
    for interval in ("-1", "nan", "11"):
        assert cli.main(["serve", "--model", chat_dir, "--stream-interval", interval]) == 2
        assert "--stream-interval must be between 0 and 10 seconds" in capsys.readouterr().err
    real_find_spec = __import__("importlib").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None if name == "uvicorn" else real_find_spec(name))
    assert cli.main(["serve", "--model", chat_dir]) == 2
    assert "pip install 'paradecode[serve]'" in capsys.readouterr().err


def test_serve_command_runs_a_server(chat_dir):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    src = str(Path(paradecode.__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    process = subprocess.Popen([sys.executable, "-m", "paradecode.cli", "serve", "--model", chat_dir, "--port",
                                str(port), "--method", "pld", "--max-new-tokens", "8", "--log-level", "warning"],
                               env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "paradecode serve did not come up"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        answer = client(f"http://127.0.0.1:{port}").completions.create(model=chat_dir, prompt=PROMPT)
        assert answer.usage.completion_tokens <= 8 and answer.model_extra["paradecode"]["method"] == "pld"
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: uvicorn shuts down, then the CLI says "interrupted" (130)
        _, err = process.communicate(timeout=20)
    # 0 where SIGINT is ignored (a background job's child): uvicorn still stops, and re-raises nothing.
    assert process.returncode in (0, 130) and "serving" in err and "Traceback" not in err


def test_the_pass_histograms_are_read_from_the_batchers_counts_at_each_scrape():
    """A shared pass does no metrics work: /metrics makes the histograms from the batcher's counts when scraped."""
    from paradecode.server.metrics import Metrics

    class Counts:
        rows, sequences = {1: 5, 3: 2, 40: 1}, {1: 7, 2: 1}

        def pass_counts(self):
            return dict(self.rows), dict(self.sequences)

    counts, metrics = Counts(), Metrics()
    metrics.watch(counts)

    def scraped() -> dict:
        found = {}
        for family in text_string_to_metric_families(metrics.render().decode()):
            for sample in family.samples:
                if sample.name.startswith("paradecode_batch_"):
                    found[(sample.name, sample.labels.get("le"))] = sample.value
        return found

    first = scraped()
    assert [first[("paradecode_batch_rows_bucket", le)] for le in ("1.0", "2.0", "4.0", "32.0", "64.0", "+Inf")] == [
        5, 5, 7, 7, 8, 8]
    assert first[("paradecode_batch_rows_sum", None)] == 5 + 6 + 40 and first[("paradecode_batch_rows_count", None)] == 8
    assert first[("paradecode_batch_sequences_bucket", "1.0")] == 7 and first[("paradecode_batch_sequences_sum", None)] == 9
    counts.rows[600] = 2  # two more passes, past the last bound
    second = scraped()
    assert second[("paradecode_batch_rows_bucket", "512.0")] == 8 and second[("paradecode_batch_rows_bucket", "+Inf")] == 10
