"""Text is a view over tokens: a stop string never leaks into a stream. For a table of 60 (method, stop list)
cases on a tiny model, the concatenated stream equals ``result.text`` and ``Model.generate``'s text, and both
equal the text of the shortest output that completes a stop string, cut before it: through the Python API, the
CLI (streamed terminal output and ``--json``) and the server (streamed and not). Stop strings span token
boundaries, start in the first token, tease (a prefix held back, then released) or never occur. A byte-level
tokenizer adds outputs that end in the middle of a UTF-8 character."""

import io
import json
import random

import httpx
import pytest

import paradecode
from paradecode import cli
from paradecode.text import IncrementalText, OutputText, stop_cut, stop_index, stop_prefix_len
from tiny import tiny_bytes_model_dir, tiny_model_dir

PROMPT = "w3 w4 w5 w3 w4 w5 w3 w4"
MAX_NEW = 30
METHODS = ["ar", "pld", "ngram", "pld-tree", "jacobi", "lookahead"]


def test_stop_helpers():
    assert stop_index("1, 2, 3, 4, 5", ["5", ", 4"]) == 7 and stop_index("abc", ["x"]) is None
    assert stop_prefix_len("1, 2, 3, 4,", [", 5"]) == 1 and stop_prefix_len("1, 2, 3, 4, ", [", 5"]) == 2
    assert stop_prefix_len("abc", ["bcd", "cx"]) == 2 and stop_prefix_len("abc", ["abc"]) == 0
    text = IncrementalText(lambda ids: "".join(chr(ord("a") + t) for t in ids))
    text.extend([0, 1])
    assert stop_cut(text, ["cd"], [2, 3, 4]) == 2 and stop_cut(text, ["zz"], [1]) is None and text.tokens == [0, 1]


def test_stream_holds_back_a_possible_stop_and_incomplete_characters():
    pieces = ["1", ",", " 2", ",", " 3", ",", " 4", ",", " 5", ","]
    view = OutputText(lambda ids: "".join(pieces[i] for i in ids), [", 5", "é"])
    shown = [view.extend([i]) for i in range(len(pieces))]
    assert shown[:7] == ["1", "", ", 2", "", ", 3", "", ", 4"] and shown[7:] == ["", "", ""]
    assert view.finish() == "" and view.text == "1, 2, 3, 4"
    utf8 = "aé😀b".encode()
    view = OutputText(lambda ids: bytes(utf8[i] for i in ids).decode("utf-8", "replace"))
    deltas = [view.extend([i]) for i in range(len(utf8))] + [view.finish()]
    assert "".join(deltas) == "aé😀b" and "\ufffd" not in "".join(deltas) and deltas[2] == "é"


def _sentencepiece():
    """A Llama/Gemma-style decoder from ``tokenizers`` itself (pieces with "▁" for spaces, byte-fallback pieces for
    characters outside the vocabulary, the text's first space dropped), and its outputs as units: a piece, or the
    byte pieces of one character in a row."""
    from tokenizers import Tokenizer, decoders, models

    pieces = ["<unk>", "▁the", "▁cat", "s", "▁", "at", "▁é", "é", ".", "▁sat", "\n", "ab"]
    units = [[i] for i in range(1, len(pieces))]
    for char in "😀€ß":
        for byte in char.encode():
            if f"<0x{byte:02X}>" not in pieces:
                pieces.append(f"<0x{byte:02X}>")
        units.append([pieces.index(f"<0x{byte:02X}>") for byte in char.encode()])
    tokenizer = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    return (lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)), units


@pytest.mark.parametrize("kind", ["bytes", "sentencepiece"])
def test_each_step_decodes_a_window_and_the_text_is_the_whole_decode(kind, tmp_path):
    """For random outputs (multi-byte characters split across tokens and steps, spaces a tokenizer writes
    differently at the start of a text) fed in random step sizes, the text known after every step is the decode
    of the tokens so far, the stream is the whole decode, and each step decodes a window of a bounded number of
    tokens, not the whole output (it did: quadratic in the output's length)."""
    rng = random.Random(0)
    if kind == "bytes":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tiny_bytes_model_dir(tmp_path))
        decode = lambda ids: tokenizer.decode(list(ids))  # noqa: E731
        words = ["the", " cat", " é", "😀", "€", " sat", ".", "\n", " ", "ß"]
        output = lambda: tokenizer.encode("".join(rng.choice(words) for _ in range(rng.randrange(1, 200))))  # noqa
    else:
        decode, units = _sentencepiece()
        output = lambda: sum((rng.choice(units) for _ in range(rng.randrange(1, 200))), [])  # noqa: E731
    sizes = []

    def counting(ids):
        sizes.append(len(ids))
        return decode(ids)

    longest = 0
    for _ in range(30):
        ids = output()
        longest = max(longest, len(ids))
        view, deltas, done = OutputText(counting), [], 0
        while done < len(ids):
            step, settled = rng.choice([1, 1, 1, 2, 3, 5]), view.source._settled
            assert view.source.peek(ids[done: done + step]) == decode(ids[: done + step]), kind  # the stop check's
            assert view.source.tokens == ids[:done], kind  # look ahead changes nothing
            sizes.clear()
            deltas.append(view.extend(ids[done: done + step]))
            done = min(len(ids), done + step)
            source = view.source
            assert source._settled_text == decode(ids[: source._settled]), kind
            if not decode(ids[:done]).endswith("\ufffd"):  # whole characters: all settled, from a window of at most
                assert source._settled == done, kind  # 2 x CONTEXT settled tokens and those not settled before
                assert max(sizes, default=0) <= 2 * IncrementalText.CONTEXT + done - settled, (kind, sizes)
        deltas.append(view.finish())
        assert "".join(deltas) == view.text == decode(ids), kind
    assert longest > 100


def test_extend_after_a_peek_at_the_same_tokens_decodes_them_once():
    """The engine peeks at a step's tokens for its stop strings, then commits them: one decode of the window."""
    calls = []

    def decode(ids):
        calls.append(list(ids))
        return "".join(chr(97 + i % 26) for i in ids)

    text = IncrementalText(decode)
    text.extend([1, 2, 3])
    calls.clear()
    assert text.peek([4, 5]) == "bcdef" and text.extend([4, 5]) == "bcdef"
    assert calls == [[1, 2, 3, 4, 5]]
    calls.clear()
    assert text.peek([6]) == "bcdefg" and text.extend([7]) == "bcdefh"  # other tokens than the peek's: decoded anew
    assert calls == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7]]


def _expected(model, ids: list[int], stops: list[str]) -> tuple[str, list[int], str]:
    """Brute force: the shortest prefix of the unstopped output whose text holds a stop string, cut before it."""
    for m in range(1, len(ids) + 1):
        text = model.decode(ids[:m])
        found = [text.find(s) for s in stops if s in text]
        if found:
            return text[: min(found)], ids[:m], "stop"
    return model.decode(ids), ids, None


def _stop_lists(text: str) -> list[list[str]]:
    words = text.split()
    assert len(words) >= 12, text
    spans = text.index(words[4], len(words[0]))  # where the fifth word starts
    return [
        [words[0]],  # the first token whole: nothing is shown
        [words[0][-1]],  # starts inside the first token
        [words[0][-1] + " " + words[1][:2]],  # the first token's end and the second's start
        [words[3][-1] + " " + words[4][:2]],  # spans a token boundary
        [" " + words[5] + " "],  # three tokens: a space, a word, a space
        [words[6] + " w99"],  # teases: its start is held back, then released
        ["zzz", "w99 w98"],  # never occurs
        [words[8], words[2]],  # the earlier one wins
        [text[spans: spans + 14], text[spans + 3: spans + 5]],  # the later-starting one completes first
        [text[-3:]],  # completes on the last token
    ]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return paradecode.load(str(tiny_model_dir(tmp_path_factory.mktemp("tiny"))))


@pytest.fixture(scope="module")
def table(model):
    """60 cases: (method, stops, expected text, expected token ids, expected stop reason)."""
    reference = model.generate(PROMPT, method="ar", max_new_tokens=MAX_NEW, chat=False)
    assert reference.stats.stop_reason == "max_new_tokens"
    cases = []
    for stops in _stop_lists(reference.text):
        text, ids, reason = _expected(model, reference.token_ids, stops)
        cases += [(method, stops, text, ids, reason) for method in METHODS]
    assert len(cases) >= 50 and sum(reason == "stop" for *_, reason in cases) >= 40
    assert any(text == "" for _, _, text, _, _ in cases)
    return cases


def test_no_stop_strings_given_as_none_is_none_at_all(model):
    plain = model.generate(PROMPT, method="ar", max_new_tokens=8, chat=False)
    assert model.generate(PROMPT, method="ar", max_new_tokens=8, chat=False, stop=None).text == plain.text


def test_stream_equals_generate_on_the_stop_table(model, table):
    for method, stops, text, ids, reason in table:
        stream = model.stream(PROMPT, method=method, max_new_tokens=MAX_NEW, stop=stops, chat=False)
        deltas = list(stream)
        result = model.generate(PROMPT, method=method, max_new_tokens=MAX_NEW, stop=stops, chat=False)
        case = f"{method} {stops!r}"
        assert "".join(deltas) == stream.result.text == result.text == text, case
        assert stream.result.token_ids == result.token_ids == ids, case
        assert all(deltas) and not any(s in result.text for s in stops), case
        assert result.stats.stop_reason == (reason or "max_new_tokens"), case


def test_cli_streamed_and_json_output_on_the_stop_table(model, table, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(paradecode, "load", lambda *args, **kwargs: model)  # one load for 120 commands
    (tmp_path / "config.json").write_text("{}")  # --model must name a model folder; the load itself is stubbed
    for method, stops, text, ids, _ in table:
        argv = ["generate", "--model", str(tmp_path), "--raw", "--method", method, "--max-new-tokens", str(MAX_NEW),
                *[f"--stop={s}" for s in stops], PROMPT]
        assert cli.main(argv) == 0
        printed = capsys.readouterr().out
        assert printed == text + "\n", f"{method} {stops!r}"
        assert cli.main(argv + ["--json"]) == 0
        payload = json.loads(capsys.readouterr().out)
        assert payload["text"] == text and payload["token_ids"] == ids, f"{method} {stops!r}"


def test_server_streamed_and_not_on_the_stop_table(model, table):
    from test_server import serving

    with serving(model, method="ar", max_new_tokens=MAX_NEW) as url:
        for method, stops, text, ids, reason in table:
            body = dict(model="tiny", prompt=PROMPT, stop=stops, paradecode={"method": method})
            answer = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()
            case = f"{method} {stops!r}"
            assert answer["choices"][0]["text"] == text, case
            assert answer["usage"]["completion_tokens"] == len(ids), case
            assert answer["choices"][0]["finish_reason"] == ("stop" if reason else "length"), case
            pieces = []
            with httpx.stream("POST", f"{url}/v1/completions", json=dict(body, stream=True), timeout=30) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        pieces += [c["text"] for c in json.loads(line[6:])["choices"]]
            assert "".join(pieces) == text, case


def test_stream_equals_generate_with_a_byte_level_tokenizer(tmp_path):
    """Random byte-level tokens: outputs end inside UTF-8 characters and hold invalid bytes; stop strings are
    characters and spans of what the model writes."""
    model = paradecode.load(str(tiny_bytes_model_dir(tmp_path / "bytes")))
    rng = random.Random(0)
    checked = 0
    for prompt in ["Café, naïve", "Count to ten: 1, 2,", "日本語", "über alles"]:
        reference = model.generate(prompt, method="ar", max_new_tokens=40, chat=False)
        text = reference.text
        for _ in range(6):
            start = rng.randrange(len(text))
            stops = [text[start: start + rng.randint(1, 4)].replace("\ufffd", "") or "zz"]
            for method in ("ar", "pld", "ngram"):
                stream = model.stream(prompt, method=method, max_new_tokens=40, stop=stops, chat=False)
                deltas = list(stream)
                expected, ids, _ = _expected(model, reference.token_ids, stops)
                assert "".join(deltas) == stream.result.text == expected, (prompt, stops, method)
                assert stream.result.token_ids == ids
                checked += 1
    assert checked == 72


@pytest.mark.parametrize("clean_up", [False, True])
def test_the_models_decode_is_the_tokenizers_whatever_path_it_takes(clean_up, tmp_path):
    """A fast tokenizer that cleans up no spaces decodes in its Rust tokenizer directly (``api._direct_decode``);
    one that does goes through transformers. Either way the text is the tokenizer's own decode, special tokens
    skipped, on byte-level pieces that split characters included."""
    import transformers
    from tokenizers import Tokenizer

    from paradecode.api import _direct_decode
    from tiny import BYTE_TEXT

    path = tiny_bytes_model_dir(tmp_path)
    fast = transformers.AutoTokenizer.from_pretrained(path)
    fast.clean_up_tokenization_spaces = clean_up
    decode = _direct_decode(fast)
    assert isinstance(decode.func.__self__, Tokenizer) is (not clean_up)
    ids = fast.encode(BYTE_TEXT + " don 't , ok .") + [fast.eos_token_id]
    rng = random.Random(0)
    for _ in range(300):
        start = rng.randrange(len(ids))
        piece = ids[start : start + rng.randrange(1, 12)] + ([fast.eos_token_id] if rng.random() < 0.2 else [])
        assert decode(piece) == fast.decode(piece, skip_special_tokens=True)
