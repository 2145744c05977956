"""Results as OpenAI objects: one ``Render`` per endpoint turns text, deltas and stats into responses and chunks.

A stream is: an opening chunk (chat: the assistant role), one chunk per text delta, a closing chunk with the
finish reason and the decoding stats, a usage chunk with no choices when ``stream_options.include_usage``,
then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional

from pydantic import BaseModel

from paradecode.server import protocol as p


def sse(payload: BaseModel | dict | str) -> str:
    """One server-sent event."""
    if isinstance(payload, BaseModel):  # chunks leave out usage and stats until they have them
        absent = {name for name in ("usage", "paradecode") if getattr(payload, name, True) is None}
        payload = payload.model_dump_json(exclude=absent)
    elif isinstance(payload, dict):
        payload = json.dumps(payload)
    return f"data: {payload}\n\n"


def usage(result) -> p.Usage:
    prompt, completion = len(result.prompt_token_ids), len(result.token_ids)
    return p.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class Render:
    """Shared by both endpoints: the response id and creation time of one request."""

    prefix = ""  # of the response id
    prompt_field = ""  # the request field that holds the prompt

    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def opening(self) -> list[BaseModel]:
        return []

    def response(self, text: str, finish_reason: str, usage: p.Usage, stats: dict[str, Any]) -> BaseModel:
        raise NotImplementedError

    def chunk(self, text: Optional[str], finish_reason: Optional[str] = None,
              stats: Optional[dict[str, Any]] = None) -> BaseModel:
        raise NotImplementedError

    def usage_chunk(self, usage: p.Usage) -> BaseModel:
        raise NotImplementedError


class ChatRender(Render):
    prefix = "chatcmpl"
    prompt_field = "messages"

    def _chunk(self, choices: list, **extra) -> p.ChatCompletionChunk:
        return p.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def opening(self) -> list[BaseModel]:
        return [self._chunk([p.ChatChunkChoice(delta=p.DeltaMessage(role="assistant", content=""))])]

    def response(self, text, finish_reason, usage, stats) -> p.ChatCompletionResponse:
        choice = p.ChatChoice(message=p.ResponseMessage(content=text), finish_reason=finish_reason)
        return p.ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice],
                                        usage=usage, paradecode=stats)

    def chunk(self, text, finish_reason=None, stats=None) -> p.ChatCompletionChunk:
        delta = p.DeltaMessage(content=text)
        return self._chunk([p.ChatChunkChoice(delta=delta, finish_reason=finish_reason)], paradecode=stats)

    def usage_chunk(self, usage) -> p.ChatCompletionChunk:
        return self._chunk([], usage=usage)


class CompletionRender(Render):
    prefix = "cmpl"
    prompt_field = "prompt"

    def _object(self, choices: list, **extra) -> p.CompletionResponse:
        return p.CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def response(self, text, finish_reason, usage, stats) -> p.CompletionResponse:
        return self._object([p.CompletionChoice(text=text, finish_reason=finish_reason)], usage=usage,
                            paradecode=stats)

    def chunk(self, text, finish_reason=None, stats=None) -> p.CompletionResponse:
        return self._object([p.CompletionChoice(text=text or "", finish_reason=finish_reason)], paradecode=stats)

    def usage_chunk(self, usage) -> p.CompletionResponse:
        return self._object([], usage=usage)
