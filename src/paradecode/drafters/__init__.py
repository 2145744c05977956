"""Drafters propose tokens (a chain or a tree); importing this package registers every built-in method."""

from paradecode.drafters import ar, draft_model, pld  # noqa: F401  (registration side effect)
from paradecode.drafters.base import DecodeState, Drafter, Proposal

__all__ = ["DecodeState", "Drafter", "Proposal"]
