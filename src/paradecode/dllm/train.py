"""Train a shipped model: one data / optimiser loop for the masked-diffusion objective and the AR twin.

    paradecode dllm train --suite waiting-line --out my-model/            # the dLLM
    paradecode dllm train --suite waiting-line --objective ar --out twin/ # its autoregressive twin

Masked diffusion (LLaDA's SFT objective): the prompt stays clean; each canvas token (answer, then end-of-text
padding up to ``gen_length``) is masked with probability t ~ U(eps, 1), and the cross-entropy on masked
positions is weighted by 1/t (an upper bound on the negative log-likelihood). The AR twin sees the same
examples as prompt + answer + end-of-text and learns the next token of the answer part.

The loop writes ``train_state.pt`` every ``checkpoint_every`` steps and resumes from it when run again with
the same ``--out``; the final model is ``model.safetensors`` + ``config.json`` in ``--out``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from paradecode.dllm.model import ModelConfig, TinyLM
from paradecode.dllm.tasks import Vocab, heldout, suite_tasks, training_batch
from paradecode.errors import ParadecodeError

OBJECTIVES = ("diffusion", "ar")
SUITE_GEN_LENGTH = {"waiting-line": 12, "latin": 16}  # longest answer (+ one end-of-text for the lists)
HELDOUT_PER_TASK = 100
SHIPPED = {("waiting-line", "diffusion"): (5000, 1000), ("latin", "diffusion"): (500, 0),
           ("waiting-line", "ar"): (3500, 1000)}  # (steps, cooldown) of the shipped checkpoints


@dataclass(frozen=True)
class TrainConfig:
    suite: str = "waiting-line"
    objective: str = "diffusion"
    steps: int = 3000
    batch_size: int = 128
    lr: float = 1e-3
    warmup: int = 200
    cooldown: int = 0  # the last `cooldown` steps decay the learning rate linearly to 0
    weight_decay: float = 0.01
    min_mask_ratio: float = 1e-3  # eps: t ~ U(eps, 1)
    seed: int = 0
    checkpoint_every: int = 250
    threads: int = 1

    def __post_init__(self) -> None:
        suite_tasks(self.suite)
        if self.objective not in OBJECTIVES:
            raise ParadecodeError(f"unknown objective {self.objective!r}; choose one of: {', '.join(OBJECTIVES)}.")
        if not isinstance(self.cooldown, int) or not 0 <= self.cooldown <= self.steps:
            raise ParadecodeError(f"cooldown must be an integer in [0, steps], got {self.cooldown!r}.")
        for name in ("steps", "batch_size", "threads", "checkpoint_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ParadecodeError(f"{name} must be a positive integer, got {getattr(self, name)!r}.")


def encode_batch(vocab: Vocab, pairs, gen_length: int, objective: str):
    """Left-padded token rows [B, T], their validity [B, T], and the first answer column of each row [B]."""
    rows, starts = [], []
    for prompt, answer in pairs:
        p, a = vocab.encode(prompt), vocab.encode(answer)
        if objective == "diffusion":
            if len(a) > gen_length:
                raise ParadecodeError(f"answer of {len(a)} tokens does not fit a canvas of {gen_length}.")
            a = a + [vocab.eot_id] * (gen_length - len(a))
        else:
            a = a + [vocab.eot_id]
        rows.append(p + a)
        starts.append(len(p))
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), vocab.pad_id, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    answer_from = torch.empty(len(rows), dtype=torch.long)
    for i, (row, start) in enumerate(zip(rows, starts)):
        tokens[i, width - len(row):] = torch.tensor(row)
        valid[i, width - len(row):] = True
        answer_from[i] = width - len(row) + start
    return tokens, valid, answer_from


def diffusion_loss(model: TinyLM, tokens, valid, answer_from, eps: float, generator) -> torch.Tensor:
    b, width = tokens.shape
    canvas = torch.arange(width)[None] >= answer_from[:, None]  # [B, T]
    t = eps + (1 - eps) * torch.rand(b, 1, generator=generator)  # [B, 1] masking ratio per row
    masked = canvas & (torch.rand(b, width, generator=generator) < t)  # [B, T]
    noisy = torch.where(masked, model.mask_id, tokens)
    logits = model(noisy, valid)  # [B, T, V]
    ce = F.cross_entropy(logits[masked], tokens[masked], reduction="none")  # [masked]
    weight = (1.0 / t).expand(b, width)[masked]
    return (ce * weight).sum() / canvas.sum()


def ar_loss(model: TinyLM, tokens, valid, answer_from) -> torch.Tensor:
    logits = model(tokens[:, :-1], valid[:, :-1])  # [B, T-1, V]: position i predicts token i+1
    target_pos = torch.arange(1, tokens.shape[1])[None]
    scored = target_pos >= answer_from[:, None]  # [B, T-1]
    return F.cross_entropy(logits[scored], tokens[:, 1:][scored])


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, constant, then a linear cool-down over the last ``cooldown`` steps. Until the cool-down
    starts the rate does not depend on ``steps``, so a run resumed with other ``steps`` / ``cooldown`` from a
    checkpoint before its cool-down is exactly the run those settings give from scratch."""
    decay = min(1.0, (cfg.steps - step) / cfg.cooldown) if cfg.cooldown else 1.0
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup, decay)


def train(cfg: TrainConfig, out: Path, progress: bool = True) -> TinyLM:
    """Train (or resume) into ``out``; returns the trained model, also saved there."""
    from tqdm import tqdm

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model_cfg = ModelConfig(suite=cfg.suite, gen_length=SUITE_GEN_LENGTH[cfg.suite], causal=cfg.objective == "ar")
    model = TinyLM(model_cfg)
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    state_path, step, elapsed, losses = out / "train_state.pt", 0, 0.0, []
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        schedule = dict(steps=cfg.steps, threads=cfg.threads, cooldown=cfg.cooldown)  # may change on resume
        if {**state["train_config"], **schedule} != asdict(cfg):
            raise ParadecodeError(f"{out} holds a run with other settings ({state['train_config']}); "
                                  "use another --out or the same settings to resume it.")
        model.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        generator.set_state(state["generator"])
        step, elapsed, losses = state["step"], state["elapsed_s"], state["losses"]
    exclude = {prompt for _, prompt, _ in heldout(cfg.suite, HELDOUT_PER_TASK)}
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.suite} ({cfg.objective})", disable=not progress,
               file=sys.stderr, mininterval=5.0)
    model.train()
    started = time.perf_counter() - elapsed
    while step < cfg.steps:
        pairs = training_batch(cfg.suite, cfg.seed, step, cfg.batch_size, exclude)
        tokens, valid, answer_from = encode_batch(model.vocab, pairs, model_cfg.gen_length, cfg.objective)
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(cfg, step)
        if cfg.objective == "diffusion":
            loss = diffusion_loss(model, tokens, valid, answer_from, cfg.min_mask_ratio, generator)
        else:
            loss = ar_loss(model, tokens, valid, answer_from)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        step += 1
        losses.append(round(loss.item(), 4))
        bar.update(1)
        bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}", refresh=False)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            torch.save(dict(model=model.state_dict(), optimiser=optimiser.state_dict(), generator=generator.get_state(),
                            step=step, elapsed_s=time.perf_counter() - started, losses=losses,
                            train_config=asdict(cfg)), state_path)
            bar.write(f"step {step}/{cfg.steps}: loss {sum(losses[-50:]) / len(losses[-50:]):.4f}, "
                      f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    bar.close()
    model.eval()
    info = dict(train_config=asdict(cfg), train_time_s=round(time.perf_counter() - started, 1),
                final_loss=sum(losses[-50:]) / len(losses[-50:]), parameters=model.num_parameters(),
                command=f"paradecode dllm train --suite {cfg.suite} --objective {cfg.objective} --steps {cfg.steps} "
                        f"--cooldown {cfg.cooldown} --batch-size {cfg.batch_size} --seed {cfg.seed}")
    model.config = replace(model_cfg, info=info)
    model.save(out)
    (out / "loss.json").write_text(json.dumps(losses), encoding="utf-8")
    return model
