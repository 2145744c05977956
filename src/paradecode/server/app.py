"""The FastAPI app: OpenAI-compatible endpoints over one loaded ``Model`` (``create_app(model, defaults)``).

    POST /v1/chat/completions   POST /v1/completions   (``stream: true``: server-sent events, then [DONE])
    GET  /v1/models   GET /health   GET /metrics (Prometheus text)

A handler checks the request (schema, model name, method and options, sampling values) on the event loop, so a
bad request fails at once, then queues a ``Job`` for the worker thread, which encodes the prompt and runs
``Model.stream``. Every error is OpenAI's error object (``{"error": {"message", "type", "param", "code"}}``)
with its status code: 400 bad input, 404 unknown model or path, 413 body too large, 503 queue full, 500 a bug.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from paradecode.config import GenerationConfig, SamplingConfig
from paradecode.drafters.base import build_options
from paradecode.errors import ParadecodeError
from paradecode.registry import get_method
from paradecode.server import protocol as p
from paradecode.server.metrics import CountRequests, Metrics
from paradecode.server.render import ChatRender, CompletionRender, Render, sse, usage
from paradecode.server.worker import FINISH_REASONS, Busy, Disconnected, Job, Worker

log = logging.getLogger("paradecode.server")


@dataclass(frozen=True)
class ServerDefaults:
    """What a request gets for the fields it leaves out (the ``serve`` command's flags), and the server's limits."""

    model_name: str  # the id clients send as ``model`` (``/v1/models`` lists it)
    method: str = "ar"
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


class RequestError(ParadecodeError):
    """A bad request with its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind


def error_body(error: BaseException) -> dict:
    if isinstance(error, RequestError):
        info = p.ErrorInfo(message=str(error), type=error.kind, param=error.param, code=error.code)
    elif isinstance(error, ParadecodeError):
        info = p.ErrorInfo(message=str(error), type="invalid_request_error")
    else:
        info = p.ErrorInfo(message=f"internal error: {type(error).__name__}: {error}", type="server_error")
    return p.ErrorResponse(error=info).model_dump()


def error_response(error: BaseException) -> JSONResponse:
    status = error.status if isinstance(error, RequestError) else 400 if isinstance(error, ParadecodeError) else 500
    return JSONResponse(error_body(error), status_code=status)


def create_app(model, defaults: ServerDefaults) -> FastAPI:
    """The app for ``model`` (a loaded ``paradecode.Model``); its worker thread runs while the app is served."""
    metrics = Metrics()
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.worker = Worker(metrics, defaults.max_waiting)
        yield
        app.state.worker.close()

    app = FastAPI(title="paradecode", description="OpenAI-compatible API over paradecode", lifespan=lifespan)
    app.add_middleware(CountRequests, metrics=metrics)
    app.state.metrics = metrics

    @app.exception_handler(ParadecodeError)
    async def bad_request(request: Request, error: ParadecodeError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:  # logged by the server, which lives on
        return error_response(error)

    @app.exception_handler(ValidationError)
    async def bad_fields(request: Request, error: ValidationError) -> JSONResponse:
        problems = error.errors(include_url=False)
        where = ".".join(str(part) for part in problems[0]["loc"])
        message = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in problems[:3])
        return error_response(RequestError(400, f"invalid request: {message}.", param=where or None))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return error_response(RequestError(error.status_code, f"{request.method} {request.url.path}: {error.detail}"))

    @app.get("/health")
    async def health() -> Response:
        alive = app.state.worker.alive
        return JSONResponse({"status": "ok" if alive else "worker stopped"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models() -> dict:
        return p.ModelList(data=[p.ModelCard(id=defaults.model_name, created=started)]).model_dump()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = p.ChatCompletionRequest.model_validate(await read_json(request, defaults.max_body_bytes))
        if not model.tokenizer.chat_template:
            raise RequestError(400, f"model {defaults.model_name!r} has no chat template: send raw text to "
                                    "/v1/completions instead.", param="messages")
        messages = chat_messages(body)
        return await generate(request, body, lambda: model.encode_chat(messages), ChatRender)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = p.CompletionRequest.model_validate(await read_json(request, defaults.max_body_bytes))
        return await generate(request, body, prompt_encoder(model, body.prompt), CompletionRender)

    async def generate(request: Request, body: p._Request, encode: Callable[[], list[int]],
                       render_type: type[Render]) -> Response:
        if body.model is not None and body.model != defaults.model_name:
            raise RequestError(404, f"model {body.model!r} is not served here; this server runs "
                                    f"{defaults.model_name!r} (see /v1/models).", param="model", code="model_not_found")
        unsupported = body.unsupported()
        if unsupported:
            raise RequestError(400, unsupported[1], param=unsupported[0])
        method, options = decoding_method(body.paradecode, defaults)
        kwargs = sampling_arguments(body, defaults)

        def start():  # in the worker thread
            prompt_ids = encode()
            if len(prompt_ids) >= model.backend.max_length:
                raise RequestError(400, f"the prompt has {len(prompt_ids)} tokens but the model's context holds "
                                        f"{model.backend.max_length}: shorten it.", code="context_length_exceeded",
                                   param="messages" if render_type is ChatRender else "prompt")
            return model.stream(prompt_ids, method=method, options=options, **kwargs)

        job = Job(start, method, asyncio.get_running_loop())
        try:
            app.state.worker.submit(job)
        except Busy as error:
            raise RequestError(503, str(error), kind="server_error") from None
        render = render_type(defaults.model_name)
        try:
            first = await job.next_event(request.is_disconnected)
        except Disconnected:
            return Response(status_code=499)  # nobody reads it
        except BaseException:
            job.cancel()
            raise
        if first.kind == "error":
            raise first.error
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream_events(request, job, render, include_usage),
                                     media_type="text/event-stream")
        try:
            texts = []
            while (event := await job.next_event(request.is_disconnected)).kind == "delta":
                texts.append(event.text)
        except Disconnected:
            return Response(status_code=499)
        finally:
            job.cancel()  # no-op once done; stops the generation if this handler is interrupted
        if event.kind == "error":
            raise event.error
        result = event.result
        return JSONResponse(render.response("".join(texts), FINISH_REASONS.get(result.stats.stop_reason, "stop"),
                                            usage(result), decoding_stats(result, job)).model_dump())

    return app


async def stream_events(request: Request, job: Job, render: Render, include_usage: bool):
    """Server-sent events of one generation; leaving early (the client went away) cancels the job."""
    try:
        for chunk in render.opening():
            yield sse(chunk)
        while (event := await job.next_event(request.is_disconnected)).kind == "delta":
            yield sse(render.chunk(event.text))
        if event.kind == "done":
            result = event.result
            yield sse(render.chunk(None, FINISH_REASONS.get(result.stats.stop_reason, "stop"),
                                   decoding_stats(result, job)))
            if include_usage:
                yield sse(render.usage_chunk(usage(result)))
        else:
            yield sse(error_body(event.error))
        yield sse("[DONE]")
    except Disconnected:
        return
    finally:
        job.cancel()


def decoding_stats(result, job: Job) -> dict:
    return {**result.stats.to_dict(with_steps=False), **job.timings()}


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
    """The request's method and options (the server's when not given), checked by the method registry."""
    method = (extension and extension.method) or defaults.method
    if extension is not None and extension.options is not None:
        options = dict(extension.options)
    else:
        options = dict(defaults.options) if method == defaults.method else {}
    method_class = get_method(method)
    takes_draft_model = dataclasses.is_dataclass(method_class.Options) and "draft_model" in {
        f.name for f in dataclasses.fields(method_class.Options)}
    asked = options.get("draft_model")
    if asked is not None and asked != defaults.draft_model:
        raise RequestError(400, f"this server drafts with {defaults.draft_model or 'no draft model'} only "
                                "(its --draft-model); requests cannot load other models.",
                           param="paradecode.options.draft_model")
    if takes_draft_model and defaults.draft_model:
        options.setdefault("draft_model", defaults.draft_model)
    build_options(method_class, options)
    return method, options


def sampling_arguments(body: p._Request, defaults: ServerDefaults) -> dict:
    """``Model.stream`` keyword arguments from the request, the server's defaults filling the gaps; validated."""
    given = lambda value, default: default if value is None else value  # noqa: E731
    max_tokens = given(getattr(body, "max_completion_tokens", None), given(body.max_tokens, defaults.max_new_tokens))
    if max_tokens < 1:
        raise RequestError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    kwargs = dict(max_new_tokens=max_tokens, temperature=given(body.temperature, defaults.temperature),
                  top_k=given(body.top_k, defaults.top_k), top_p=given(body.top_p, defaults.top_p),
                  seed=given(body.seed, defaults.seed),
                  stop=tuple(body.stop_strings()) if body.stop is not None else defaults.stop)
    GenerationConfig(max_new_tokens=max_tokens, stop=kwargs["stop"], sampling=SamplingConfig(
        kwargs["temperature"], kwargs["top_k"], kwargs["top_p"], kwargs["seed"]))
    return kwargs
