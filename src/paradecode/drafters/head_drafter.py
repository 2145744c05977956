"""What the trained-head drafters (``eagle``, ``medusa``) share: options, loading the head, the draft vocabulary.

A head drafter reads the target's hidden states (``needs_hidden``: the engine then puts the prefill's on
``DecodeState.prompt_hidden`` and each step's on ``Verdict.target_hidden``) and the target's frozen embedding
and LM head, read once from the target's model directory. The head comes from ``--opt head=DIR`` or, by
default, the one shipped for the model (``paradecode/heads/weights/<model>-<kind>``).

The draft vocabulary: a head may score only the Vd most frequent tokens of its training answers (its
``draft_ids``, most frequent first); ``draft_vocab=N`` keeps the first N. Draft logits then cost Vd rows of
the LM head instead of V; verification still scores the full vocabulary, so nothing changes in the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

import torch

from paradecode.drafters.base import DecodeState, Drafter
from paradecode.drafters.schedule import check_schedule_options, make_schedule
from paradecode.errors import ParadecodeError
from paradecode.heads.store import LoadedHead, load_head, resolve_head_dir, target_weights


def check_tree_options(method: str, options) -> None:
    for name in ("budget", "branching", "width", "depth"):
        if getattr(options, name) < 1:
            raise ParadecodeError(f"{method} option {name} must be >= 1, got {getattr(options, name)}.")
    check_schedule_options(method, options.schedule, options.depth, options.depth)
    if options.draft_vocab < 0:
        raise ParadecodeError(f"{method} option draft_vocab must be >= 0 (0: the head's own), got {options.draft_vocab}.")


@dataclass(frozen=True)
class HeadRuntime:
    """A loaded head with the target pieces it drafts with."""

    head: LoadedHead
    embed: torch.Tensor  # [V, D] the target's token embeddings
    lm_rows: torch.Tensor  # [Vd, D] the target's LM head rows of the draft vocabulary
    ids: torch.Tensor | None  # [Vd] full id of each draft logit; None: the full vocabulary
    vocab: int  # the full vocabulary size V

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., D] -> draft logits [..., Vd]."""
        return features @ self.lm_rows.t()


@lru_cache(maxsize=8)
def load_runtime(folder: str, kind: str, model_dir: str, draft_vocab: int) -> HeadRuntime:
    weights = target_weights(model_dir)
    head = load_head(folder, kind, weights)
    ids = head.draft_ids
    if draft_vocab:
        ids = (ids if ids is not None else torch.arange(weights.embed.shape[0]))[:draft_vocab]
    lm_rows = weights.lm_head if ids is None else weights.lm_head[ids].contiguous()
    return HeadRuntime(head, weights.embed, lm_rows, ids, weights.embed.shape[0])


class HeadDrafter(Drafter):
    """Base of ``eagle`` and ``medusa``: loads the head named by the ``head`` option for the context's model."""

    kind: ClassVar[str] = ""
    needs_hidden: ClassVar[bool] = True
    needs_draft_probs_under_sampling = True

    def __init__(self, options, context) -> None:
        super().__init__(options, context)
        if context is None or getattr(context, "model_dir", None) is None:
            raise ParadecodeError(f"method {self.method_name!r} must be created through a loaded model (paradecode.load).")
        folder = resolve_head_dir(options.head, self.kind, getattr(context, "name", None))
        self.runtime = load_runtime(str(Path(folder).resolve()), self.kind, str(Path(context.model_dir).resolve()),
                                    options.draft_vocab)
        self.module = self.runtime.head.module
        self.draft_forward_passes = 0

    def begin(self, state: DecodeState) -> None:
        self.schedule = make_schedule(self.options.schedule, self.options.depth, self.options.depth)
        self.scheduled = False

    def chain_length(self, state: DecodeState) -> int:
        """Most tokens to draft this step: the schedule's choice for a chain (0: plain decoding), ``depth`` for a
        tree (trees are not scheduled)."""
        self.scheduled = not (self.options.tree and state.supports_tree)
        return self.schedule.length() if self.scheduled else self.options.depth

    def drafted(self, count: int) -> None:
        if self.scheduled:
            self.schedule.proposed(count)

    def accepted(self, count: int) -> None:
        if self.scheduled:
            self.schedule.update(count)

    def summary(self) -> dict:
        ids = self.runtime.ids
        return {"head": str(self.runtime.head.path), "draft_vocab": self.runtime.vocab if ids is None else len(ids)}

    @staticmethod
    def prompt_features(state: DecodeState) -> torch.Tensor | None:
        hidden = getattr(state, "prompt_hidden", None)
        return None if hidden is None or hidden.shape[0] == 0 else hidden.float()  # [P-1, D]
