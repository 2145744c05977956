"""Hugging Face masked diffusion LMs (LLaDA, Dream) through the ``DiffusionLM`` protocol.

LLaDA and Dream folders carry their own modelling code (``auto_map`` in config.json). It is loaded with
``trust_remote_code`` from the local folder only (``local_files_only=True``): never a hub download. Each step is
one full forward pass over [prompt + canvas] (no cache: their remote code owns its attention). The mask token
is ``config.mask_token_id`` (LLaDA's folders lack it: 126336, as in its reference sampler). Dream was
initialised from an autoregressive model and predicts token i + 1 at position i, so its logits are shifted
right by one, as Dream's own sampler does. Prompts are encoded raw (no chat template).

transformers' ``DiffusionGemmaForBlockDiffusion`` is not adapted: it is an encoder-decoder that refines a
canvas of uniform-noise tokens with self-conditioning, not a canvas of mask tokens; it is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from paradecode.errors import ParadecodeError

LLADA_MASK_ID = 126336
DIFFUSION_TYPES = ("llada", "dream")  # model_type values (lower case, prefix match)
DEFAULT_GEN_LENGTH = 64


class HFDiffusion:
    supports_cache = False

    def __init__(self, model, tokenizer, *, mask_id: int, eot_id: int, max_length: int, shift: bool,
                 gen_length: int = DEFAULT_GEN_LENGTH):
        self.model, self.tokenizer, self.shift = model, tokenizer, shift
        self.mask_id, self.eot_id, self.max_length, self.gen_length = mask_id, eot_id, max_length, gen_length

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, index: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        if index is not None and (index[0] != 0 or index.numel() != tokens.shape[1]):
            raise ParadecodeError("Hugging Face diffusion models run whole sequences only (use --cache none).")
        logits = self.model(input_ids=tokens).logits.float()  # [1, T, V]
        if self.shift:  # Dream: position i's logits predict token i + 1
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    def new_cache(self):
        raise ParadecodeError("Hugging Face diffusion models have no cache here; use --cache none.")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def diffusion_kind(config: dict) -> str | None:
    """'llada' or 'dream' for a masked diffusion folder's config.json; None otherwise."""
    names = [str(config.get("model_type", ""))] + [str(a) for a in config.get("architectures") or []]
    for name in names:
        for kind in DIFFUSION_TYPES:
            if name.lower().startswith(kind):
                return kind
    return None


def load_hf_diffusion(folder: str | Path) -> HFDiffusion:
    from transformers import AutoModel, AutoTokenizer

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    architectures = config.get("architectures") or [config.get("model_type", "?")]
    if "DiffusionGemmaForBlockDiffusion" in architectures:
        raise ParadecodeError("DiffusionGemmaForBlockDiffusion refines a canvas of uniform-noise tokens (no mask "
                              "token); paradecode's dLLM samplers need a masked diffusion model (LLaDA, Dream).")
    kind = diffusion_kind(config)
    if kind is None:
        raise ParadecodeError(f"{folder} holds a {architectures[0]} model, which is not a masked diffusion model "
                              "(LLaDA or Dream); autoregressive models decode with `paradecode generate`.")
    if "auto_map" not in config:
        raise ParadecodeError(f"{folder} has no modelling code (config.json lacks auto_map): a {kind} folder "
                              "must carry its own modelling files.")
    try:
        model = AutoModel.from_pretrained(folder, trust_remote_code=True, local_files_only=True,
                                          dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
    except Exception as error:  # a broken folder is the user's to fix: say what failed
        raise ParadecodeError(f"could not load {folder}: {type(error).__name__}: {error}") from None
    eos = config.get("eos_token_id", tokenizer.eos_token_id)
    eot_id = eos[0] if isinstance(eos, list) else eos
    if eot_id is None:
        raise ParadecodeError(f"{folder} names no end-of-text token (eos_token_id).")
    max_length = config.get("max_sequence_length") or config.get("max_position_embeddings") or 4096
    return HFDiffusion(model, tokenizer, mask_id=config.get("mask_token_id", LLADA_MASK_ID), eot_id=eot_id,
                       max_length=max_length, shift=kind == "dream",
                       gen_length=min(DEFAULT_GEN_LENGTH, max_length // 2))
