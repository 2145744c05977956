"""Backends run forward passes and own the KV cache (see ``base.Backend``)."""

from paradecode.backends.base import Backend, ForwardOutput, causal_mask, tree_depths, tree_mask

__all__ = ["Backend", "ForwardOutput", "causal_mask", "tree_mask", "tree_depths"]
