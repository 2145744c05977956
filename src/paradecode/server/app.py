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
import time
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from paradecode.backends.openmp import release_team
from paradecode.errors import ParadecodeError
from paradecode.server import protocol as p
from paradecode.server.inputs import (RequestError, ServerDefaults, chat_messages, choice_arguments, decoding_method,
                                      prompt_encoder, read_json, sampling_arguments, structured_arguments)
from paradecode.server.metrics import CountRequests, Metrics
from paradecode.server.render import ChatRender, Choice, CompletionRender, Render, sse, usage
from paradecode.server.worker import FINISH_REASONS, Busy, Disconnected, Event, Job, Worker


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
    # concurrent requests share forwards where the backend can batch (the native int8 forward) and it is asked for
    batch = model.batcher(defaults.cache_mb, max_rows=defaults.max_batch_rows) if defaults.max_batch > 1 else None
    if batch is not None:
        metrics.watch(batch)
        model.cost_curve  # noqa: B018  measured here if ever (request threads run torch on one OpenMP thread)
    # the loading thread serves HTTP from now on and the worker's threads run the forwards: one OpenMP team
    # (see backends.sequences.Batcher._serve)
    release_team()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.worker = Worker(metrics, defaults.max_waiting, defaults.max_batch, batched=batch is not None,
                                  stream_interval_s=defaults.stream_interval_s)
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
        if batch is not None:
            metrics.observe_cache(batch.used_slots, batch.slots)
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

    async def generate(request: Request, body: p.GenerationRequest, encode: Callable[[], list[int]],
                       render_type: type[Render]) -> Response:
        if body.model is not None and body.model != defaults.model_name:
            raise RequestError(404, f"model {body.model!r} is not served here; this server runs "
                                    f"{defaults.model_name!r} (see /v1/models).", param="model", code="model_not_found")
        unsupported = body.unsupported()
        if unsupported:
            raise RequestError(400, unsupported[1], param=unsupported[0])
        method, options = decoding_method(body.paradecode, defaults)
        kwargs = {**sampling_arguments(body, defaults), **structured_arguments(body)}
        choices = choice_arguments(body, kwargs, defaults)

        def start():  # in the worker thread: one stream per choice
            try:
                prompt_ids = encode()
            except ParadecodeError:
                raise
            except Exception as error:  # e.g. a chat template that refuses a role
                raise RequestError(400, f"could not encode the prompt: {type(error).__name__}: {error}",
                                   param=render_type.prompt_field) from None
            if len(prompt_ids) >= model.backend.max_length:
                raise RequestError(400, f"the prompt has {len(prompt_ids)} tokens but the model's context holds "
                                        f"{model.backend.max_length}: shorten it.", code="context_length_exceeded",
                                   param=render_type.prompt_field)
            streams = []
            try:  # with a batcher each choice reserves its room in the shared cache (waiting for it if need be)
                for choice in choices:
                    streams.append(model.stream(prompt_ids, method=method, options=options, batch=batch, **choice))
            except BaseException:
                for stream in streams:
                    stream.close()
                raise
            finally:
                if batch is not None:
                    release_team()  # starting may have run torch work here (a cost curve measured once)
            return streams

        job = Job(start, method, asyncio.get_running_loop(), stream=bool(body.stream))
        try:
            app.state.worker.submit(job)
        except Busy as error:
            raise RequestError(503, str(error), kind="server_error") from None
        render = render_type(defaults.model_name, logprobs=kwargs["logprobs"], decode=model.decode)
        results = [None] * len(choices)  # choices may end in any order when they run together
        streaming = False  # once the stream's events are handed to the response, it owns the job
        try:  # the first event comes with the first text (or an error before it: then a status code, not a stream)
            first = await job.next_event(request.is_disconnected)
            if first.kind == "error":
                raise first.error
            if body.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                streaming = True
                return StreamingResponse(stream_events(request, job, render, first, len(choices), include_usage),
                                         media_type="text/event-stream")
            event = first
            while True:  # the chunks put together are each choice's result
                if event.kind == "error":
                    raise event.error
                if event.kind == "done":
                    results[event.index] = event.result
                if None not in results:
                    break
                event = await job.next_event(request.is_disconnected)
        except Disconnected:
            return Response(status_code=499)  # nobody reads it
        finally:
            if not streaming:
                job.cancel()  # no-op once done; stops the generation if this handler is interrupted
        answers = [Choice(r.text, finish_reason(r), r.token_ids, r.logprobs) for r in results]
        return JSONResponse(render.response(answers, usage(results), decoding_stats(results, job)).model_dump())

    return app


async def stream_events(request: Request, job: Job, render: Render, first: Event, n: int, include_usage: bool):
    """Server-sent events of one request's ``n`` choices from its ``first`` event on; leaving early (the client
    went away) cancels the job. Events already queued go out in one write with the one before them (the opening
    with the first text; the last text, the end, the usage and [DONE] together): each write wakes the client, and
    on a machine with few cores its work takes time from the forwards."""
    try:
        events = [sse(chunk) for chunk in render.opening(n)]  # written with the first text
        results, event = [], first
        while True:
            if event.kind == "delta":
                events.append(sse(render.chunk(event.index, event.chunk)))
            elif event.kind == "done":
                results.append(event.result)
                events.append(sse(render.chunk(event.index, None, finish_reason(event.result),
                                               decoding_stats([event.result], job))))
            else:
                events.append(sse(error_body(event.error)))
                break
            if len(results) == n:
                if include_usage:
                    events.append(sse(render.usage_chunk(usage(results))))
                break
            if job.events.empty():
                yield "".join(events)
                events = []
                event = await job.next_event(request.is_disconnected)
            else:
                event = job.events.get_nowait()
        events.append(sse("[DONE]"))
        yield "".join(events)
    except Disconnected:
        return
    finally:
        job.cancel()


def finish_reason(result) -> str:
    return FINISH_REASONS.get(result.stats.stop_reason, "stop")


def decoding_stats(results: list, job: Job) -> dict:
    """The decoding stats of one choice, or with several, each choice's under ``choices``; and the job's timings."""
    if len(results) == 1:
        return {**results[0].stats.to_dict(with_steps=False), **job.timings()}
    return {"choices": [r.stats.to_dict(with_steps=False) for r in results], **job.timings()}


