"""The public Python API: ``paradecode.load(name)`` -> ``Model`` with ``generate`` and ``stream``.

    model = paradecode.load("smollm2-135m")
    out = model.generate("...", method="pld", max_new_tokens=128)
    out.text, out.token_ids, out.stats
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import tokenizers

from paradecode import utf8
from paradecode.backends import DTYPES as BACKEND_DTYPES
from paradecode.backends.openmp import generation_team, release_team
from paradecode.config import GenerationConfig, SamplingConfig
from paradecode.constraints import Constraint, GrammarCompiler, grammar_source
from paradecode.drafters.base import Drafter
from paradecode.engine import decode
from paradecode.errors import ParadecodeError
from paradecode.logprobs import LogprobReader, TokenLogprob, TokenText
from paradecode.models import DEFAULT_MODEL, default_dtype, resolve
from paradecode.quality import calibration_ids
from paradecode.kept import KeptFile
from paradecode.registry import DEFAULT_METHOD, resolve_method
from paradecode.stats import DecodeStats
from paradecode.text import OutputText

BACKENDS = ("auto", "llama", "hf")
BATCH_CACHE_MB = 1024  # the shared cache of concurrent requests (Model.batcher), by default
DTYPES = ("auto", *BACKEND_DTYPES)  # auto: the model's quantized default where its quality passes the bar (models.default_dtype)


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated tokens only (the prompt is in prompt_token_ids)
    stats: DecodeStats
    prompt_token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None  # one per token id, when asked for (see paradecode.logprobs)

    def to_dict(self, with_steps: bool = False) -> dict:
        data = dict(text=self.text, token_ids=self.token_ids, stats=self.stats.to_dict(with_steps=with_steps))
        if self.logprobs is not None:
            data["logprobs"] = [entry.to_dict() for entry in self.logprobs]
        return data


@dataclass
class Chunk:
    """What one step of a stream adds: text safe to show, and the tokens committed since the last chunk with
    their logprobs (when asked for). The chunks' texts, token ids and logprobs put together are the result's."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None

    def __add__(self, later: "Chunk") -> "Chunk":
        """This chunk and the next one as one (a server sends a stream's steps merged)."""
        logprobs = None if self.logprobs is None else self.logprobs + (later.logprobs or [])
        return Chunk(self.text + later.text, self.token_ids + later.token_ids, logprobs)


def load(
    model: str = DEFAULT_MODEL,
    *,
    backend: str = "auto",
    dtype: str = "auto",
    max_length: int | None = None,
    cache_dir: str | Path | None = None,
) -> "Model":
    """Load a built-in model name, a ``.gguf`` path or a local Hugging Face model directory.

    ``dtype``: ``fp32`` (the checkpoint's weights, agrees with transformers), ``int8`` (our Llama backend's int8
    weights and activations, see ``paradecode.backends.int8``), ``q4`` (a GGUF checkpoint's own
    Q4_0/Q4_1/Q4_K/Q5_0/Q6_K/Q8_0 blocks on the native forward, see ``paradecode.backends.q4``), or ``auto``: the
    model's default, measured within 1% perplexity of fp32 (``paradecode models`` lists the figures), fp32
    otherwise."""
    from transformers import AutoTokenizer

    if backend not in BACKENDS:
        raise ParadecodeError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}.")
    if dtype not in DTYPES:
        raise ParadecodeError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}.")
    model_dir, chat = resolve(model, cache_dir)
    if dtype == "auto":
        dtype = default_dtype(model, backend)
        if dtype == "q4":
            from paradecode.backends import native

            if native.load() is None:  # q4 runs on the native forward only (load has warned why it is missing)
                dtype = "int8"
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        runner = _make_backend(model_dir, backend, max_length, dtype, tokenizer, cache_dir)
    except ParadecodeError:
        raise
    except Exception as error:
        raise ParadecodeError(
            f"could not load model {model!r} from {model_dir}: {type(error).__name__}: {error}"
        ) from None
    release_team()  # loading ran torch work on this thread's team; the first generation makes the one it keeps
    return Model(runner, tokenizer, name=model, model_dir=model_dir, chat=chat and bool(tokenizer.chat_template),
                 cache_dir=cache_dir)


def _make_backend(model_dir: Path, backend: str, max_length: int | None, dtype: str, tokenizer, cache_dir):
    config = json.loads((model_dir / "config.json").read_text())
    from paradecode.backends.llama import ARCHITECTURES, LlamaShape

    if backend == "auto":  # our forward where it runs the checkpoint (a variant it lacks goes to transformers)
        try:
            LlamaShape.from_config(config)
            backend = "llama"
        except (ValueError, KeyError, TypeError):
            backend = "hf"
    if backend == "hf" and dtype != "fp32":
        raise ParadecodeError(f"dtype {dtype} runs on the llama backend only; the hf backend runs fp32.")
    if backend == "llama":
        from paradecode.backends.llama import LlamaBackend

        if config.get("model_type") not in ARCHITECTURES:
            raise ParadecodeError(
                f"the llama backend runs {', '.join(ARCHITECTURES)} models; this one is "
                f"{config.get('model_type')!r}: use --backend hf."
            )
        if dtype in ("int8", "q4"):
            return _load_quantized(dtype, model_dir, max_length, tokenizer, cache_dir)
        return LlamaBackend.from_pretrained(model_dir, max_length=max_length)
    import torch
    from transformers import AutoModelForCausalLM

    from paradecode.backends.hf import HFBackend

    return HFBackend(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), max_length=max_length)


def _load_quantized(dtype: str, model_dir: Path, max_length: int | None, tokenizer, cache_dir):
    from paradecode.models import cache_root

    if dtype == "q4":
        from paradecode.backends.q4_llama import load_q4 as load_quantized
    else:
        from paradecode.backends.int8_llama import load_int8 as load_quantized
    return load_quantized(model_dir, max_length, calibration_ids(tokenizer), cache_root(cache_dir))


class Model:
    """A loaded target model: tokenizer + backend, and the decoding methods that run on it."""

    def __init__(self, backend, tokenizer, *, name: str, model_dir: Path, chat: bool, cache_dir=None) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.name = name
        self.model_dir = Path(model_dir)
        self.chat = chat
        self.cache_dir = cache_dir
        self.eos_ids = _eos_ids(tokenizer, self.model_dir)
        self._draft_backends: dict[str, Any] = {}
        self._hf_model = None
        self._cost_curve: dict[int, float] | None = None
        self._token_text: TokenText | None = None
        self._grammars: GrammarCompiler | None = None
        # what drafters keep across requests on this model, per (method, options): see Drafter.kept_state
        self.method_state: dict[tuple[str, Any], dict] = {}
        self._kept_files: dict[tuple[str, Any], KeptFile] = {}
        self._lock = threading.RLock()  # concurrent requests build the lazily loaded parts once
        self._exclusive = threading.Lock()  # methods that draft on a shared backend take turns (Drafter.exclusive)
        self._batcher = None
        self._decode = _direct_decode(tokenizer)

    @property
    def dtype(self) -> str:
        return self.backend.dtype

    @property
    def cost_curve(self) -> dict[int, float]:
        """Relative time of a forward over T = 1, 2, 4, 8, 16 new tokens on this backend and machine (T=1 -> 1),
        measured on first use (about a second) and kept in the cache per machine; the ``cost`` schedule uses it."""
        with self._lock:
            return self._measured_cost_curve()

    def _measured_cost_curve(self) -> dict[int, float]:
        if self._cost_curve is None:
            from paradecode.models import cache_root
            from paradecode.profile import cached_curve, model_key, relative

            key = model_key(self.model_dir, self.backend)
            self._cost_curve = relative(cached_curve(self.backend, cache_root(self.cache_dir), key))
        return self._cost_curve

    # -- text <-> tokens -------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int] | Sequence[dict], chat: bool | None = None) -> list[int]:
        """Token ids of a prompt: text (wrapped in the chat template when ``chat``, by default for chat models),
        a conversation (a list of ``{"role", "content"}`` messages, see ``encode_chat``), or token ids as they are."""
        if not isinstance(prompt, str):
            prompt = list(prompt)
            if prompt and isinstance(prompt[0], dict):
                return self.encode_chat(prompt)
            return [int(t) for t in prompt]
        prompt = utf8.check(prompt, "the prompt")
        if not prompt.strip():
            raise ParadecodeError("the prompt is empty: give some text to continue or a question to answer.")
        if self.chat if chat is None else chat:
            return self.encode_chat([{"role": "user", "content": prompt}])
        return [int(t) for t in self.tokenizer.encode(prompt)]

    def encode_chat(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of a conversation (``[{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]``)
        in the model's chat template, ready for the assistant's next answer."""
        if not self.tokenizer.chat_template:
            raise ParadecodeError(f"model {self.name!r} has no chat template: run it without chat (--raw).")
        messages = list(messages)
        if not messages:
            raise ParadecodeError("the conversation is empty: give at least one user message.")
        for i, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise ParadecodeError(f"message {i} of the conversation must be a dict with string 'role' and "
                                      f"'content', got {message!r}.")
            utf8.check(message["content"], f"message {i} of the conversation")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(t) for t in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._decode(list(token_ids))

    # -- methods ---------------------------------------------------------------------------------------
    def drafter(self, method: str, options: dict[str, Any] | None = None) -> Drafter:
        return resolve_method(method, options).create(self)

    def load_draft_backend(self, model: str):
        """Backend of a draft model with the same tokenizer (called by the ``draft`` method)."""
        with self._lock:
            return self._load_draft_backend(model)

    def _load_draft_backend(self, model: str):
        if model not in self._draft_backends:
            draft = load(model, cache_dir=self.cache_dir, max_length=self.backend.max_length)
            if draft.tokenizer.get_vocab() != self.tokenizer.get_vocab():
                raise ParadecodeError(
                    f"draft model {model!r} uses a different tokenizer from target {self.name!r}; speculative "
                    "decoding needs both to share one vocabulary. Pick a draft model of the same family."
                )
            self._draft_backends[model] = draft.backend
        return self._draft_backends[model]

    def kept_file(self, method: str, options: Any) -> KeptFile:
        """The cache file where ``method`` with ``options`` keeps what it learned of this model on this machine
        (see ``kept``)."""
        key = (method, options)
        if key not in self._kept_files:
            from paradecode.models import cache_root
            from paradecode.profile import machine_key

            identity = dict(model=str(self.model_dir.resolve()), backend=type(self.backend).__name__,
                            dtype=self.dtype, options=repr(options), machine=machine_key())
            self._kept_files[key] = KeptFile.in_cache(cache_root(self.cache_dir), method, identity)
        return self._kept_files[key]

    # -- many requests at once --------------------------------------------------------------------------
    def batcher(self, cache_mb: int = BATCH_CACHE_MB, **limits):
        """The shared cache and pass batcher of concurrent requests on this model (``backends.sequences``), made on
        first use with ``cache_mb`` MiB of cache and ``limits`` (max_rows, prefill_chunk, max_wait_s); None where
        the backend cannot batch (only the native int8 forward does: requests then run one after another)."""
        with self._lock:
            if self._batcher is None:
                make = getattr(self.backend, "batcher", None)
                self._batcher = (make(cache_mb << 20, **limits) if make is not None else None) or False
            return self._batcher or None

    def generate_batch(self, prompts: Sequence[str | Sequence[int] | dict], *, max_batch: int = 16,
                       progress=None, return_errors: bool = False,
                       **kwargs) -> list[GenerationResult | ParadecodeError]:
        """Decode many prompts at once: up to ``max_batch`` run together, their passes packed into shared forwards
        (``batcher``), each result exactly what ``generate`` gives it alone. A prompt may be a dict holding
        ``prompt`` and its own arguments (method, seed, ...), which override ``kwargs``. ``progress(done, total)``
        is called as results come in. Falls back to one after another where the backend cannot batch. A request
        that fails with a ``ParadecodeError`` (a prompt too long for the context, a bad option) raises it, or with
        ``return_errors`` takes the error's place in the list while the others run on."""
        if max_batch < 1:
            raise ParadecodeError(f"max_batch must be at least 1, got {max_batch}.")
        requests = [dict(kwargs, **p) if isinstance(p, dict) else dict(kwargs, prompt=p) for p in prompts]
        for i, request in enumerate(requests):
            if "prompt" not in request:
                raise ParadecodeError(f"request {i} of the batch has no 'prompt'.")
        # one at a time needs no shared cache: the model's own forward, on this thread, gives the same tokens
        batch = self.batcher() if max_batch > 1 and len(requests) > 1 else None
        done, lock = [0], threading.Lock()

        def one(request: dict) -> GenerationResult | ParadecodeError:
            request = dict(request)
            try:
                result = self.generate(request.pop("prompt"), batch=batch, **request)
            except ParadecodeError as error:
                if not return_errors:
                    raise
                result = error
            if progress is not None:
                with lock:
                    done[0] += 1
                    progress(done[0], len(requests))
            return result

        if batch is None:
            return [one(request) for request in requests]
        self.cost_curve  # noqa: B018  measured here if ever (request threads run torch on one OpenMP thread)
        release_team()  # this thread waits while the batcher's runs the forwards (see Batcher._serve)
        with ThreadPoolExecutor(max_workers=min(max_batch, len(requests)),
                                thread_name_prefix="paradecode-batch") as pool:
            return list(pool.map(one, requests))

    # -- generation ------------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], **kwargs) -> GenerationResult:
        """Decode ``prompt`` (text, or token ids taken as they are); see ``stream`` for the arguments. The text is
        what ``stream`` would show, put together."""
        stream = self.stream(prompt, **kwargs)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt: str | Sequence[int], **kwargs) -> "TextStream":
        """Iterate over text deltas as steps commit tokens (``.chunks()`` gives tokens and logprobs with them);
        ``.result`` holds the full result afterwards. Arguments: method, max_new_tokens, temperature, top_k, top_p,
        seed, stop, chat, options, draft_model; ``logprobs`` (True: each token's log-probability, read from the
        target's logits, see ``paradecode.logprobs``) with ``top_logprobs`` (that many alternatives each); and
        structured output, one of ``json_schema`` (a dict or JSON text), ``regex``, ``grammar`` (Lark or GBNF):
        the output follows it under every method (``paradecode.constraints``). ``batch``: a ``batcher()`` to run
        on a sequence of its shared cache, concurrently with other requests (waits for cache room first)."""
        return TextStream(self, self._start(prompt, **kwargs))

    def _start(
        self,
        prompt: str | Sequence[int],
        *,
        method: str = DEFAULT_METHOD,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = (),
        chat: bool | None = None,
        options: dict[str, Any] | None = None,
        draft_model: str | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        json_schema: dict | str | None = None,
        regex: str | None = None,
        grammar: str | None = None,
        batch=None,
    ) -> "_Run":
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
            raise ParadecodeError(f"top_logprobs must be an integer >= 0, got {top_logprobs!r}.")
        source = grammar_source(json_schema, regex, grammar)
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
            stop=tuple([stop] if isinstance(stop, str) else stop or ()),  # None: no stop strings, as OpenAI's
        )
        options = dict(options or {})
        if draft_model is not None:
            options["draft_model"] = draft_model
        choice = resolve_method(method, options)
        choice.check_sampling(config.sampling.greedy)
        drafter = choice.create(self)
        # measured (once per machine) before the request holds the backend's cache, and only when asked for
        cost_curve = self.cost_curve if drafter.wants_cost_curve() else None
        prompt_ids = self.encode(prompt, chat)
        stats = DecodeStats(method=method)
        reader = LogprobReader(self.token_text, top_logprobs) if logprobs or top_logprobs else None
        with self._lock:
            constraint = None if source is None else Constraint(self.grammars.state(source))
        backend, release = self.backend, None
        if batch is not None:
            from paradecode.backends.sequences import DRAFT_ROOM

            backend = release = batch.open(len(prompt_ids) + max_new_tokens + DRAFT_ROOM, wait=True)
        steps = decode(backend, drafter, prompt_ids, config, eos_ids=self.eos_ids, text_of=self.decode,
                       stats=stats, cost_curve=cost_curve, method_state=self.method_state, on_commit=reader,
                       constraint=constraint)
        if batch is not None and drafter.exclusive:
            steps = _taking_turns(steps, self._exclusive)
        return _Run(config, prompt_ids, stats, steps, reader, release)

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles structured-output grammars for this model's vocabulary (built on first use)."""
        with self._lock:
            return self._grammar_compiler()

    def _grammar_compiler(self) -> GrammarCompiler:
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.eos_ids, self.backend.vocab_size)
        return self._grammars

    @property
    def token_text(self) -> TokenText:
        """Each token's text and bytes, as logprobs report them."""
        if self._token_text is None:
            self._token_text = TokenText(self.tokenizer)
        return self._token_text

    # -- peers for the benchmark -----------------------------------------------------------------------
    @property
    def hf_model(self):
        """The same weights as a transformers model (for ``generate()`` baselines)."""
        if self._hf_model is None:
            import torch
            from transformers import AutoModelForCausalLM

            self._hf_model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        return self._hf_model


class TextStream:
    """Text deltas of a running generation (``paradecode.text.OutputText``: a tail that could still start a stop
    string, or an incomplete UTF-8 character, waits for the next step). Put together they are ``result.text``."""

    def __init__(self, model: Model, run: "_Run") -> None:
        self.model, self.run = model, run
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        return (chunk.text for chunk in self.chunks() if chunk.text)

    def chunks(self) -> Iterator[Chunk]:
        """One chunk per step that shows new text, and a last one with the rest (its text may be empty)."""
        view = OutputText(self.model.decode, self.run.config.stop)
        entries = self.run.logprobs.entries if self.run.logprobs is not None else None
        sent = 0  # tokens handed out in chunks so far
        try:
            with generation_team():  # whether this thread keeps its OpenMP team afterwards (backends.openmp)
                for new_tokens in self.run.steps:
                    delta = view.extend(new_tokens)
                    if delta:
                        yield self._chunk(delta, view.tokens, entries, sent)
                        sent = len(view.tokens)
        finally:  # ended, failed or closed early (a cancelled request): its cache is free for the next one
            self.close()
        delta = view.finish()
        if delta or len(view.tokens) > sent:
            yield self._chunk(delta, view.tokens, entries, sent)
        self.result = GenerationResult(view.text, view.tokens, self.run.stats, self.run.prompt_ids, entries)

    def close(self) -> None:
        """Stop the generation and free what it holds (its sequence of a shared cache); safe to call twice."""
        close = getattr(self.run.steps, "close", None)
        if close is not None:
            close()
        if self.run.release is not None:
            self.run.release.close()

    @staticmethod
    def _chunk(text: str, tokens: list[int], entries: list[TokenLogprob] | None, sent: int) -> Chunk:
        return Chunk(text, tokens[sent:], None if entries is None else entries[sent: len(tokens)])


@dataclass
class _Run:
    config: GenerationConfig
    prompt_ids: list[int]
    stats: DecodeStats
    steps: Iterator[list[int]]
    logprobs: LogprobReader | None = None
    release: Any = None  # what to close when the run ends (its sequence of a shared cache)


def _taking_turns(steps: Iterator[list[int]], lock: threading.Lock) -> Iterator[list[int]]:
    """The steps of a request whose drafter shares a backend with every other request: one such at a time."""
    with lock:
        yield from steps


def _direct_decode(tokenizer) -> Callable[[list[int]], str]:
    """The tokenizer's decode with special tokens skipped. A fast tokenizer that cleans up no spaces decodes in its
    Rust tokenizer directly: the same text without transformers' Python around it, which every streamed step
    (``text.OutputText``) paid right after a forward had pushed it out of the caches."""
    rust = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(rust, tokenizers.Tokenizer) and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return functools.partial(rust.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True)


def _eos_ids(tokenizer, model_dir: Path) -> frozenset[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids.update([eos] if isinstance(eos, int) else (eos or []))
    return frozenset(int(i) for i in ids)
