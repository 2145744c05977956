"""Backends run forward passes and own the KV cache (see ``base.Backend``)."""

from paradecode.backends.base import Backend, ForwardOutput, causal_mask, tree_depths, tree_mask
from paradecode.backends.hf import HFBackend
from paradecode.backends.llama import LlamaBackend

__all__ = ["Backend", "ForwardOutput", "causal_mask", "tree_mask", "tree_depths", "HFBackend", "LlamaBackend"]
