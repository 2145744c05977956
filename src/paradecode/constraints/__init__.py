"""Structured output: a grammar state masks the target's distribution, and the engine stays exact under
speculation (``speculative.Constraint``); the grammars come from llguidance (``grammar``)."""

from paradecode.constraints.grammar import GrammarCompiler, GrammarState, grammar_source
from paradecode.constraints.speculative import Constraint

__all__ = ["Constraint", "GrammarCompiler", "GrammarState", "grammar_source"]
