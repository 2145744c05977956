"""Logprobs in OpenAI's two shapes, from ``paradecode.logprobs.TokenLogprob`` entries (one per generated token).

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``, where
``text_offset`` is where each token's text starts in the choice's text (clamped to the text, so a token after a
stop string points at its end). A stream sends the entries of each chunk's tokens with that chunk; put together
they are the non-streamed list.
"""

from __future__ import annotations

from typing import Callable, Sequence

from paradecode.logprobs import TokenLogprob
from paradecode.server import protocol as p


def chat_logprobs(entries: Sequence[TokenLogprob]) -> p.ChatLogprobs:
    def top(entry: TokenLogprob) -> p.TopLogprob:
        return p.TopLogprob(token=entry.token, logprob=entry.logprob, bytes=entry.bytes)

    return p.ChatLogprobs(content=[
        p.TokenLogprob(token=e.token, logprob=e.logprob, bytes=e.bytes, top_logprobs=[top(t) for t in e.top_logprobs])
        for e in entries])


class CompletionOffsets:
    """Where each token of one choice starts in its text, as the tokens arrive chunk by chunk."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.tokens: list[int] = []
        self.shown = 0  # characters of text sent so far

    def add(self, tokens: Sequence[int], text: str) -> list[int]:
        self.shown += len(text)
        offsets = []
        for token in tokens:
            offsets.append(min(len(self.decode(self.tokens).rstrip("\ufffd")), self.shown))
            self.tokens.append(token)
        return offsets


def completion_logprobs(entries: Sequence[TokenLogprob], offsets: Sequence[int]) -> p.CompletionLogprobs:
    return p.CompletionLogprobs(
        tokens=[e.token for e in entries], token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{t.token: t.logprob for t in e.top_logprobs} for e in entries], text_offset=list(offsets))
