"""Backends run forward passes and own the KV cache (see ``base.Backend``)."""

from paradecode.backends.base import Backend, ForwardOutput, causal_mask, tree_depths, tree_mask
from paradecode.backends.hf import HFBackend
from paradecode.backends.llama import LlamaBackend

DTYPES = ("fp32", "int8", "q4")  # weight formats: the checkpoint's fp32, our int8 backend, a GGUF's own 4-bit blocks

__all__ = ["Backend", "DTYPES", "ForwardOutput", "causal_mask", "tree_mask", "tree_depths", "HFBackend",
           "LlamaBackend"]
