"""Drafters propose tokens (a chain or a tree); importing this package registers every built-in method."""

from paradecode.drafters import (  # noqa: F401  (registration side effect)
    ar, auto, draft_model, draft_tree, eagle, jacobi, layerskip, lookahead, medusa, ngram, parallel, pld, pld_tree,
)
from paradecode.drafters.base import DecodeState, Drafter, Proposal

__all__ = ["DecodeState", "Drafter", "Proposal"]
