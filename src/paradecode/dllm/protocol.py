"""What the decoder needs from a diffusion model, and how a model name becomes one.

A ``DiffusionLM`` is a bidirectional model over [prompt + canvas] with a mask token: called on tokens
[1, S] at sequence positions ``index`` [S] it returns logits [1, S, V] for them (``cache``: an optional
``KVCache`` for models that support one). Our ``TinyLM`` satisfies it directly; Hugging Face diffusion models
go through ``paradecode.dllm.hf``. ``load_diffusion_model`` takes a shipped name, one of our checkpoint folders
or a local Hugging Face folder, and refuses autoregressive models with a clear message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import torch

from paradecode.errors import ParadecodeError

CHECKPOINTS = Path(__file__).parent / "checkpoints"


class DiffusionLM(Protocol):
    mask_id: int
    eot_id: int
    max_length: int  # positions: prompt + canvas
    gen_length: int  # default canvas length
    supports_cache: bool

    def __call__(self, tokens: torch.Tensor, index: torch.Tensor | None = None, cache=None) -> torch.Tensor: ...

    def new_cache(self): ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def shipped_models() -> list[str]:
    return sorted(p.name for p in CHECKPOINTS.iterdir() if (p / "config.json").is_file()) if CHECKPOINTS.is_dir() else []


def resolve_folder(name: str) -> Path:
    """A shipped model's folder, or ``name`` itself when it is a folder."""
    if (CHECKPOINTS / name / "config.json").is_file():
        return CHECKPOINTS / name
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    raise ParadecodeError(f"unknown model {name!r}: give a shipped model ({', '.join(shipped_models()) or 'none'}) "
                          "or a local folder (a paradecode dLLM checkpoint or a Hugging Face diffusion model).")


def load_tiny(name: str, causal: bool = False):
    """One of our ``TinyLM`` checkpoints; ``causal`` says which kind (dLLM or AR twin) the caller needs."""
    from paradecode.dllm.model import load_checkpoint

    model = load_checkpoint(resolve_folder(name))
    if model.config.causal != causal:
        kind = "an autoregressive (causal) model" if model.config.causal else "a masked diffusion model"
        wanted = "an autoregressive twin" if causal else "a masked diffusion model"
        raise ParadecodeError(f"{name!r} is {kind}; this needs {wanted}.")
    return model


def load_diffusion_model(name: str) -> DiffusionLM:
    folder = resolve_folder(name)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8")) if (folder / "config.json").is_file() else {}
    if "model_type" in config or "architectures" in config:
        from paradecode.dllm.hf import load_hf_diffusion

        return load_hf_diffusion(folder)
    return load_tiny(name)
