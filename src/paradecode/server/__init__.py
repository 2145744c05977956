"""An OpenAI-compatible HTTP server over the Python API (``paradecode serve``; needs ``paradecode[serve]``).

protocol.py  OpenAI's request/response schema as pydantic models, plus the ``paradecode`` extension
app.py       ``create_app(model, defaults)``: the FastAPI app and its endpoints
inputs.py    request -> ``Model.stream`` arguments: the server's defaults and every check on a request
worker.py    the one thread that runs ``Model.stream`` for queued requests, in order
render.py    results as OpenAI responses and stream chunks
metrics.py   Prometheus metrics (``/metrics``)
commands.py  the ``serve`` subcommand
"""
