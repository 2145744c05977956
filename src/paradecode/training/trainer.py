"""The training loop for draft heads: AdamW, warm-up + cosine schedule, progress bar, held-out acceptance per
epoch, a checkpoint every few steps (an interrupted run resumes where it stopped), the head saved after
every epoch as fp16 safetensors + config.json (``heads.store``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from paradecode.errors import ParadecodeError
from paradecode.heads.eagle import HeadShape
from paradecode.heads.store import AUX_KINDS, TargetWeights, build_head, head_config, save_head
from paradecode.training.losses import (DraftVocab, chain_acceptance, decode_walk, draft_vocab, eagle_loss,
                                        make_batch, medusa_loss)

LOSSES = {"eagle": eagle_loss, "eagle3": eagle_loss, "parallel": eagle_loss, "medusa": medusa_loss}


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "eagle"
    epochs: int = 3
    batch_size: int = 8  # sequences per step
    lr: float = 1e-3
    draft_vocab: int = 4096  # draft logits over this many most frequent answer tokens (0: the full vocabulary)
    depth: int = 3  # eagle, eagle3, parallel: unrolled draft depths trained per step (the training-time test)
    eval_depth: int = 5  # eagle: depths the held-out acceptance estimate unrolls
    medusa_heads: int = 4
    aux_layers: tuple[int, ...] = ()  # eagle3, parallel: the target layers whose inputs it reads (empty: 2, L/2, L-3)
    feature_loss: float = 1.0  # eagle: weight of the smooth-L1 loss on the predicted feature (0: tokens only)
    soft_labels: bool = False  # True: KL to the target's distribution over the draft vocabulary; False: CE on its token
    precision: str = "auto"  # fp32 | bf16 (autocast, fp32 weights) | auto: bf16 where it measures faster
    init: str = ""  # a head folder to start from (same kind and target), e.g. to go on training with more data
    on_policy: bool = False  # weigh the drafts greedy decoding with the head makes (``losses.decode_weights``)
    off_path_weight: float = 0.1  # on_policy: the other drafts' weight (they keep a share: the path moves as it learns)
    holdout: int = 32  # sequences kept out of training for the acceptance estimate
    checkpoint_every: int = 40  # steps
    seed: int = 0

    def __post_init__(self) -> None:
        if self.on_policy and not self.init:
            raise ParadecodeError("on-policy training fine-tunes a trained head (the path its drafts take through "
                                  "the answers): pass --init HEAD_FOLDER, a head trained without --on-policy.")


def train_head(rows: list[dict], target: TargetWeights, target_name: str, out: Path, config: TrainConfig,
               log: Callable[[str], None] = print, progress: bool = True, training_info: dict | None = None,
               features: Callable[[list[dict], tuple[int, ...]], list[torch.Tensor]] | None = None):
    """Train a head on self-distilled ``rows``; returns (the head, its saved config with the per-epoch history).
    ``features(rows, aux_layers)`` computes the target's features along rows (``training.features``): the inputs
    of ``aux_layers`` (EAGLE-3), or with no aux layers the last hidden state (rows stored without it)."""
    from tqdm import tqdm

    if config.kind in AUX_KINDS and config.soft_labels:
        raise ParadecodeError(f"{config.kind} heads train on hard labels only (--labels hard).")
    needs_features = config.kind in AUX_KINDS or any("hidden" not in r for r in rows)
    if needs_features and features is None:
        raise ParadecodeError("these rows carry no hidden states (or an eagle3 head needs other layers'): "
                              "train through train_draft_head, which computes them with the target.")

    torch.manual_seed(config.seed)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(config.seed)).tolist()
    holdout = [rows[i] for i in order[: config.holdout]]
    train = [rows[i] for i in order[config.holdout :]]
    vocab = draft_vocab(train, target.config["vocab_size"], config.draft_vocab)
    lm_rows = target.lm_head[vocab.ids].contiguous()  # [Vd, D]
    shape = HeadShape.from_target_config(target.config)
    head = build_head(config.kind, shape, config.medusa_heads, num_layers=target.config["num_hidden_layers"],
                      aux_layers=config.aux_layers, draft_vocab=len(vocab.ids))
    if config.kind in AUX_KINDS:
        head.init_lm_head(lm_rows)
    batch_features = functools.partial(features, aux_layers=head.aux_layers) if needs_features else None
    if config.init:
        from paradecode.heads.store import load_head

        start = load_head(config.init, config.kind, target).module
        if config.kind == "medusa" and start.num_heads != config.medusa_heads:
            raise ParadecodeError(f"--init {config.init} has {start.num_heads} Medusa heads, not {config.medusa_heads}.")
        head.load_state_dict(start.state_dict())
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total = steps_per_epoch * config.epochs
    warmup = max(1, min(20, total // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))))
    state = dict(epoch=0, step=0, history=[], seconds=0.0)
    out.mkdir(parents=True, exist_ok=True)  # --data may live elsewhere, so nothing has made it yet
    checkpoint = out / "checkpoint.pt"
    if checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        if saved["config"] == dataclasses.asdict(config) and saved["rows"] == len(rows):
            head.load_state_dict(saved["head"])
            optimizer.load_state_dict(saved["optimizer"])
            schedule.load_state_dict(saved["schedule"])
            state = saved["state"]
            log(f"resuming at epoch {state['epoch'] + 1}, step {state['step']}")
        else:
            log("checkpoint from a different configuration or data set: starting over")
    on_policy = config.off_path_weight if config.on_policy else None
    loss_fn = (functools.partial(medusa_loss, soft=config.soft_labels, on_policy=on_policy) if config.kind == "medusa"
               else functools.partial(eagle_loss, regression=config.feature_loss, soft=config.soft_labels,
                                      on_policy=on_policy))
    autocast = autocast_dtype(config.precision, target.config["hidden_size"], target.config["intermediate_size"])
    log(f"training in {'bf16 autocast' if autocast else 'fp32'}")
    depth = 0 if config.kind == "medusa" else config.depth

    def save_checkpoint() -> None:
        torch.save(dict(config=dataclasses.asdict(config), rows=len(rows), head=head.state_dict(),
                        optimizer=optimizer.state_dict(), schedule=schedule.state_dict(), state=state),
                   checkpoint.with_suffix(".tmp"))
        checkpoint.with_suffix(".tmp").rename(checkpoint)

    saved_config = {}
    while state["epoch"] < config.epochs:
        epoch = state["epoch"]
        batches = epoch_batches(train, config.batch_size, config.seed + 1 + epoch)
        bar = tqdm(total=steps_per_epoch, initial=state["step"], desc=f"epoch {epoch + 1}/{config.epochs}",
                   disable=not progress, dynamic_ncols=True)
        head.train()
        started = time.perf_counter()
        while state["step"] < steps_per_epoch:
            batch = make_batch([train[i] for i in batches[state["step"]]], batch_features)
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                loss, _ = loss_fn(head, target.embed, lm_rows, vocab, batch, depth)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            state["step"] += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if state["step"] % config.checkpoint_every == 0:
                state["seconds"] += time.perf_counter() - started
                started = time.perf_counter()
                save_checkpoint()
        bar.close()
        state["seconds"] += time.perf_counter() - started
        accept = evaluate(head, target, lm_rows, vocab, holdout, config, features=batch_features)
        state["history"].append(dict(epoch=epoch + 1, loss=loss.item(), **accept))
        state["epoch"], state["step"] = epoch + 1, 0
        info = dict(training_info or {}, config=dataclasses.asdict(config), history=state["history"],
                    train_sequences=len(train), holdout_sequences=len(holdout), train_seconds=round(state["seconds"]))
        saved_config = head_config(head, target, target_name, vocab.ids if config.draft_vocab else None, info)
        save_head(out, head, saved_config, vocab.ids if config.draft_vocab else None)
        save_checkpoint()
        log(f"epoch {epoch + 1}: loss {loss.item():.3f}, held-out acceptance by depth "
            f"{[round(a, 3) for a in accept['acceptance']]}, estimated tokens/step {accept['tau_chain']:.2f}, "
            f"greedy decoding's tokens/step by chain length {[round(t, 2) for t in accept['tau_decode']]}")
    if not saved_config:  # every epoch was done before: the head on disk is the result
        saved_config = json.loads((out / "config.json").read_text())
    elif config.draft_vocab and config.kind not in AUX_KINDS:  # (eagle3, parallel: their own LM head's rows)
        saved_config["training"]["vocab_sweep"] = vocab_sweep(head, target, vocab, holdout, config, batch_features)
        log(f"draft vocabulary size vs held-out acceptance: {saved_config['training']['vocab_sweep']}")
        save_head(out, head, saved_config, vocab.ids)
    return head, saved_config


def autocast_dtype(precision: str, hidden: int, intermediate: int) -> torch.dtype | None:
    """bf16 for ``precision`` bf16, None (fp32) for fp32; ``auto`` times the head's largest matmul both ways on
    this CPU (bf16 is several times faster where the CPU has bf16 instructions, slower where it is emulated)."""
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, got {precision!r}")
    if precision != "auto":
        return torch.bfloat16 if precision == "bf16" else None
    x, w = torch.randn(2048, hidden), torch.randn(intermediate, hidden)
    pairs = {dtype: (x.to(dtype), w.to(dtype).t()) for dtype in (torch.float32, torch.bfloat16)}
    seconds = {dtype: float("inf") for dtype in pairs}
    for _ in range(7):  # the two alternate, so a busy moment of the machine (another job) slows both alike
        for dtype, (a, b) in pairs.items():
            started = time.perf_counter()
            a @ b
            seconds[dtype] = min(seconds[dtype], time.perf_counter() - started)
    return torch.bfloat16 if seconds[torch.bfloat16] < 0.7 * seconds[torch.float32] else None


def epoch_batches(rows: list[dict], batch_size: int, seed: int, span: int = 8) -> list[list[int]]:
    """One epoch's batches (row indices), the same for the same seed: rows shuffled, each run of ``span``
    batches' worth sorted by length so a batch pads little (random batches of these answers were a third
    padding), then the batches shuffled."""
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(rows), generator=generator).tolist()
    batches = []
    for first in range(0, len(perm), batch_size * span):
        chunk = sorted(perm[first : first + batch_size * span], key=lambda i: len(rows[i]["tokens"]))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def vocab_sweep(head, target: TargetWeights, vocab: DraftVocab, rows: list[dict], config: TrainConfig,
                features=None) -> list[dict]:
    """Held-out acceptance when drafting over the N most frequent tokens only (``--opt draft_vocab=N``), for N
    from an eighth of the trained draft vocabulary up to all of it, with the share of answer tokens it covers."""
    sizes = sorted({max(1, len(vocab.ids) // f) for f in (8, 4, 2, 1)})
    answers = torch.cat([r["tokens"][r["prompt_len"]:].long() for r in rows])
    results = []
    for size in sizes:
        ids = vocab.ids[:size]
        to_draft = torch.full_like(vocab.to_draft, -100)
        to_draft[ids] = torch.arange(size)
        accept = evaluate(head, target, target.lm_head[ids].contiguous(), DraftVocab(ids, to_draft), rows, config,
                          features=features)
        results.append(dict(size=size, coverage=round(float((to_draft[answers] >= 0).float().mean()), 4),
                            acceptance=[round(a, 4) for a in accept["acceptance"]],
                            tau_chain=round(accept["tau_chain"], 3)))
    return results


@torch.no_grad()
def evaluate(head, target: TargetWeights, lm_rows, vocab, rows: list[dict], config: TrainConfig,
             batch_size: int = 8, features=None) -> dict:
    """Held-out greedy chain acceptance: per depth k, the share of roots whose draft is right at depths 1..k,
    the tokens per step a chain of that length would give from any root (1 + the sum of those shares), and,
    per chain length 1..depth, the tokens per step greedy speculative decoding with such chains makes along
    the answers (``decode_walk``: only the roots decoding reaches)."""
    head.eval()
    depth = config.medusa_heads if config.kind == "medusa" else config.eval_depth
    totals, walks = None, [[0, 0] for _ in range(depth)]  # per chain length: steps, tokens
    for first in range(0, len(rows), batch_size):
        batch = make_batch(rows[first : first + batch_size], features)
        _, hits = LOSSES[config.kind](head, target.embed, lm_rows, vocab, batch, depth)
        counts = chain_acceptance(hits, config.kind)
        totals = counts if totals is None else [(a + c, b + d) for (a, b), (c, d) in zip(totals, counts)]
        for length, walk in enumerate(walks, start=1):
            _, steps, tokens = decode_walk(hits[:length], config.kind, batch)
            walk[0], walk[1] = walk[0] + steps, walk[1] + tokens
    head.train()
    shares = [hit / max(roots, 1.0) for hit, roots in totals or []]
    return dict(acceptance=shares, tau_chain=1.0 + sum(shares),
                tau_decode=[tokens / max(steps, 1) for steps, tokens in walks])
