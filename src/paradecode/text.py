"""Text is a view over tokens: the output's text, its stop strings, and what a stream may show so far.

The engine sees token ids only; it asks ``stop_cut`` where a step's tokens complete a stop string. Everything
that turns output tokens into text for a reader goes through ``OutputText``: ``Model.generate``, ``Model.stream``
and so the CLI and the server. The text of an output is ``decode(tokens)`` cut before the first stop string it
contains. A stream shows, after each step, that text less a tail that could still change: an incomplete UTF-8
character (decoded as U+FFFD) and the longest tail that is the start of a stop string (``"1, 2, 3, 4, "`` with
stop ``", 5"`` shows ``"1, 2, 3, 4"`` until the next token decides). The concatenated stream is then exactly the
returned text, for any stop list, method or step size (as llama.cpp's server and vLLM's detokenizer hold back).
Both the engine's stop check and ``OutputText`` read the output's text from an ``IncrementalText``, which decodes
a window of the newest tokens each step.
"""

from __future__ import annotations

from typing import Callable, Sequence

Decode = Callable[[list[int]], str]  # output token ids -> text


def stop_index(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string in ``text`` begins, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that a stop string starts with (and could still complete)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[len(text) - n:]):
                longest = n
                break
    return longest


def stop_cut(text: "IncrementalText", stops: Sequence[str], new_tokens: list[int]) -> int | None:
    """The fewest of ``new_tokens`` after the output ``text`` holds whose text completes a stop string, or None
    (the engine's check: tokens after that one are dropped)."""
    if not stops or stop_index(text.peek(new_tokens), stops) is None:
        return None
    return next(m for m in range(1, len(new_tokens) + 1) if stop_index(text.peek(new_tokens[:m]), stops)
                is not None)


class IncrementalText:
    """The text of a growing list of tokens, ``decode(tokens)``, from a window of the newest tokens: a step
    decodes about ``2 x CONTEXT`` tokens, not the whole output (whose decode each step made an answer's text cost
    quadratic time: at 128 tokens ~0.12 ms of a 5.5 ms step of SmolLM2-135M, measured on an Intel Xeon).

    The window begins ``CONTEXT`` tokens or more before the tokens whose text is not settled yet (a tokenizer
    writes a piece differently at the start of a text: SentencePiece drops its leading space), and the text of
    its settled head is dropped from its decode. Where new tokens rewrite that head (byte-fallback pieces: a
    character's first byte after another character in bytes turns both into U+FFFD until it is whole), the
    whole output is decoded."""

    CONTEXT = 8  # tokens of settled text a window begins with; it moves on once it holds twice that

    def __init__(self, decode: Decode) -> None:
        self.decode = decode
        self.tokens: list[int] = []
        self._settled = 0  # tokens whose text is known: decode(tokens[:_settled]) == _settled_text
        self._settled_text = ""
        self._start = 0  # where the window begins (<= _settled); decode(tokens[_start:_settled]) == _head
        self._head = ""
        self._peeked: tuple[int, int, list[int], str] | None = None  # the last peek: len(tokens), _start, more, decode

    def peek(self, more: Sequence[int] = ()) -> str:
        """``decode(tokens + more)``, the tokens unchanged. An ``extend`` by the same ``more`` next reuses this
        decode (the engine peeks at a step's tokens for its stop strings, then commits them)."""
        more = list(more)
        window = self.decode(self.tokens[self._start:] + more)
        self._peeked = (len(self.tokens), self._start, more, window)
        return self._text(window, more)[0]

    def extend(self, more: Sequence[int]) -> str:
        """Append ``more``; the text of every token so far."""
        more, peeked, self._peeked = list(more), self._peeked, None
        same = peeked is not None and peeked[:3] == (len(self.tokens), self._start, more)
        self.tokens.extend(more)
        full, window = self._text(peeked[3] if same else self.decode(self.tokens[self._start:]), ())
        if full.endswith("\ufffd"):  # a character's last pieces are still to come: nothing new is settled
            return full
        if window is None:  # whole again after a rewrite: the window's text, if it still ends the whole
            window = self.decode(self.tokens[self._start:])
            if not full.endswith(window):
                self._start, window = 0, full
        self._settled, self._settled_text = len(self.tokens), full
        if self._settled - self._start > 2 * self.CONTEXT:
            for start in range(self._settled - self.CONTEXT, self._settled):
                head = self.decode(self.tokens[start:])
                if full.endswith(head):  # the window may begin there (not inside a character's byte pieces)
                    self._start, window = start, head
                    break
        self._head = window  # decode(tokens[_start:_settled])
        return full

    def _text(self, window: str, more: Sequence[int]) -> tuple[str, str | None]:
        """The whole text from the window's decode (``tokens[_start:] + more``), and that window; None for it
        where the window rewrote its head and the whole was decoded."""
        if window.startswith(self._head):
            return self._settled_text + window[len(self._head):], window
        return self.decode(self.tokens + list(more)), None


class OutputText:
    """The text of a growing output and the part of it a stream may show: ``extend`` with each step's tokens
    returns the new text that is safe to show; ``finish`` returns the rest; ``text`` is everything shown. Each
    step decodes a window of the newest tokens (``IncrementalText``); ``finish`` decodes them all."""

    def __init__(self, decode: Decode, stops: Sequence[str] = ()) -> None:
        self.source = IncrementalText(decode)
        self.stops = tuple(stops)
        self.text = ""  # what has been shown; after finish(), the output's whole text

    @property
    def tokens(self) -> list[int]:
        return self.source.tokens

    def extend(self, new_tokens: Sequence[int]) -> str:
        full = self.source.extend(new_tokens)
        cut = stop_index(full, self.stops)
        if cut is None:
            stable = full.rstrip("\ufffd")  # an incomplete UTF-8 character may still become another one
            cut = len(stable) - stop_prefix_len(stable, self.stops)
        return self._show(full[:cut])

    def finish(self) -> str:
        full = self.source.decode(self.tokens)
        cut = stop_index(full, self.stops)
        return self._show(full if cut is None else full[:cut], final=True)

    def _show(self, visible: str, final: bool = False) -> str:
        if not visible.startswith(self.text):  # a decoder that rewrote earlier text: wait for the final text
            if not final:
                return ""
            visible = self.text + visible[len(self.text):]
        delta = visible[len(self.text):]
        self.text += delta
        return delta

