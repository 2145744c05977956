"""OpenAI's request and response schema as pydantic models (the subset paradecode serves), plus its extension.

Requests mirror ``/v1/chat/completions`` and ``/v1/completions``; unknown fields are ignored, as OpenAI-style
servers do, but known fields the server cannot honour (penalties, tools, ``best_of``, ``echo``, ...) are refused
by ``unsupported()`` with a message that says what is supported. The extension is one optional object::

    "paradecode": {"method": "pld", "options": {"num_draft": 4}, "regex": "[0-9]+"}

and every response carries the request's decoding stats under the same key (``DecodeStats.to_dict``).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

# Fields we accept only at their "off" values: (field, the off values, what to say).
_SUPPORTED = ("supported: n, logprobs, top_logprobs, stop, seed, temperature, top_p, top_k, max_tokens, stream, "
              "response_format (text, json_object, json_schema) and the paradecode extension")
_UNSUPPORTED = (
    ("best_of", (None, 1), "best_of must be 1 (use n for several choices)"),
    ("echo", (None, False), "echo is not supported"),
    ("suffix", (None, ""), "suffix (insertion) is not supported"),
    ("presence_penalty", (None, 0, 0.0), "presence_penalty is not supported (it would change the distribution)"),
    ("frequency_penalty", (None, 0, 0.0), "frequency_penalty is not supported (it would change the distribution)"),
    ("logit_bias", (None, {}), "logit_bias is not supported"),
    ("tools", (None, []), "tools are not supported (the models served have no tool-calling template)"),
    ("functions", (None, []), "functions are not supported (the models served have no tool-calling template)"),
)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat; completions' logprobs share it here (OpenAI: 5)


class Extension(BaseModel):
    """The ``paradecode`` request object: a decoding method and its options (see ``paradecode methods``), and
    structured output beyond ``response_format``: a regular expression or a grammar (Lark or GBNF)."""

    model_config = ConfigDict(extra="forbid")
    method: Optional[str] = None  # None: the server's --method
    options: Optional[dict[str, Any]] = None  # None: the server's --opt when the method is the server's
    regex: Optional[str] = None
    grammar: Optional[str] = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: Optional[str] = None  # None: the one model this server runs
    max_tokens: Optional[int] = None  # None: the server's --max-new-tokens
    temperature: Optional[float] = None  # None: the server's --temperature (0 = greedy by default)
    top_p: Optional[float] = None
    top_k: Optional[int] = None  # not OpenAI's; accepted as vLLM does
    seed: Optional[int] = Field(None, ge=-(2**63), lt=2**64)  # what torch's generator takes
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    paradecode: Optional[Extension] = None
    n: Optional[int] = Field(None, ge=1)  # at most the server's --max-n
    # Known to OpenAI, honoured only at their "off" values (see _UNSUPPORTED).
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(field, message) of the first field set to a value this server cannot honour, else None."""
        for name, allowed, message in _UNSUPPORTED:
            if name in type(self).model_fields and getattr(self, name) not in allowed:
                return name, f"{message}; got {name}={getattr(self, name)!r} ({_SUPPORTED})."
        return None

    def logprob_arguments(self) -> tuple[bool, int]:
        """(logprobs on, alternatives per token): chat's ``logprobs`` is a switch with ``top_logprobs`` beside it;
        completions' ``logprobs`` is the number of alternatives. Raises ValueError with the problem."""
        raise NotImplementedError

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: Optional[Union[str, list[ContentPart]]] = None


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[int] = None  # OpenAI's newer name for max_tokens; wins when both are given
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Optional[list[dict[str, Any]]] = None
    functions: Optional[list[dict[str, Any]]] = None
    response_format: Optional[dict[str, Any]] = None

    def logprob_arguments(self) -> tuple[bool, int]:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return bool(self.logprobs), self.top_logprobs or 0


class CompletionRequest(GenerationRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: Optional[int] = None
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    response_format: Optional[dict[str, Any]] = None  # not OpenAI's here; accepted as vLLM does

    def logprob_arguments(self) -> tuple[bool, int]:
        return self.logprobs is not None, self.logprobs or 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: Optional[list[TokenLogprob]] = None
    refusal: Optional[list[TokenLogprob]] = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: Optional[list[dict[str, float]]] = None
    text_offset: list[int]


class ChatChoice(BaseModel):
    index: int = 0
    message: ResponseMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    paradecode: dict[str, Any]


class DeltaMessage(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None
    paradecode: Optional[dict[str, Any]] = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    """Both the full response (``object`` "text_completion") and, with one delta in ``text``, a stream chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    paradecode: Optional[dict[str, Any]] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "paradecode"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
