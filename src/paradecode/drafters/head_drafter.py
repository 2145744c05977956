"""What the trained-head drafters (``eagle``, ``eagle3``, ``medusa``) share: options, loading the head, the draft vocabulary.

A head drafter reads the target's hidden states (``needs_hidden``: the engine then puts the prefill's on
``DecodeState.prompt_hidden`` and each step's on ``Verdict.target_hidden``) and the target's frozen embedding
and LM head, read once from the target's model directory. The head comes from ``--opt head=DIR`` or, by
default, the one shipped for the model (``paradecode/heads/weights/<model>-<kind>``).

The draft vocabulary: a head may score only the Vd most frequent tokens of its training answers (its
``draft_ids``, most frequent first); ``draft_vocab=N`` keeps the first N. Draft logits then cost Vd rows of
the LM head instead of V; verification still scores the full vocabulary, so nothing changes in the output.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import ClassVar

import torch

from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.ngram_index import NgramIndex
from paradecode.drafters.schedule import ScheduledDrafter, check_schedule_options, make_schedule
from paradecode.drafters.tree import tree_parents
from paradecode.errors import ParadecodeError
from paradecode.heads.eagle_native import NativeEagleHead, NativeEagleLayer
from paradecode.heads.store import LoadedHead, load_head, resolve_head_dir, target_weights
from paradecode.verify.base import Verdict


def check_tree_options(method: str, options) -> None:
    for name in ("budget", "branching", "width", "depth"):
        if getattr(options, name) < 1:
            raise ParadecodeError(f"{method} option {name} must be >= 1, got {getattr(options, name)}.")
    check_schedule_options(method, options.schedule, options.depth, options.depth)
    if options.draft_vocab < 0:
        raise ParadecodeError(f"{method} option draft_vocab must be >= 0 (0: the head's own), got {options.draft_vocab}.")
    if options.lookup < 0 or options.lookup_draft < 1:
        raise ParadecodeError(f"{method} options lookup (>= 0, 0: off) and lookup_draft (>= 1) got "
                              f"{options.lookup} and {options.lookup_draft}.")
    if options.head_dtype not in HEAD_DTYPES:
        raise ParadecodeError(f"{method} option head_dtype must be one of {', '.join(HEAD_DTYPES)}, "
                              f"got {options.head_dtype!r}.")


HEAD_DTYPES = ("int8", "fp32")
LOOKUP_NGRAM = 3  # longest suffix a copy matches (HeadDrafter.copy_draft)
NATIVE_KINDS = ("eagle", "eagle3", "parallel")  # heads whose draft step runs on the native forward (eagle_native.py)


@dataclass(frozen=True)
class HeadRuntime:
    """A loaded head with the target pieces it drafts with."""

    head: LoadedHead
    embed: torch.Tensor  # [V, D] the target's token embeddings
    ids: torch.Tensor | None  # [Vd] full id of each draft logit; None: the full vocabulary
    vocab: int  # the full vocabulary size V
    module: torch.nn.Module  # the head as it drafts (its linear layers in int8 for head_dtype=int8)
    lm: torch.nn.Module  # the draft LM head: the target's LM head rows of the draft vocabulary (EAGLE-3: its own, after its norm)
    lm_rows: torch.Tensor  # [Vd, D] fp32 weight of the draft LM head (before any quantization)
    dtype: str  # head_dtype: int8 | fp32

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., D] -> draft logits [..., Vd]."""
        rows = features.reshape(-1, features.shape[-1])  # [N, D]: quantized linears take 2-D inputs only
        return self.lm(rows).view(*features.shape[:-1], -1)

    def native_layer(self, max_len: int) -> "NativeEagleLayer | None":
        """An EAGLE, EAGLE-3 or parallel head's steps on the native int8 forward, with a cache of ``max_len`` pairs
        of their own; None for an fp32 head, a Medusa head, or without the native kernels
        (``backends.native.load``)."""
        if self.dtype != "int8" or self.head.module.kind not in NATIVE_KINDS:
            return None
        head = self._native_head
        return None if head is None else head.layer(max_len)

    @cached_property
    def _native_head(self) -> "NativeEagleHead | None":
        """The head's weights packed for the native forward once (each request's layer shares them)."""
        from paradecode.backends import native

        module = native.load()
        return None if module is None else NativeEagleHead(module, self.head.module, self.lm_rows)


@lru_cache(maxsize=8)
def load_runtime(folder: str, kind: str, model_dir: str, draft_vocab: int, head_dtype: str = "fp32") -> HeadRuntime:
    """The head in ``folder`` with its target's pieces. ``head_dtype`` int8: its linear layers and the draft LM
    head run as PyTorch's dynamically quantized int8 linears (int8 weights, per-call int8 activations), or, for
    an EAGLE, EAGLE-3 or parallel head where the native kernels load, the whole draft step on the native int8
    forward (``native_layer``; EAGLE-3's ``fc`` stays PyTorch's, on the target's features): a draft step reads a
    quarter of the bytes (drafting on a CPU is bound by reading weights) and, natively, pays no per-op costs;
    proposals change slightly, outputs do not (verification is the target's)."""
    weights = target_weights(model_dir)
    head = load_head(folder, kind, weights)
    ids = head.draft_ids
    if draft_vocab:
        ids = (ids if ids is not None else torch.arange(weights.embed.shape[0]))[:draft_vocab]
    module = head.module
    own = getattr(module, "lm_head", None)  # EAGLE-3: its own LM head over the draft vocabulary, after its norm
    if own is not None:
        lm_rows = own.weight.detach()[: len(ids) if ids is not None else None].contiguous()
    else:
        lm_rows = weights.lm_head if ids is None else weights.lm_head[ids].contiguous()
    lm = torch.nn.Linear(lm_rows.shape[1], lm_rows.shape[0], bias=False)
    lm.weight = torch.nn.Parameter(lm_rows, requires_grad=False)
    if own is not None:
        norm = torch.nn.RMSNorm(lm_rows.shape[1], eps=module.shape.rms_norm_eps)
        norm.weight = torch.nn.Parameter(module.norm.detach().clone(), requires_grad=False)
        lm = torch.nn.Sequential(norm, lm)
    if head_dtype == "int8":  # (quantize_dynamic swaps child modules only, hence the Sequential around lm)
        module, lm = _int8_linears(copy.deepcopy(head.module)), _int8_linears(torch.nn.Sequential(lm))
        if hasattr(module, "fc"):  # fc reads the target's features, whose outlier dimensions leave a per-tensor
            module.fc = copy.deepcopy(head.module.fc)  # int8 activation scale too coarse for the rest: fp32
        if own is not None:
            module.lm_head = None  # drafting scores through ``lm`` (the rows kept), never the module's own
    return HeadRuntime(head, weights.embed, ids, weights.embed.shape[0], module.eval(), lm.eval(), lm_rows,
                       head_dtype)


def _int8_linears(module: torch.nn.Module) -> torch.nn.Module:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its move to torchao
        return torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8)


class Calibration:
    """How often a drafted token is accepted, given its path so far was, as a function of the head's own
    probability for it: ``BINS`` equal bins over [0, 1], each starting as if the head were calibrated (``PRIOR``
    pseudo-observations at the bin's centre) and counting every node the target judged since."""

    BINS = 10
    PRIOR = 4.0

    def __init__(self) -> None:
        self.hits = [(b + 0.5) / self.BINS * self.PRIOR for b in range(self.BINS)]
        self.seen = [self.PRIOR] * self.BINS

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * self.BINS), self.BINS - 1)

    def path_chances(self, confidences: list[float], parents: list[int]) -> list[float]:
        """Chance that each node's whole path is accepted, from each node's confidence and parent (-1: the root's
        child), nodes in proposal order (parents first)."""
        chances: list[float] = []
        for confidence, parent in zip(confidences, parents):
            b = self._bin(confidence)
            chances.append(self.hits[b] / self.seen[b] * (1.0 if parent < 0 else chances[parent]))
        return chances

    def update(self, proposal: Proposal, verdict: Verdict, cut: Proposal | None = None) -> None:
        """Count the judged nodes: children of the root or of an accepted node; a hit if it was accepted. With
        ``cut`` (the proposal as drafted, of which ``proposal`` is the prefix that was sent), the nodes the cut
        left out are judged too, by the same rule: a left-out child of the root or of an accepted node is a hit
        if its token is the one the target committed after its parent. Judged on the sent nodes alone, a bin
        whose nodes the cut always left out could never learn that they were accepted more often than its
        prior said, and would be cut for the rest of the request. Measured (AMD EPYC Zen 4, 2026-12-06, 39
        Spec-Bench prompts, both ways alternating prompt by prompt in one process, two rounds): the same speed
        (median per-prompt ratio 1.007 and 1.001), τ 1.89 / 1.87 against 1.90 / 1.87: the shipped head's
        confidences were near calibrated already (first draft tokens: 0.10 accepted at confidence 0.1-0.2,
        0.29-0.30 at 0.3-0.5, 0.89 at 0.9+), so the prior was not far off."""
        kept = set(verdict.accepted)
        for node, (confidence, parent) in enumerate(zip(proposal.confidences, proposal.node_parents)):
            if parent < 0 or parent in kept:
                self._count(confidence, node in kept)
        if cut is None or len(cut.tokens) <= len(proposal.tokens):
            return
        path = [-1] + verdict.accepted  # the root and the accepted nodes, each followed by the target's token:
        follows = dict(zip(path, verdict.accepted_tokens + [verdict.next_token]))
        for node in range(len(proposal.tokens), len(cut.tokens)):
            parent = cut.node_parents[node]
            if parent in follows:
                self._count(cut.confidences[node], cut.tokens[node] == follows[parent])

    def _count(self, confidence: float, hit: bool) -> None:
        b = self._bin(confidence)
        self.seen[b] += 1
        self.hits[b] += hit


class HeadDrafter(ScheduledDrafter):
    """Base of ``eagle`` and ``medusa``: loads the head named by the ``head`` option for the context's model."""

    kind: ClassVar[str] = ""
    needs_hidden: ClassVar[bool] = True
    draws_from_rng: ClassVar[bool] = True  # sampled drafts: each draws from the request's random stream

    def __init__(self, options, context) -> None:
        super().__init__(options, context)
        if context is None:
            raise ParadecodeError(f"method {self.method_name!r} must be created through a loaded model "
                                  "(paradecode.load).")
        folder = resolve_head_dir(options.head, self.kind, context.name)
        self.runtime = load_runtime(str(Path(folder).resolve()), self.kind, str(Path(context.model_dir).resolve()),
                                    options.draft_vocab, options.head_dtype)
        self.module = self.runtime.module
        self.draft_forward_passes = 0

    MAX_REST = 16  # most steps in a row the head rests after cuts that kept nothing

    def begin(self, state: DecodeState) -> None:
        lookup = self.options.lookup
        self.index = NgramIndex(lookup, max(lookup, LOOKUP_NGRAM)) if lookup else None
        self.copied = False  # the step in flight drafts a copy (``copy_draft``), not the head's tokens
        self.schedule = make_schedule(self.options.schedule, self.options.depth, self.options.depth, state)
        self.scheduled = False
        self.cutting = False
        self.calibration = Calibration()
        self.last: Proposal | None = None
        self.uncut: Proposal | None = None  # the last proposal as drafted, where the cut left nodes out
        self.empty_cuts = 0  # cuts in a row that kept no node
        self.rest = 0  # steps the head still skips

    def propose(self, state: DecodeState) -> Proposal:
        """A copy where the text repeats itself (``copy_draft``), else the head's draft (``head_draft``)."""
        self.foreign_seconds = 0.0
        copied = self.copy_draft(state)
        if copied is None:
            return self.head_draft(state)
        self.schedule.drafted_elsewhere(len(copied.tokens))
        return copied

    def head_draft(self, state: DecodeState) -> Proposal:
        """The step's draft from the head (each kind's own)."""
        raise NotImplementedError

    def copy_draft(self, state: DecodeState) -> Proposal | None:
        """The step's draft when the text repeats itself (the ``lookup`` option, as ``pld`` drafts): what followed
        the latest earlier occurrence of the longest suffix of at least ``lookup`` tokens (up to LOOKUP_NGRAM),
        at most ``lookup_draft`` tokens of it, instead of the head's. None: no such suffix; the head drafts.
        Copies are right where the text quotes its prompt or itself (summaries, code edits, lists), where a head
        trained on other text guesses; elsewhere the head drafts. SmolLM2-135M q4, 26 Spec-Bench questions, AMD
        EPYC Zen 4 (docs/heads.md): ``eagle`` with a fixed chain of 1 went from 1.07x ``ar`` (tau 1.38) to 1.20x
        (tau 1.72) with copies of 2-gram suffixes, where ``pld`` alone gave 1.10x. A copy step runs no head
        forward and leaves the head's schedule and calibration alone (they judge the head's drafts)."""
        self.copied = False
        if self.index is None or state.max_draft <= 0:
            return None
        tokens = self.index.continuation(state.tokens, min(self.options.lookup_draft, state.max_draft))
        if not tokens:
            return None
        self.copied = True
        return Proposal(tokens=tokens)

    def chain_length(self, state: DecodeState) -> int:
        """Most tokens to draft this step: the schedule's choice for a chain (0: plain decoding), ``depth`` for a
        tree. Greedy decoding under the cost schedule drafts the longest chain or the whole tree budget and
        lets ``finish`` cut it by the drafted nodes' confidences (``Calibration``)."""
        tree = self.options.tree and state.supports_tree
        self.cutting = self.options.schedule == "cost" and state.sampling.greedy
        self.scheduled = self.cutting or not tree
        if self.cutting:
            candidates = self.schedule.candidates()
            if self.rest:  # the last cuts kept nothing: running the head again now would likely be wasted
                self.rest -= 1
                return 0
            return candidates
        return self.schedule.length() if self.scheduled else self.options.depth

    def finish(self, proposal: Proposal) -> Proposal:
        """The step's proposal as sent: when cutting, the prefix of nodes (parents come before children, so
        every prefix is a tree) that maximises expected tokens per second, where a node's chance is the
        product of its path's calibrated confidences and the cost is the schedule's measured verify time (the
        head's time is spent by now: counting it too cut drafts that paid their rows, and ``eagle`` drafted
        nothing on half its steps). Where the nodes would not have paid for the head's time as well, the head
        ran for nothing: it then rests 1, 2, 4, ... (at most ``MAX_REST``) steps, each plain decoding without a
        head forward, until its nodes pay again (a head that never pays costs a head forward every ``MAX_REST``
        steps; the schedule's one-token probes still come, from the steps it runs)."""
        if self.cutting and proposal.tokens and proposal.confidences is not None:
            chances = self.calibration.path_chances(proposal.confidences, proposal.node_parents)
            keep = self.schedule.best_prefix(chances)  # the head's time is spent: only the verify time counts
            pays = self.schedule.planned(chances) > 0  # whether these nodes were worth the head's time as well
            self.empty_cuts = self.empty_cuts + 1 if not pays else 0
            self.rest = min(2 ** (self.empty_cuts - 1), self.MAX_REST) if not pays else 0
            self.uncut = proposal if keep < len(proposal.tokens) else None
            proposal = Proposal(tokens=proposal.tokens[:keep], parents=tree_parents(proposal.node_parents[:keep]),
                                confidences=proposal.confidences[:keep])
        else:
            self.uncut = None
        self.last = proposal
        if self.scheduled:
            self.schedule.proposed(len(proposal.tokens))
        return proposal

    def worth_growing(self, confidences: list[float], parents: list[int]) -> bool:
        """``grow_tree``'s question when cutting, for a drafter whose every opened node costs a head forward
        (``eagle``, ``eagle3``): whether the nodes drafted so far all stay in the cut ``finish`` would make now;
        once the best prefix leaves out the newest ones, their children would most likely be cut too (a child's
        path is no likelier than its parent's), so the head forward that drafts them is saved."""
        if not self.cutting:
            return True
        return self.schedule.planned(self.calibration.path_chances(confidences, parents)) == len(confidences)

    def drafted(self, count: int) -> None:
        """A step that drafted nothing (``count`` 0) or whose proposal bypasses ``finish``."""
        self.last = None
        if self.scheduled:
            self.schedule.proposed(count)

    def accepted(self, verdict: Verdict) -> None:
        if self.copied:  # a copy's verdict says nothing about the head
            return
        if self.scheduled:
            self.schedule.update(len(verdict.accepted))
        if self.last is not None and self.last.confidences is not None:
            self.calibration.update(self.last, verdict, self.uncut)

    def summary(self) -> dict:
        ids = self.runtime.ids
        return {"head": str(self.runtime.head.path), "draft_vocab": self.runtime.vocab if ids is None else len(ids)}

    @staticmethod
    def prompt_features(state: DecodeState) -> torch.Tensor | None:
        hidden = state.prompt_hidden
        return None if hidden is None or hidden.shape[0] == 0 else hidden.float()  # [P-1, D]
