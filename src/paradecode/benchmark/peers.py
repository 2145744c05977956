"""Peers: other implementations measured on the same weights, registered by name like paradecode's methods.

- ``hf``: transformers ``generate()``, greedy, on ``model.hf_model``;
- ``hf-pld``: transformers prompt-lookup assisted generation (``prompt_lookup_num_tokens``);
- ``hf-draft``: transformers assisted generation with the draft model's ``hf_model`` (needs --draft-model);
- ``llamacpp``, ``llamacpp-pld``: llama-cpp-python on the GGUF file, plain and with its prompt lookup, each in a
  child process (``paradecode.benchmark.llamacpp``).

Step figures for transformers come from public hooks only: a forward hook on the target counts its forward
passes and the tokens each pass was fed (so the draft length), a ``streamer`` sees the tokens each step
commits. A figure a peer cannot observe is ``None`` (written as null), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from paradecode.registry import Registry

PEERS = Registry("peer")  # filled below and by benchmark.llamacpp, which this module imports at its end
register_peer = PEERS.register


@dataclass
class PeerRun:
    token_ids: list[int]
    forward_passes: int | None = None  # target forward passes, prefill included (it yields the first token)
    draft_forward_passes: int | None = None
    draft_lengths: list[int] | None = None  # tokens drafted per step
    accepted_lengths: list[int] | None = None  # drafted tokens accepted per step
    accepted_per_step: list[int] | None = None  # tokens committed per step (accepted + the target's own)
    info: dict = field(default_factory=dict)
    wall_time_s: float | None = None  # the peer's own timing of the same span (e.g. in a child process); None:
    #                                   the benchmark's timing around ``generate`` stands


class Peer:
    """Base class: ``Options`` (a frozen dataclass, set with --opt NAME.key=value), ``prepare``, ``generate``."""

    method_name: ClassVar[str] = ""
    Options: ClassVar[type] = type("NoOptions", (), {})

    def __init__(self, options: Any, model: Any, draft_model: str | None = None) -> None:
        self.options, self.model, self.draft_model = options, model, draft_model

    @classmethod
    def requirement(cls, draft_model: str | None) -> str | None:
        """What the user must add for this peer to run (checked before loading anything), or None."""
        return None

    @classmethod
    def unavailable(cls, model: Any) -> str | None:
        """Why this peer cannot run on this machine or model (it is then skipped with a note), or None."""
        return None

    def prepare(self) -> None:
        """Load whatever the peer needs (untimed)."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> PeerRun:
        raise NotImplementedError

    def close(self) -> None:
        """Release what ``prepare`` took (e.g. a child process); called once the run is over."""


# -- transformers -----------------------------------------------------------------------------------------
class _StepRecorder:
    """A forward hook (tokens fed per target pass) plus a streamer (tokens committed per step)."""

    def __init__(self) -> None:
        self.fed: list[int] = []
        self.committed: list[int] = []
        self._saw_prompt = False

    def hook(self, module, args, kwargs, output) -> None:
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else (args[0] if args else None)
        self.fed.append(int(ids.shape[-1]) if ids is not None else 0)

    # streamer protocol (transformers.generation.streamers.BaseStreamer)
    def put(self, value) -> None:
        if not self._saw_prompt:  # generate() first pushes the prompt
            self._saw_prompt = True
            return
        self.committed.append(int(value.numel()))

    def end(self) -> None:
        pass


class _HFPeer(Peer):
    def assistant(self) -> dict:
        """Extra ``generate()`` arguments that turn on assisted generation."""
        return {}

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> PeerRun:
        import torch

        target = self.model.hf_model
        recorder = _StepRecorder()
        extra = self.assistant()
        draft_counter: list[int] = []
        handles = [target.register_forward_hook(recorder.hook, with_kwargs=True)]
        if "assistant_model" in extra:
            handles.append(extra["assistant_model"].register_forward_hook(lambda *a: draft_counter.append(1)))
        eos = sorted(self.model.eos_ids)
        try:
            with torch.inference_mode():
                out = target.generate(
                    torch.tensor([prompt_ids], dtype=torch.long),
                    attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                    max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                    eos_token_id=eos or None, pad_token_id=eos[0] if eos else None,
                    streamer=recorder, **extra,
                )
        finally:
            for handle in handles:
                handle.remove()
        tokens = [int(t) for t in out[0, len(prompt_ids):]]
        drafted = [n - len(prompt_ids) if i == 0 else n - 1 for i, n in enumerate(recorder.fed)]
        complete = len(drafted) == len(recorder.committed) and sum(recorder.committed) == len(tokens)
        return PeerRun(
            token_ids=tokens,
            forward_passes=len(recorder.fed),
            draft_forward_passes=len(draft_counter) if "assistant_model" in extra else 0,
            draft_lengths=drafted if complete else None,
            # a step commits its accepted drafts plus one token of its own (fewer only when cut at EOS / max)
            accepted_lengths=[min(c - 1, d) if c > 0 else 0 for c, d in zip(recorder.committed, drafted)]
            if complete else None,
            accepted_per_step=recorder.committed if complete else None,
        )


@register_peer("hf")
class HFGreedy(_HFPeer):
    """transformers generate(), greedy, on the same weights"""

    def prepare(self) -> None:
        self.model.hf_model


@dataclass(frozen=True)
class HFPromptLookupOptions:
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2


@register_peer("hf-pld")
class HFPromptLookup(_HFPeer):
    """transformers prompt-lookup assisted generation"""

    Options = HFPromptLookupOptions

    def prepare(self) -> None:
        self.model.hf_model

    def assistant(self) -> dict:
        return dict(prompt_lookup_num_tokens=self.options.prompt_lookup_num_tokens,
                    max_matching_ngram_size=self.options.max_matching_ngram_size)


@dataclass(frozen=True)
class HFDraftOptions:
    # Fixed 4-token drafts, as paradecode's `draft` method; transformers' own defaults are
    # num_assistant_tokens=20, schedule=heuristic, confidence_threshold=0.4.
    num_assistant_tokens: int = 4
    schedule: str = "constant"  # num_assistant_tokens_schedule: constant | heuristic
    confidence_threshold: float = 0.0  # assistant_confidence_threshold: stop drafting below it (0: off)


@register_peer("hf-draft")
class HFDraft(_HFPeer):
    """transformers assisted generation with the --draft-model"""

    Options = HFDraftOptions

    @classmethod
    def requirement(cls, draft_model: str | None) -> str | None:
        return None if draft_model else "peer 'hf-draft' needs a draft model: pass --draft-model NAME_OR_PATH."

    def prepare(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from paradecode.models import resolve

        self.model.hf_model
        draft_dir, _ = resolve(self.draft_model, self.model.cache_dir)
        self.draft_hf = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
        # transformers reads the assistant's settings from its generation config (this private copy's only)
        config = self.draft_hf.generation_config
        config.num_assistant_tokens = self.options.num_assistant_tokens
        config.num_assistant_tokens_schedule = self.options.schedule
        config.assistant_confidence_threshold = self.options.confidence_threshold

    def assistant(self) -> dict:
        return dict(assistant_model=self.draft_hf)


def gguf_path(model: Any) -> Path | None:
    """The GGUF file behind a loaded model: a built-in's wheel file, or the source a conversion recorded."""
    from paradecode.models import BUILTIN_MODELS, converted_from

    if getattr(model, "name", None) in BUILTIN_MODELS:
        return BUILTIN_MODELS[model.name].gguf()
    source = converted_from(Path(getattr(model, "model_dir", "")))
    return source if source is not None and source.is_file() else None


from paradecode.benchmark import llamacpp  # noqa: E402,F401  (registers the llama.cpp peers)
