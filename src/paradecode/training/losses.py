"""Per-batch losses and held-out acceptance for EAGLE and Medusa heads, on self-distilled sequences.

A batch holds right-padded sequences (prompt + the target's answer): ``tokens`` [B, T], the target's hidden
states ``hidden`` [B, T, D] (for EAGLE-3: its aux features [B, T, A*D]) and the validity masks below. Draft logits are taken over the draft vocabulary
only; a label outside it is ignored (it can never be drafted).

EAGLE, EAGLE-3 and the parallel head (the same unrolling; EAGLE-3 scores its own LM head and learns no
feature; the parallel head feeds mask rows to passes k >= 2), unrolled like a real chain (the "training-time test" of EAGLE-3, in its exact form): pass 1 feeds
the pairs (f_i, t_{i+1}) and predicts f_{i+1}, hence t_{i+2}. Pass k (k >= 2) at position i is the depth-k
draft of a chain whose root is r = i - k + 2: its input feature is pass k-1's output at i - 1, and it attends
to pass 1's keys at positions <= r - 1 (the committed pairs, true features) and to pass j's key at
position r - 2 + j for j = 2..k (its own chain), as drafting does. Medusa: head k at position i predicts
t_{i+1+k}. A depth-k draft from root r counts for the loss when r is the last prompt token or an answer
token and its label is a real token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from paradecode.heads.eagle import EagleHead
from paradecode.heads.eagle3 import Eagle3Head
from paradecode.heads.parallel import ParallelHead
from paradecode.heads.medusa import MedusaHeads


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] int64
    hidden: torch.Tensor  # [B, T, D] float32
    lengths: torch.Tensor  # [B]
    prompt_lens: torch.Tensor  # [B]


@dataclass
class DraftVocab:
    ids: torch.Tensor  # [Vd] full ids, most frequent first
    to_draft: torch.Tensor  # [V] draft index of each full id, -100 outside


def make_batch(rows: list[dict], features=None) -> Batch:
    """Pad ``rows`` into a batch; their features are ``features(rows)`` (a list of [T, W]) when given, else each
    row's stored ``hidden``."""
    width = max(len(r["tokens"]) for r in rows)
    states = features(rows) if features is not None else [r["hidden"] for r in rows]
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    hidden = torch.zeros(len(rows), width, states[0].shape[-1])
    for i, (r, state) in enumerate(zip(rows, states)):
        n = len(r["tokens"])
        tokens[i, :n] = r["tokens"].long()
        hidden[i, :n] = state.float()
    return Batch(tokens, hidden, torch.tensor([len(r["tokens"]) for r in rows]),
                 torch.tensor([r["prompt_len"] for r in rows]))


def draft_vocab(rows: list[dict], vocab: int, size: int) -> DraftVocab:
    """The ``size`` most frequent answer tokens of ``rows`` (all tokens when size is 0 or >= vocab)."""
    counts = torch.zeros(vocab)
    for r in rows:
        counts.index_add_(0, r["tokens"][r["prompt_len"]:].long(), torch.ones(len(r["tokens"]) - r["prompt_len"]))
    size = vocab if not size or size >= vocab else size
    ids = torch.sort(counts, descending=True, stable=True).indices[:size]
    to_draft = torch.full((vocab,), -100, dtype=torch.long)
    to_draft[ids] = torch.arange(size)
    return DraftVocab(ids, to_draft)


def _valid(batch: Batch, depth: int, offset: int) -> torch.Tensor:
    """[B, T] True where position i (root r = i + offset) drafts depth ``depth`` with a real label r + depth."""
    i = torch.arange(batch.tokens.shape[1])[None]
    root = i + offset
    return (root >= batch.prompt_lens[:, None] - 1) & (root + depth < batch.lengths[:, None]) & (root >= 1)


def _labels(batch: Batch, vocab: DraftVocab, shift: int) -> torch.Tensor:
    """[B, T] draft index of tokens[:, i + shift] (-100 past the end or outside the draft vocabulary)."""
    labels = torch.full_like(batch.tokens, -100)
    labels[:, : batch.tokens.shape[1] - shift] = vocab.to_draft[batch.tokens[:, shift:]]
    return labels


def eagle_passes(head: EagleHead | Eagle3Head | ParallelHead, embed: torch.Tensor, batch: Batch, depth: int) -> list[torch.Tensor]:
    """Outputs of passes 1..depth, each [B, T, D] (position i of pass k: the depth-k draft from root i-k+2).
    A parallel head's passes k >= 2 read its mask rows (mask row k - 1, whose feature is the anchor pair's
    g_{i-k+1}) instead of the previous pass's outputs.

    Pass k >= 2 runs only from the first position whose root can count (the batch's shortest prompt): a
    prompt's earlier positions have no chain; their outputs are left at zero and never read."""
    b, t = batch.tokens.shape
    embeds = F.pad(embed[batch.tokens[:, 1:]], (0, 0, 0, 1))  # [B, T, D] embed(t_{i+1})
    positions = torch.arange(t)[None].expand(b, t)
    first_root = max(0, int(batch.prompt_lens.min()) - 1)  # no chain starts earlier
    features, keys, values, outputs, starts = head.fuse(batch.hidden), [], [], [], []
    parallel, fused = getattr(head, "parallel", False), features
    for k in range(1, depth + 1):
        start = 0 if k == 1 else min(t - 1, first_root + k - 2)  # root i - k + 2 >= first_root
        starts.append(start)
        i = torch.arange(start, t)[:, None]
        blocks = [torch.arange(t)[None] <= i - k + 1]  # pass 1's keys (all positions)
        blocks += [torch.arange(starts[j - 1], t)[None] == i - k + j for j in range(2, k + 1)]  # passes 2..k
        mask = torch.cat(blocks, dim=1)[None]  # [1, T - start, keys so far]
        extra = (torch.cat(keys, 2), torch.cat(values, 2)) if keys else None
        if k >= 2 and parallel:  # mask row k - 1 after the pairs 0..i-k+1 (``heads/parallel.py``)
            pass_embeds = head.mask_embed[k - 2].expand(b, t - start, -1)
            pass_features = F.pad(fused[:, : t - k + 1], (0, 0, k - 1, 0))[:, start:]  # g_{i-k+1}
        else:
            pass_embeds, pass_features = embeds[:, start:], features[:, start:]
        out, (key, value) = head(pass_embeds, pass_features, positions[:, start:], mask, extra_kv=extra)
        keys.append(key)
        values.append(value)
        out = F.pad(out, (0, 0, start, 0))  # [B, T, D]
        outputs.append(out)
        features = F.pad(out[:, :-1], (0, 0, 1, 0))  # pass k+1 at i reads pass k's output at i-1
    return outputs


def eagle_loss(head, embed, lm_rows, vocab: DraftVocab, batch: Batch, depth: int, regression: float = 1.0,
               decay: float = 0.8, soft: bool = False,
               on_policy: float | None = None) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Loss over passes 1..depth, and per pass (correct [B, T] bool, valid [B, T] bool) for acceptance.
    ``soft``: KL divergence from the target's whole distribution over the draft vocabulary (its LM head on the
    recorded feature, as EAGLE trains), else cross-entropy against the token it chose (``_token_loss``).
    EAGLE-3 (``head.predicts_features`` False): tokens only, hard labels (its batch holds aux features, not
    the last hidden state the soft labels and the feature regression need). ``on_policy``: weigh the drafts
    as ``decode_weights`` does, with this weight off the decoding path (None: every draft weighs the same)."""
    terms, hits = [], []
    if not head.predicts_features:
        if soft:
            raise ValueError("EAGLE-3 heads train on hard labels only")
        regression = 0.0
    target_features = F.pad(batch.hidden[:, 1:], (0, 0, 0, 1))  # [B, T, D] f_{i+1}
    labels = _labels(batch, vocab, 2)  # t_{i+2}
    for k, out in enumerate(eagle_passes(head, embed, batch, depth), start=1):
        real = _valid(batch, k, offset=2 - k)  # root r = i - k + 2, label r + k = i + 2
        valid = real & (labels >= 0)  # and the label is in the draft vocabulary
        logits = head.draft_logits(out[valid], lm_rows)  # [n, Vd]
        per = _token_loss(logits, labels[valid], target_features[valid], lm_rows, soft)  # [n]
        if regression:
            per = per + regression * F.smooth_l1_loss(out[valid], target_features[valid], reduction="none").mean(-1)
        terms.append((per, valid, out))
        correct = torch.zeros_like(valid)
        correct[valid] = logits.argmax(-1) == labels[valid]
        hits.append((correct, real))  # a label outside the draft vocabulary counts as a miss
    return _reduce(terms, hits, "eagle", batch, decay, on_policy), hits


def medusa_loss(heads: MedusaHeads, embed, lm_rows, vocab: DraftVocab, batch: Batch, depth: int = 0,
                decay: float = 0.8, soft: bool = False,
                on_policy: float | None = None) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    terms, hits = [], []
    outputs = heads(batch.hidden)  # [K, B, T, D]
    for k in range(1, heads.num_heads + 1):
        labels = _labels(batch, vocab, 1 + k)  # t_{i+1+k}
        features = F.pad(batch.hidden[:, k:], (0, 0, 0, k))  # [B, T, D] f_{i+k}, whose image is t_{i+1+k}'s law
        real = _valid(batch, k, offset=1)  # root r = i + 1
        valid = real & (labels >= 0)
        logits = outputs[k - 1][valid] @ lm_rows.t()  # [n, Vd]
        terms.append((_token_loss(logits, labels[valid], features[valid], lm_rows, soft), valid, outputs))
        correct = torch.zeros_like(valid)
        correct[valid] = logits.argmax(-1) == labels[valid]
        hits.append((correct, real))
    return _reduce(terms, hits, "medusa", batch, decay, on_policy), hits


def _reduce(terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], hits, kind: str, batch: Batch,
            decay: float, on_policy: float | None) -> torch.Tensor:
    """The sum over depths k of decay^(k-1) x the mean of depth k's per-draft losses (``terms``: the losses [n],
    where they sit [B, T] and an output to keep the graph when n is 0), weighted by ``decode_weights`` when
    ``on_policy`` is a weight."""
    weights = None if on_policy is None else decode_weights(hits, kind, batch, on_policy)
    total = 0.0
    for k, (per, valid, out) in enumerate(terms, start=1):
        if not valid.any():
            term = out.sum() * 0
        elif weights is None:
            term = per.mean()
        else:
            w = weights[k - 1][valid]
            term = (per * w).sum() / w.sum().clamp_min(1e-6)
        total = total + decay ** (k - 1) * term
    return total


def decode_weights(hits: list[tuple[torch.Tensor, torch.Tensor]], kind: str, batch: Batch,
                   off_path: float) -> list[torch.Tensor]:
    """On-policy weights of each depth's drafts (per depth, [B, T] at the drafts' positions): 1 where greedy
    speculative decoding with this head would draft and verify it (``decode_walk``), ``off_path`` elsewhere.
    Training on those drafts (Draft-OPD's on-policy data: where the head's own chains run and where
    verification rejects them) spends the updates where the decoder uses the head."""
    on_path, _, _ = decode_walk(hits, kind, batch)
    return [off_path + (1.0 - off_path) * _shift(on_path[k], -shift)
            for k, shift in enumerate(_root_shifts(hits, kind))]


def decode_walk(hits: list[tuple[torch.Tensor, torch.Tensor]], kind: str,
                batch: Batch) -> tuple[torch.Tensor, int, int]:
    """Greedy speculative decoding along the batch's answers with chains of ``len(hits)`` drafts: from the first
    root (the last prompt token) it keeps the ``a`` drafts right in a row and goes on from root r + a + 1 (the
    target's own next token), so only those roots are drafted from, and of their chains only depths 1..a + 1
    are verified. Returns (on_path [K, B, T] by root: 1 for the verified drafts, the steps, the answer tokens
    they committed). ``hits`` are the (correct, valid) pairs the losses return: a greedy chain is right at depth k
    exactly when its teacher-forced drafts at depths 1..k are, as their inputs are then the target's tokens."""
    shifts = _root_shifts(hits, kind)
    alive, accepted = None, torch.zeros_like(hits[0][0], dtype=torch.long)
    for (correct, _), shift in zip(hits, shifts):
        right = _shift(correct, shift)
        alive = right if alive is None else alive & right
        accepted += alive
    first = _shift(hits[0][1], shifts[0])  # [B, T] roots with a depth-1 label
    on_path, steps, tokens = torch.zeros(len(hits), *accepted.shape), 0, 0
    for b in range(accepted.shape[0]):
        counts, roots = accepted[b].tolist(), first[b].tolist()
        r, end = int(batch.prompt_lens[b]) - 1, int(batch.lengths[b]) - 1  # (end: the answer's last position)
        while 0 <= r < len(roots) and roots[r]:
            on_path[: counts[r] + 1, b, r] = 1.0  # depths 1..a + 1 (at most the chain)
            steps, tokens = steps + 1, tokens + min(counts[r] + 1, end - r)  # (the answer may end first)
            r += counts[r] + 1
    return on_path, steps, tokens


def _root_shifts(hits: list, kind: str) -> list[int]:
    """Per depth k: the position of root r's depth-k draft minus r (EAGLE's pass k at i has root i - k + 2,
    Medusa's head k at i root i + 1)."""
    return [-1 if kind == "medusa" else k - 2 for k in range(1, len(hits) + 1)]


def _token_loss(logits: torch.Tensor, labels: torch.Tensor, features: torch.Tensor, lm_rows: torch.Tensor,
                soft: bool) -> torch.Tensor:
    """Per draft [n]: the cross-entropy of draft ``logits`` [n, Vd] against the chosen ``labels`` [n], or
    (``soft``) the KL divergence from the target's distribution (its LM head on the recorded ``features`` [n, D],
    over the draft vocabulary): the cross-entropy's gradient, with 0 for a perfect draft."""
    if not soft:
        return F.cross_entropy(logits, labels, reduction="none")
    with torch.no_grad():
        target = (features.float() @ lm_rows.float().t()).log_softmax(-1)  # [n, Vd]
    return F.kl_div(logits.float().log_softmax(-1), target, reduction="none", log_target=True).sum(-1)


def chain_acceptance(hits: list[tuple[torch.Tensor, torch.Tensor]], kind: str) -> list[tuple[float, float]]:
    """Per depth k: (hits, roots) of a greedy chain drafted from each root being right at depths 1..k."""
    out, alive = [], None
    for (correct, valid), shift in zip(hits, _root_shifts(hits, kind)):
        c = _shift(correct, shift)
        v = _shift(valid, shift)
        alive = c if alive is None else alive & c
        out.append((float((alive & v).sum()), float(v.sum())))
    return out


def _shift(x: torch.Tensor, shift: int) -> torch.Tensor:
    """y[:, r] = x[:, r + shift] (False where out of range)."""
    y = torch.zeros_like(x)
    t = x.shape[1]
    if shift >= 0:
        y[:, : t - shift] = x[:, shift:]
    else:
        y[:, -shift:] = x[:, : t + shift]
    return y
