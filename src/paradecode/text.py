"""Text is a view over tokens: the output's text, its stop strings, and what a stream may show so far.

The engine sees token ids only; it asks ``stop_cut`` where a step's tokens complete a stop string. Everything
that turns output tokens into text for a reader goes through ``OutputText``: ``Model.generate``, ``Model.stream``
and so the CLI and the server. The text of an output is ``decode(tokens)`` cut before the first stop string it
contains. A stream shows, after each step, that text less a tail that could still change: an incomplete UTF-8
character (decoded as U+FFFD) and the longest tail that is the start of a stop string (``"1, 2, 3, 4, "`` with
stop ``", 5"`` shows ``"1, 2, 3, 4"`` until the next token decides). The concatenated stream is then exactly the
returned text, for any stop list, method or step size (as llama.cpp's server and vLLM's detokenizer hold back).
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


def stop_cut(decode: Decode, stops: Sequence[str], output: list[int], new_tokens: list[int]) -> int | None:
    """The fewest of ``new_tokens`` after ``output`` whose text completes a stop string, or None (the engine's
    check: tokens after that one are dropped)."""
    if not stops or stop_index(decode(output + new_tokens), stops) is None:
        return None
    return next(m for m in range(1, len(new_tokens) + 1) if stop_index(decode(output + new_tokens[:m]), stops)
                is not None)


class OutputText:
    """The text of a growing output and the part of it a stream may show: ``extend`` with each step's tokens
    returns the new text that is safe to show; ``finish`` returns the rest; ``text`` is everything shown."""

    def __init__(self, decode: Decode, stops: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stops = tuple(stops)
        self.tokens: list[int] = []
        self.text = ""  # what has been shown; after finish(), the output's whole text

    def extend(self, new_tokens: Sequence[int]) -> str:
        self.tokens.extend(new_tokens)
        full = self.decode(self.tokens)
        cut = stop_index(full, self.stops)
        if cut is None:
            stable = full.rstrip("\ufffd")  # an incomplete UTF-8 character may still become another one
            cut = len(stable) - stop_prefix_len(stable, self.stops)
        return self._show(full[:cut])

    def finish(self) -> str:
        full = self.decode(self.tokens)
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

