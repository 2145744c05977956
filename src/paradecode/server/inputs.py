"""From an OpenAI request to ``Model.stream`` arguments: the server's defaults, and every check a request meets.

Everything here runs on the event loop and touches no model state (the method registry and the frozen configs
check methods, options and sampling values); encoding the prompt is left to the worker thread. A bad request
raises ``RequestError``, which carries its HTTP status and OpenAI's error fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from starlette.requests import ClientDisconnect, Request

from paradecode.config import GenerationConfig, SamplingConfig
from paradecode.constraints import grammar_source
from paradecode.errors import ParadecodeError
from paradecode.registry import DEFAULT_METHOD, resolve_method
from paradecode.server import protocol as p


ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # OpenAI's message roles


@dataclass(frozen=True)
class ServerDefaults:
    """What a request gets for the fields it leaves out (the ``serve`` command's flags), and the server's limits."""

    model_name: str  # the id clients send as ``model`` (``/v1/models`` lists it)
    method: str = DEFAULT_METHOD
    options: Mapping[str, Any] = field(default_factory=dict)  # options of ``method``
    draft_model: Optional[str] = None  # the one draft model requests may use
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    max_body_bytes: int = 1_000_000
    max_waiting: int = 256  # queued requests beyond this are refused with 503
    max_n: int = 8  # most choices one request may ask for
    max_batch: int = 32  # most choices decoding at once, their passes packed into shared forwards (1: one at a time)
    max_batch_rows: int = 256  # most rows (tokens) of one shared forward pass
    cache_mb: int = 1024  # the cache the running requests share; a request that does not fit waits for room
    stream_interval_s: float = 0.05  # a stream's steps that commit within this of its last chunk go out merged


class RequestError(ParadecodeError):
    """A bad request with its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing (413) more than ``limit`` bytes, declared or sent."""
    declared = request.headers.get("content-length", "")
    too_large = RequestError(413, f"the request body is larger than this server's limit of {limit} bytes.")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    try:
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise too_large
    except ClientDisconnect:
        raise RequestError(400, "the client went away while sending its request.") from None
    try:
        return json.loads(body)
    except ValueError as error:
        raise RequestError(400, f"the request body is not valid JSON: {error}.") from None


def chat_messages(body: p.ChatCompletionRequest) -> list[dict]:
    """OpenAI messages -> ``[{"role", "content"}]`` with text content (text parts joined)."""
    if not body.messages:
        raise RequestError(400, "messages is empty: send at least one message.", param="messages")
    messages = []
    for i, message in enumerate(body.messages):
        if message.role not in ROLES:
            raise RequestError(400, f"message {i}: unknown role {message.role!r}; a message's role is one of "
                                    f"{', '.join(ROLES)}.", param=f"messages.{i}.role")
        content = message.content
        if isinstance(content, list):
            for part in content:
                if part.type != "text" or part.text is None:
                    raise RequestError(400, f"message {i}: only text content parts are supported, got a "
                                            f"{part.type!r} part.", param=f"messages.{i}.content")
            content = "".join(part.text for part in content)
        messages.append({"role": message.role, "content": content or ""})
    return messages


def prompt_encoder(model, prompt) -> Callable[[], list[int]]:
    """What the worker calls to encode a completion prompt: text (no chat template) or token ids."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise RequestError(400, f"one prompt per request, got {len(prompt)}: send them as separate requests.",
                               param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return lambda: model.encode(prompt, chat=False)
    vocab = len(model.tokenizer)
    if not prompt:
        raise RequestError(400, "the prompt is empty: give some text or token ids.", param="prompt")
    if any(not 0 <= t < vocab for t in prompt):
        raise RequestError(400, f"prompt token ids must lie in [0, {vocab}).", param="prompt")
    return lambda: list(prompt)


def decoding_method(extension: Optional[p.Extension], defaults: ServerDefaults) -> tuple[str, dict]:
    """The request's method and options (the server's when not given), checked by the method resolver."""
    method = (extension and extension.method) or defaults.method
    if extension is not None and extension.options is not None:
        options = dict(extension.options)
    else:
        options = dict(defaults.options) if method == defaults.method else {}
    asked = options.get("draft_model")
    if asked is not None and asked != defaults.draft_model:
        raise RequestError(400, f"this server drafts with {defaults.draft_model or 'no draft model'} only "
                                "(its --draft-model); requests cannot load other models.",
                           param="paradecode.options.draft_model")
    choice = resolve_method(method, options, defaults.draft_model)
    return choice.name, choice.options


def sampling_arguments(body: p.GenerationRequest, defaults: ServerDefaults) -> dict:
    """``Model.stream`` keyword arguments from the request, the server's defaults filling the gaps; validated."""
    given = lambda value, default: default if value is None else value  # noqa: E731
    max_tokens = given(getattr(body, "max_completion_tokens", None), given(body.max_tokens, defaults.max_new_tokens))
    if max_tokens < 1:
        raise RequestError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    try:
        logprobs, top_logprobs = body.logprob_arguments()
    except ValueError as error:
        raise RequestError(400, f"{error}.", param="top_logprobs") from None
    kwargs = dict(max_new_tokens=max_tokens, temperature=given(body.temperature, defaults.temperature),
                  top_k=given(body.top_k, defaults.top_k), top_p=given(body.top_p, defaults.top_p),
                  seed=given(body.seed, defaults.seed),
                  stop=tuple(body.stop_strings()) if body.stop is not None else defaults.stop,
                  logprobs=logprobs, top_logprobs=top_logprobs)
    GenerationConfig(max_new_tokens=max_tokens, stop=kwargs["stop"], sampling=SamplingConfig(
        kwargs["temperature"], kwargs["top_k"], kwargs["top_p"], kwargs["seed"]))
    return kwargs


def structured_arguments(body: p.GenerationRequest) -> dict:
    """``Model.stream``'s structured-output argument from ``response_format`` (``json_object``: any JSON object;
    ``json_schema``: its ``json_schema.schema``) or the extension's ``regex`` / ``grammar``, checked."""
    given: dict[str, Any] = {}
    response_format = getattr(body, "response_format", None)
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_object":
            given["json_schema"] = {"type": "object"}
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise RequestError(400, "response_format of type json_schema needs a JSON schema object in "
                                        "json_schema.schema.", param="response_format.json_schema.schema")
            given["json_schema"] = schema
        elif kind != "text":
            raise RequestError(400, f"response_format.type must be text, json_object or json_schema, got {kind!r}.",
                               param="response_format.type")
    if body.paradecode is not None:
        given.update({name: value for name, value in (("regex", body.paradecode.regex),
                                                      ("grammar", body.paradecode.grammar)) if value is not None})
    try:
        grammar_source(**given)
    except ParadecodeError as error:
        raise RequestError(400, str(error), param="response_format" if "json_schema" in given else "paradecode")
    return given


def choice_arguments(body: p.GenerationRequest, kwargs: dict, defaults: ServerDefaults) -> list[dict]:
    """``Model.stream`` arguments of each of the request's ``n`` choices: choice i samples with seed + i when the
    request (or the server) has a seed, so choice 0 is the answer of the same request with n = 1; without a seed
    each choice draws its own."""
    n = body.n or 1
    if n > defaults.max_n:
        raise RequestError(400, f"n must be at most {defaults.max_n} on this server (its --max-n), got {n}.",
                           param="n")
    seed = kwargs["seed"]
    seeds = [None if seed is None else seed + i - (2**64 if seed + i >= 2**64 else 0) for i in range(n)]
    return [dict(kwargs, seed=s) for s in seeds]
