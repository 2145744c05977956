"""Grammar states from llguidance: what the user asked for (a JSON schema, a regex, a Lark or GBNF grammar)
compiled once per request into a matcher over the model's vocabulary.

Why llguidance (measured by ``benchmarks/mask_libraries.py``, docs/structured.md): it is the one library of the
three that takes every form asked for here (JSON schema, regex, Lark, and GBNF through its converter), it
compiles a schema in about a millisecond (xgrammar: ~30-60 ms, outlines-core: ~1 s, and neither reads Lark), it
rolls back any number of tokens and reports the tokens the grammar forces, and its wheel has no dependencies
(xgrammar's pulls triton and an unpinned torch). Its mask costs ~60 us per token on SmolLM2's 49k vocabulary,
about 1.5% of a 4 ms one-token forward.

JSON is written compactly with ``", "`` and ``": "`` between items and keys and no other whitespace, and object
properties in the schema's order: a small model cannot loop on whitespace, and keys and separators become
tokens the grammar forces.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from paradecode.errors import ParadecodeError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    try:
        import llguidance
        import llguidance.gbnf_to_lark
        import llguidance.hf
        import llguidance.torch
    except ImportError:
        raise ParadecodeError("structured output needs llguidance: pip install llguidance") from None
    return llguidance


def grammar_source(json_schema: Any = None, regex: str | None = None, grammar: str | None = None) -> str | None:
    """The llguidance grammar for what was asked (at most one of the three), checked; None when nothing was.
    ``json_schema``: a dict or its JSON text; ``grammar``: Lark (with a ``start:`` rule) or GBNF (``root ::=``)."""
    given = [name for name, value in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar))
             if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ParadecodeError(f"give one constraint at a time, got {' and '.join(given)}.")
    ll = _llguidance()
    if json_schema is not None:
        if isinstance(json_schema, str):
            try:
                json_schema = json.loads(json_schema)
            except ValueError as error:
                raise ParadecodeError(f"the JSON schema is not valid JSON: {error}.") from None
        if not isinstance(json_schema, dict):
            raise ParadecodeError(f"a JSON schema is a JSON object, got {type(json_schema).__name__}.")
        source, what = ll.LLMatcher.grammar_from_json_schema(json_schema, defaults=JSON_OPTIONS), "JSON schema"
    elif regex is not None:
        source, what = ll.LLMatcher.grammar_from_regex(regex), "regex"
    else:
        try:
            lark = ll.gbnf_to_lark.any_to_lark(grammar)
        except Exception as error:  # the converter's own error types
            raise ParadecodeError(f"the grammar is neither Lark (with a 'start:' rule) nor valid GBNF "
                                  f"(with 'root ::='): {error}") from None
        source, what = ll.LLMatcher.grammar_from_lark(lark), "grammar"
    problem = ll.LLMatcher.validate_grammar(source)
    if problem:
        raise ParadecodeError(f"invalid {what}: {problem.strip()}")
    return source


class GrammarCompiler:
    """One per model: llguidance's view of the tokenizer (built once, about half a second)."""

    def __init__(self, tokenizer, eos_ids: frozenset[int], vocab_size: int) -> None:
        ll = _llguidance()
        self.tokenizer = ll.hf.from_tokenizer(tokenizer, eos_token=sorted(eos_ids) or None)
        self.eos_ids = frozenset(eos_ids)  # allowed where the grammar is complete
        self.vocab_size = vocab_size  # of the model's logits (may be padded beyond the tokenizer's)

    def state(self, source: str) -> "GrammarState":
        ll = _llguidance()
        matcher = ll.LLMatcher(self.tokenizer, source, log_level=0)
        if matcher.is_error():
            raise ParadecodeError(f"the grammar does not fit this model's vocabulary: {matcher.get_error()}")
        return GrammarState(matcher, self.tokenizer.vocab_size, self.vocab_size, self.eos_ids)


class GrammarState:
    """The grammar's position after the tokens it has consumed: the mask of allowed next tokens, the tokens it
    forces, ``advance`` by a token and ``rollback`` by any number."""

    def __init__(self, matcher, tokenizer_vocab: int, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids  # end the output: advance by one only to commit it (rollback does not undo it)
        self.bits = _llguidance().torch.allocate_token_bitmask(1, tokenizer_vocab)  # [1, W] int32
        self.shifts = torch.arange(32, dtype=torch.int32)
        self.masks = 0  # masks computed, and the time they took (for the stats)
        self.mask_time_s = 0.0

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next."""
        start = time.perf_counter()
        _llguidance().torch.fill_next_token_bitmask(self.matcher, self.bits, 0)
        if self.matcher.is_error():
            raise RuntimeError(f"grammar matcher failed: {self.matcher.get_error()}")
        unpacked = ((self.bits[0].unsqueeze(-1) >> self.shifts) & 1).flatten().bool()  # [32 W]
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        width = min(self.vocab_size, unpacked.shape[0])
        allowed[:width] = unpacked[:width]
        self.masks += 1
        self.mask_time_s += time.perf_counter() - start
        return allowed

    def advance(self, token: int) -> bool:
        return self.matcher.consume_token(token)

    def rollback(self, count: int) -> None:
        if count and not self.matcher.rollback(count):
            raise RuntimeError(f"grammar matcher could not roll back {count} tokens: {self.matcher.get_error()}")

    def forced(self) -> list[int]:
        """Tokens the grammar forces from here (its fast-forward tokens: no other text is possible)."""
        return list(self.matcher.compute_ff_tokens())
