"""The ``paradecode serve`` command (added to the CLI by ``add_commands``).

    paradecode serve --model smollm2-135m --method pld --host 127.0.0.1 --port 8000

It checks its flags, binds the port (a clear error when it is taken), loads the model once, and serves the
OpenAI-compatible app of ``paradecode.server.app`` with uvicorn until interrupted. The server needs the
``serve`` extra: ``pip install 'paradecode[serve]'``.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import socket
import sys

from paradecode.errors import ParadecodeError

SERVER_PACKAGES = ("fastapi", "uvicorn", "prometheus_client")


def add_commands(commands) -> None:
    from paradecode.arguments import add_decoding_arguments, add_model_arguments
    from paradecode.models import DEFAULT_MODEL

    serve = commands.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve one model over an OpenAI-compatible HTTP API: /v1/chat/completions and /v1/completions "
                    "(streaming or not), /v1/models, /health and Prometheus /metrics. Concurrent requests are "
                    "batched continuously (--max-batch): each answer is exactly what it is alone. The decoding "
                    "flags below are what a request gets for the fields it "
                    "leaves out; a request picks its own method with {\"paradecode\": {\"method\": ..., "
                    "\"options\": {...}}}; --draft-model is the only draft model requests may use. "
                    "Needs: pip install 'paradecode[serve]'.")
    add_model_arguments(serve, DEFAULT_MODEL)
    add_decoding_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 opens it to "
                            "the network, with no authentication)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000)")
    serve.add_argument("--served-model-name",
                       help="the model id clients send and /v1/models lists (default: the --model value)")
    serve.add_argument("--max-body-bytes", type=int, default=1_000_000,
                       help="largest request body accepted; larger ones get 413 (default: 1000000)")
    serve.add_argument("--max-waiting", type=int, default=256,
                       help="requests that may wait for the model; more get 503 (default: 256)")
    serve.add_argument("--max-n", type=int, default=8,
                       help="most choices (n) one request may ask for; choice i samples with seed + i when the "
                            "request has a seed (default: 8)")
    serve.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                       help="uvicorn's log level (default: info, one access line per request)")
    serve.add_argument("--max-batch", type=int, default=32,
                       help="most requests (choices) decoding at once: each step packs their rows (a decode token, "
                            "a draft to verify, a chunk of a new prompt) into one forward pass; each answer is "
                            "exactly what it is alone. 1 decodes one request at a time. Backends other than the "
                            "native int8 forward run one at a time (default: 32)")
    serve.add_argument("--max-batch-rows", type=int, default=256,
                       help="most rows (tokens) in one shared forward pass (default: 256)")
    serve.add_argument("--cache-mb", type=int, default=1024,
                       help="MiB of KV cache the running requests share; each reserves room for its prompt and "
                            "max_tokens when it starts, and a request that does not fit waits (default: 1024)")
    serve.add_argument("--stream-interval", type=float, default=0.05, metavar="SECONDS",
                       help="a streamed answer's first text goes out at once; the steps that commit within this "
                            "many seconds of its last chunk go out merged with the next step's, which saves CPU "
                            "for the forwards (0: a chunk per step; default: 0.05)")
    serve.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    missing = [name for name in SERVER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ParadecodeError(f"`paradecode serve` needs {', '.join(missing)}: pip install 'paradecode[serve]'")
    import uvicorn

    from paradecode.arguments import load_model
    from paradecode.server.app import create_app

    defaults = server_defaults(args)
    listener = bind(args.host, args.port)
    try:
        model = load_model(args)
        app = create_app(model, defaults)
        config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"paradecode: serving {defaults.model_name!r} with method {defaults.method!r} at "
              f"http://{host}:{listener.getsockname()[1]}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
    return 0


def server_defaults(args: argparse.Namespace):
    """The server's defaults from the flags, checked as a request's would be, before the model loads."""
    from paradecode.config import GenerationConfig, SamplingConfig
    from paradecode.registry import parse_options, resolve_method
    from paradecode.server.inputs import ServerDefaults, decoding_method

    if not 0 <= args.port <= 65535:
        raise ParadecodeError(f"--port must be in 0..65535, got {args.port}.")
    if min(args.max_body_bytes, args.max_waiting, args.max_n, args.max_batch, args.max_batch_rows, args.cache_mb) < 1:
        raise ParadecodeError("--max-body-bytes, --max-waiting, --max-n, --max-batch, --max-batch-rows and "
                              "--cache-mb must be positive.")
    if not 0 <= args.stream_interval <= 10:
        raise ParadecodeError(f"--stream-interval must be between 0 and 10 seconds, got {args.stream_interval}.")
    options = parse_options(args.opt)
    defaults = ServerDefaults(
        model_name=args.served_model_name or args.model, method=args.method, options=options,
        draft_model=args.draft_model or options.get("draft_model"), max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=tuple(args.stop),
        max_body_bytes=args.max_body_bytes, max_waiting=args.max_waiting, max_n=args.max_n,
        max_batch=args.max_batch, max_batch_rows=args.max_batch_rows, cache_mb=args.cache_mb,
        stream_interval_s=args.stream_interval)
    method, options = decoding_method(None, defaults)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop=defaults.stop,
                              sampling=SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed))
    resolve_method(method, options).check_sampling(config.sampling.greedy)
    return defaults


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (uvicorn listens on it), or a clear error when that is impossible."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as error:
        raise ParadecodeError(f"cannot listen on {host!r}: {error.strerror}; pass an address such as 127.0.0.1.")
    # proto named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections of a socket whose proto
    # is IPPROTO_TCP. With proto 0 a keep-alive response's body waited for the client's delayed ACK: 40 ms.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            raise ParadecodeError(f"port {port} on {host} is in use: stop what runs there or pick another --port.")
        raise ParadecodeError(f"cannot listen on {host}:{port}: {error.strerror}.") from None
    return listener
