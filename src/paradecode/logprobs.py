"""Logprobs are read, not recomputed: each committed token's log-probability (and the most likely alternatives)
from the target logits the verify pass already computed for it.

The engine hands over, per step, the rows of ``Verdict.target_logits`` that predicted the committed tokens
(``decode(..., on_commit=...)``); ``LogprobReader`` turns each row into ``log_softmax`` and keeps the chosen
token's value and the top ``top_logprobs``. Which distribution: the model's own (raw logits at temperature 1,
before temperature, top-k and top-p, as OpenAI reports and vLLM does by default), after the grammar mask when
output is constrained (the mask is part of the model's distribution there: a token the grammar forbids has
-inf). Because every method commits each token with the logits of the very row that verified it, and our int8
backend computes each row on its own to the bit, the values are identical under every method; on fp32 they may
differ from ``ar``'s in the last bits (a float product over several rows sums in another order).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch


@dataclass
class TokenLogprob:
    token_id: int
    token: str  # the token's text (bytes that end inside a UTF-8 character show as U+FFFD)
    bytes: list[int]  # the token's exact UTF-8 bytes
    logprob: float
    top_logprobs: list["TokenLogprob"] = field(default_factory=list)  # most likely first

    def to_dict(self) -> dict:
        data = asdict(self)
        for alternative in data["top_logprobs"]:
            del alternative["top_logprobs"]
        return data


class TokenText:
    """Each token id's bytes and text, looked up once (byte-level BPE and SentencePiece byte tokens are mapped
    back to their bytes, so a token that holds part of a character keeps its exact bytes)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.special = set(tokenizer.all_special_ids)
        self.byte_level = "ByteLevel" in str(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", ""))
        self.byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._cache:
            piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
            if token_id in self.special:
                raw = piece.encode()
            elif self.byte_level and all(c in self.byte_of for c in piece):
                raw = bytes(self.byte_of[c] for c in piece)
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):  # SentencePiece byte fallback
                raw = bytes([int(piece[3:5], 16)])
            else:
                raw = self.tokenizer.decode([token_id]).encode()
            self._cache[token_id] = (raw.decode("utf-8", "replace"), list(raw))
        return self._cache[token_id]


class LogprobReader:
    """The engine's ``on_commit`` hook: collects one ``TokenLogprob`` per committed token."""

    def __init__(self, token_text: TokenText, top_logprobs: int = 0) -> None:
        self.token_text = token_text
        self.top = top_logprobs
        self.entries: list[TokenLogprob] = []

    def __call__(self, tokens: Sequence[int], logits: torch.Tensor) -> None:  # logits: [K, V], row i -> tokens[i]
        for token, row in zip(tokens, logits):
            logp = torch.log_softmax(row.float(), dim=-1)  # [V], one row at a time: the same bits for any K
            alternatives = []
            if self.top:
                values, ids = torch.topk(logp, min(self.top, logp.shape[-1]))
                alternatives = [self._entry(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist())]
            self.entries.append(self._entry(int(token), float(logp[token]), alternatives))

    def _entry(self, token_id: int, logprob: float, top: list[TokenLogprob] | None = None) -> TokenLogprob:
        text, raw = self.token_text(token_id)
        return TokenLogprob(token_id, text, raw, logprob, top or [])


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to the printable character byte-level BPE vocabularies write it as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
