"""Logprobs are read from the verify pass, not recomputed: every method reports, bit for bit, the logprobs
``ar`` reports (on the int8 backend, whose verify rows equal one-token forwards to the bit); they are the
model's own log_softmax of the row that predicted each token; and the API, ``--json``, and the server (chat and
completions, streamed and not, with ``n`` choices seeded seed + i) all carry them."""

import json

import httpx
import openai
import pytest
import torch

import paradecode
from paradecode import cli
from paradecode.logprobs import LogprobReader, TokenText
from test_int8 import CALIBRATION, METHODS
from test_server import CHAT, chat_dir, serving  # noqa: F401  (chat_dir: a fixture, a tiny model with a chat template)
from tiny import PROMPTS, run_case, tiny_backend, tiny_int8_backend

PROMPT = "w3 w4 w5 w3 w4 w5 w3 w4"


class Names:
    """A stand-in tokenizer for TokenText: token t is 'tN'."""

    all_special_ids: list[int] = []

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return f"t{token_id}"

    def decode(self, ids) -> str:
        return "".join(f"t{t}" for t in ids)


def _logprobs(backend, case, prompt, options, seed, top=3):
    reader = LogprobReader(TokenText(Names()), top)
    tokens, _ = run_case(backend, case, prompt, options, max_new_tokens=30, model_seed=seed, on_commit=reader)
    assert [e.token_id for e in reader.entries] == tokens
    return tokens, [(e.logprob, [(t.token_id, t.logprob) for t in e.top_logprobs]) for e in reader.entries]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_every_method_reports_ars_logprobs_to_the_bit(seed, method, options):
    backend = tiny_int8_backend(seed, CALIBRATION, sharp=4.0)
    for prompt in PROMPTS:
        expected = _logprobs(backend, "ar", prompt, {}, seed)
        assert _logprobs(backend, method, prompt, options, seed) == expected, (method, prompt)


def test_logprobs_are_the_models_distribution_at_each_token():
    backend = tiny_backend(1, sharp=4.0)
    reader = LogprobReader(TokenText(Names()), top_logprobs=4)
    prompt = PROMPTS[0]
    tokens, stats = run_case(backend, "draft-self", prompt, {"num_draft": 4}, max_new_tokens=20, temperature=0.8,
                             seed=3, model_seed=1, on_commit=reader)
    assert stats.forward_passes < 10  # several tokens per step were read from one verify pass
    backend.reset()
    logits = backend.forward(torch.tensor(prompt + tokens)).logits[len(prompt) - 1: -1]  # [20, V] the uncached rows
    expected = torch.log_softmax(logits, -1)  # temperature 0.8 does not enter: the model's own distribution
    for i, entry in enumerate(reader.entries):
        assert entry.token_id == tokens[i] and entry.token == f"t{tokens[i]}"
        assert abs(entry.logprob - float(expected[i, tokens[i]])) < 1e-5
        top = torch.topk(expected[i], 4)
        assert [t.token_id for t in entry.top_logprobs] == top.indices.tolist()
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-5)


@pytest.fixture(scope="module")
def model_dir(chat_dir):
    return chat_dir


def test_api_stream_chunks_and_json_carry_the_logprobs(model_dir, capsys, tmp_path):
    model = paradecode.load(model_dir, dtype="int8", cache_dir=tmp_path)  # logprobs equal under every method
    result = model.generate(PROMPT, method="pld", max_new_tokens=20, logprobs=True, top_logprobs=2, stop=["w13"],
                            chat=False)
    assert len(result.logprobs) == len(result.token_ids) and all(len(e.top_logprobs) == 2 for e in result.logprobs)
    assert [e.token_id for e in result.logprobs] == result.token_ids
    assert model.generate(PROMPT, max_new_tokens=5).logprobs is None  # only when asked for
    stream = model.stream(PROMPT, method="ngram", max_new_tokens=20, logprobs=True, top_logprobs=2, stop=["w13"],
                          chat=False)
    chunks = list(stream.chunks())
    assert "".join(c.text for c in chunks) == result.text
    assert [e for c in chunks for e in c.logprobs] == result.logprobs == stream.result.logprobs
    assert [t for c in chunks for t in c.token_ids] == result.token_ids
    code = cli.main(["generate", "--model", model_dir, "--json", "--logprobs", "2", "--method", "lookahead", "--raw",
                     "--max-new-tokens", "20", "--stop", "w13", "--dtype", "int8", "--cache-dir", str(tmp_path), PROMPT])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["logprobs"] == [e.to_dict() for e in result.logprobs]
    assert cli.main(["generate", "--model", model_dir, "--logprobs", "2", PROMPT]) == 2
    assert "--json" in capsys.readouterr().err


@pytest.mark.parametrize("interval", [0.0, 30.0])  # a chunk per step; the steps after the first merged in one
def test_server_logprobs_chat_and_completions_streamed_and_not(model_dir, tmp_path, interval):
    model = paradecode.load(model_dir, dtype="int8", cache_dir=tmp_path)
    reference = paradecode.load(model_dir, dtype="int8", cache_dir=tmp_path)
    with serving(model, method="pld", max_new_tokens=16, stream_interval_s=interval) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        expected = reference.generate(PROMPT, method="pld", max_new_tokens=16, chat=False, logprobs=True,
                                      top_logprobs=3).logprobs
        completion = client.completions.create(model="tiny", prompt=PROMPT, logprobs=3).choices[0].logprobs
        assert completion.tokens == [e.token for e in expected]
        assert completion.token_logprobs == [e.logprob for e in expected]
        assert completion.top_logprobs == [{t.token: t.logprob for t in e.top_logprobs} for e in expected]
        ids = [e.token_id for e in expected]
        assert completion.text_offset == [len(reference.decode(ids[:i])) for i in range(len(ids))]
        chunks = list(client.completions.create(model="tiny", prompt=PROMPT, logprobs=3, stream=True))
        streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        assert len(streamed) == (2 if interval else len(chunks) - 1)  # every chunk but the closing one
        assert [v for s in streamed for v in s.token_logprobs] == completion.token_logprobs
        assert [v for s in streamed for v in s.text_offset] == completion.text_offset

        with_chat = reference.generate(CHAT, method="ngram", max_new_tokens=16, logprobs=True, top_logprobs=2)
        extra = {"paradecode": {"method": "ngram"}}
        content = client.chat.completions.create(model="tiny", messages=CHAT, logprobs=True, top_logprobs=2,
                                                 extra_body=extra).choices[0].logprobs.content
        assert [(c.token, c.logprob, c.bytes) for c in content] == [
            (e.token, e.logprob, e.bytes) for e in with_chat.logprobs]
        assert [[t.logprob for t in c.top_logprobs] for c in content] == [
            [t.logprob for t in e.top_logprobs] for e in with_chat.logprobs]
        chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, logprobs=True, top_logprobs=2,
                                                     stream=True, extra_body=extra))
        streamed = [c for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                    for c in chunk.choices[0].logprobs.content]
        assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
        plain = client.chat.completions.create(model="tiny", messages=CHAT)
        assert plain.choices[0].logprobs is None


def test_n_choices_are_seeded_seed_plus_i(model_dir):
    model = paradecode.load(model_dir)
    reference = paradecode.load(model_dir)
    with serving(model, method="ar", max_new_tokens=12, max_n=4) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        results = [reference.generate(PROMPT, max_new_tokens=12, chat=False, temperature=1.0, seed=40 + i)
                   for i in range(3)]
        expected, tokens = [r.text for r in results], sum(len(r.token_ids) for r in results)
        assert len(set(expected)) == 3
        reply = client.completions.create(model="tiny", prompt=PROMPT, n=3, temperature=1.0, seed=40)
        assert [c.index for c in reply.choices] == [0, 1, 2] and [c.text for c in reply.choices] == expected
        assert reply.usage.completion_tokens == tokens
        assert reply.usage.prompt_tokens == len(reference.encode(PROMPT, chat=False))
        assert len(reply.model_extra["paradecode"]["choices"]) == 3
        single = client.completions.create(model="tiny", prompt=PROMPT, temperature=1.0, seed=40)
        assert single.choices[0].text == expected[0]  # choice 0 is the n = 1 answer

        chunks = list(client.completions.create(model="tiny", prompt=PROMPT, n=3, temperature=1.0, seed=40,
                                                stream=True, stream_options={"include_usage": True}))
        texts = {i: "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
                 for i in range(3)}
        assert texts == dict(enumerate(expected)) and chunks[-1].usage.completion_tokens == tokens
        assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 3

        chat = client.chat.completions.create(model="tiny", messages=CHAT, n=2, temperature=1.0, seed=7,
                                              extra_body={"paradecode": {"method": "pld"}})
        assert [c.message.content for c in chat.choices] == [
            reference.generate(CHAT, method="pld", max_new_tokens=12, temperature=1.0, seed=7 + i).text
            for i in range(2)]
        too_many = httpx.post(f"{url}/v1/completions", json=dict(prompt=PROMPT, n=5), timeout=10)
        assert too_many.status_code == 400 and "at most 4" in too_many.json()["error"]["message"]
