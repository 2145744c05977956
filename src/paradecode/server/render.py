"""Results as OpenAI objects: one ``Render`` per endpoint turns text, deltas and stats into responses and chunks.

A stream is, per choice (``index``; the ``n`` choices of a request one after another): an opening chunk (chat: the
assistant role), one chunk per text delta (with its tokens' logprobs when asked for), a closing chunk with the
finish reason and the choice's decoding stats; then a usage chunk with no choices when
``stream_options.include_usage``, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, Optional

from pydantic import BaseModel

from paradecode.api import Chunk
from paradecode.server import protocol as p
from paradecode.server.logprobs import CompletionOffsets, chat_logprobs, completion_logprobs


def sse(payload: BaseModel | dict | str) -> str:
    """One server-sent event."""
    if isinstance(payload, BaseModel):  # chunks leave out usage and stats until they have them
        absent = {name for name in ("usage", "paradecode") if getattr(payload, name, True) is None}
        payload = payload.model_dump_json(exclude=absent)
    elif isinstance(payload, dict):
        payload = json.dumps(payload)
    return f"data: {payload}\n\n"


def usage(results: list) -> p.Usage:
    """One prompt, every choice's tokens (as OpenAI counts ``n`` choices)."""
    prompt, completion = len(results[0].prompt_token_ids), sum(len(r.token_ids) for r in results)
    return p.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class Render:
    """Shared by both endpoints: the response id and creation time of one request, and its choices' logprobs
    (``logprobs`` False: none are sent)."""

    prefix = ""  # of the response id
    prompt_field = ""  # the request field that holds the prompt

    def __init__(self, model_name: str, logprobs: bool = False, decode: Optional[Callable] = None) -> None:
        self.model = model_name
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.logprobs = logprobs
        self.decode = decode  # output token ids -> text (completions' text offsets)

    def opening(self, n: int) -> list[BaseModel]:
        return []

    def response(self, choices: list[Choice], usage: p.Usage, stats: dict[str, Any]) -> BaseModel:
        raise NotImplementedError

    def chunk(self, index: int, chunk: Optional[Chunk], finish_reason: Optional[str] = None,
              stats: Optional[dict[str, Any]] = None) -> BaseModel:
        """A stream chunk of choice ``index``: its new text and tokens, or (chunk None) its finish reason."""
        raise NotImplementedError

    def usage_chunk(self, usage: p.Usage) -> BaseModel:
        raise NotImplementedError


class Choice:
    """One finished choice: its text, finish reason and logprob entries (None when not asked for)."""

    def __init__(self, text: str, finish_reason: str, token_ids: list[int], logprobs=None) -> None:
        self.text, self.finish_reason, self.token_ids, self.logprobs = text, finish_reason, token_ids, logprobs


class ChatRender(Render):
    prefix = "chatcmpl"
    prompt_field = "messages"

    def _chunk(self, choices: list, **extra) -> p.ChatCompletionChunk:
        return p.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def opening(self, n: int) -> list[BaseModel]:
        return [self._chunk([p.ChatChunkChoice(index=i, delta=p.DeltaMessage(role="assistant", content=""))])
                for i in range(n)]

    def response(self, choices, usage, stats) -> p.ChatCompletionResponse:
        return p.ChatCompletionResponse(id=self.id, created=self.created, model=self.model, usage=usage,
                                        paradecode=stats, choices=[
            p.ChatChoice(index=i, message=p.ResponseMessage(content=c.text), finish_reason=c.finish_reason,
                         logprobs=chat_logprobs(c.logprobs) if self.logprobs else None)
            for i, c in enumerate(choices)])

    def chunk(self, index, chunk, finish_reason=None, stats=None) -> p.ChatCompletionChunk:
        logprobs = chat_logprobs(chunk.logprobs) if self.logprobs and chunk is not None else None
        delta = p.DeltaMessage(content=None if chunk is None else chunk.text)
        return self._chunk([p.ChatChunkChoice(index=index, delta=delta, logprobs=logprobs,
                                              finish_reason=finish_reason)], paradecode=stats)

    def usage_chunk(self, usage) -> p.ChatCompletionChunk:
        return self._chunk([], usage=usage)


class CompletionRender(Render):
    prefix = "cmpl"
    prompt_field = "prompt"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.offsets: dict[int, CompletionOffsets] = {}  # per choice, as its chunks arrive

    def _object(self, choices: list, **extra) -> p.CompletionResponse:
        return p.CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def _logprobs(self, index: int, token_ids: list[int], text: str, entries) -> Optional[p.CompletionLogprobs]:
        if not self.logprobs:
            return None
        offsets = self.offsets.setdefault(index, CompletionOffsets(self.decode)).add(token_ids, text)
        return completion_logprobs(entries, offsets)

    def response(self, choices, usage, stats) -> p.CompletionResponse:
        return self._object([
            p.CompletionChoice(index=i, text=c.text, finish_reason=c.finish_reason,
                               logprobs=self._logprobs(i, c.token_ids, c.text, c.logprobs))
            for i, c in enumerate(choices)], usage=usage, paradecode=stats)

    def chunk(self, index, chunk, finish_reason=None, stats=None) -> p.CompletionResponse:
        if chunk is None:
            return self._object([p.CompletionChoice(index=index, text="", finish_reason=finish_reason)],
                                paradecode=stats)
        logprobs = self._logprobs(index, chunk.token_ids, chunk.text, chunk.logprobs)
        return self._object([p.CompletionChoice(index=index, text=chunk.text, logprobs=logprobs)])

    def usage_chunk(self, usage) -> p.CompletionResponse:
        return self._object([], usage=usage)
