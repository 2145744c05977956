"""The q4 Llama backend: the native forward over a GGUF checkpoint's own blocks (``backends/q4.py``).

``Q4LlamaBackend`` is the int8 backend with every layer's projections replaced by the checkpoint's Q4_0 / Q4_1 /
Q4_K / Q5_0 / Q6_K / Q8_0 blocks, unsmoothed (block weights cannot take SmoothQuant's per-input factors, and activations
quantized per group of 32 do not need them: the groups isolate the outlier channels). The LM head is the file's
own blocks too where their type is one of those (with the checkpoint's final norm); otherwise the int8 backend's
head, final norm and hidden scale. It runs on the native forward only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch

from paradecode.backends import hugepages, q4
from paradecode.backends.int8 import PROJECTIONS
from paradecode.backends.int8_llama import Int8LlamaBackend, int8_state
from paradecode.errors import ParadecodeError


class Q4LlamaBackend(Int8LlamaBackend):
    """A Llama-family transformer on 4-bit checkpoint blocks; implements ``paradecode.backends.base.Backend``."""

    DTYPE = "q4"

    def __init__(self, shape, state: Mapping[str, torch.Tensor], max_length: int | None = None, *,
                 layers: Sequence[Mapping[str, q4.Blocks | q4.Q4Linear]],
                 head: q4.Blocks | q4.Q4Linear | None = None, int8_state: Mapping[str, torch.Tensor] | None = None,
                 kernel_cache: Path | None = None) -> None:
        """``state``: the fp32 checkpoint; ``layers``: each layer's blocks (``q4.read_layers``), or their packed
        projections (``q4.load_blocks``); ``head``: the file's LM head as blocks, or else ``int8_state``, the int8
        backend's quantized state, for its LM head."""
        if head is None and int8_state is None:
            raise ValueError("the q4 backend needs the file's LM head blocks or an int8 state for its LM head")
        self._q4_layers = layers
        self._q4_head = head if head is None or isinstance(head, q4.Q4Linear) else q4.Q4Linear.from_blocks(head)
        super().__init__(shape, state, max_length, int8_state=int8_state if head is None else {},
                         kernel_cache=kernel_cache)
        if self._native is None:
            raise ParadecodeError("dtype q4 runs on the native forward, which could not be built here: use "
                                  "--dtype int8.")

    def _import_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """The file's head (the checkpoint's final norm kept), or the int8 head, final norm and hidden scale; the
        checkpoint's own norms and block projections (the int8 state's layers are not used)."""
        if self._q4_head is not None:
            vocab, hidden = self.shape.vocab_size, self.shape.hidden_size
            if (self._q4_head.n, self._q4_head.k) != (vocab, hidden):
                raise ParadecodeError(f"the GGUF file's LM head is {self._q4_head.n} x {self._q4_head.k}, the model's "
                                      f"{vocab} x {hidden}: use --dtype int8.")
            self._lm_head = self._q4_head
        else:
            self._import_head(state)
        if len(self._q4_layers) != len(self._layers):
            raise ParadecodeError(f"the GGUF file has {len(self._q4_layers)} layers, the model {len(self._layers)}.")
        for layer, blocks in zip(self._layers, self._q4_layers):
            for name in PROJECTIONS:
                given, bias = blocks[name], getattr(layer, name).bias  # the checkpoint's own bias, if any
                packed = given if isinstance(given, q4.Q4Linear) else q4.Q4Linear.from_blocks(given)
                setattr(layer, name, packed.with_bias(bias))
        self._q4_layers = ()  # packed now
        linears = [getattr(layer, name) for layer in self._layers for name in PROJECTIONS]
        if isinstance(self._lm_head, q4.Q4Linear):
            linears.append(self._lm_head)
        for linear, packed in zip(linears, hugepages.together([linear.packed for linear in linears])):
            linear.packed = packed  # on 2 MiB pages: a one-token forward 5-7% faster (see backends.hugepages)

    @property
    def kernels(self) -> str:
        return f"q4-v{q4.FORMAT}-" + super().kernels

    def export_state(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError("the q4 backend's weights are the GGUF file's: there is nothing to export")


def load_q4(model_dir: Path, max_length: int | None, calibration: Sequence[Sequence[int]], cache: Path):
    """The q4 backend of a model folder converted from a GGUF file with Q4_0 / Q4_1 / Q4_K / Q5_0 / Q6_K / Q8_0
    layers; the int8 backend's LM head (quantized once, kept in ``cache``) where the file's is of another type."""
    import json

    from safetensors.torch import load_file

    from paradecode.backends.llama import LlamaShape

    source = q4.gguf_source(model_dir)
    shape = LlamaShape.from_config(json.loads((model_dir / "config.json").read_text()))
    layers, head = q4.load_blocks(source, shape.num_layers, shape.num_heads, shape.num_kv_heads, cache)
    return Q4LlamaBackend(shape, load_file(model_dir / "model.safetensors"), max_length, layers=layers, head=head,
                          int8_state=None if head is not None else int8_state(model_dir, calibration, cache),
                          kernel_cache=cache / "kernels")
