"""The masked-diffusion decoding loop (after LLaDA's reference ``generate``), with blocks, caches and EoT stop.

The sequence is [prompt + canvas of ``gen_length`` mask tokens]. The canvas is decoded in semi-autoregressive
blocks of ``block_length``, left to right; inside a block, every step runs the model once, takes a token for
each masked position of the block (argmax, or Gumbel-max with float64 noise when temperature > 0, as in
LLaDA), and lets the sampler choose which of them to commit. Fixed-step samplers commit counts planned once
per block (``steps`` spread over the blocks).

End-of-text stop (Learn2PD's EoTP): once a position holds a committed end-of-text token, every still-masked
position after it is padding, so it is filled with end-of-text at once instead of being denoised; a committed
token is never changed, and the answer is the canvas up to the first end-of-text.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from paradecode.dllm.cache import CACHE_MODES
from paradecode.dllm.protocol import DiffusionLM
from paradecode.dllm.samplers.base import Sampler, StepView, planned_counts
from paradecode.errors import ParadecodeError
from paradecode.stats import DecodeStats


@dataclass(frozen=True)
class DecodeConfig:
    gen_length: int | None = None  # canvas length; None: the model's own default
    block_length: int | None = None  # None: one block over the whole canvas
    steps: int | None = None  # fixed-step samplers; None: gen_length (one token per step)
    temperature: float = 0.0
    seed: int | None = None
    eot_stop: bool = True
    cache: str = "none"  # "none" | "prefix" | "dual" (Fast-dLLM's approximate caches)
    refresh_every: int = 0  # cached modes: also refresh the whole cache every this many steps (0: per block)

    def __post_init__(self) -> None:
        for name in ("gen_length", "block_length", "steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ParadecodeError(f"{name.replace('_', ' ')} must be a positive integer, got {value!r}.")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ParadecodeError(f"temperature must be a number >= 0, got {self.temperature!r}.")
        if self.cache not in CACHE_MODES:
            raise ParadecodeError(f"unknown cache {self.cache!r}; choose one of: {', '.join(CACHE_MODES)}.")
        if not isinstance(self.refresh_every, int) or self.refresh_every < 0:
            raise ParadecodeError(f"refresh every must be an integer >= 0, got {self.refresh_every!r}.")


@dataclass
class CommitStep:
    """One forward pass: the canvas positions it committed (and their tokens), and any EoT-filled ones."""

    positions: list[int]
    tokens: list[int]
    confidences: list[float]
    filled: list[int] = field(default_factory=list)  # positions set to end-of-text by the EoT stop
    committed: int = 0  # positions this step decided (committed + filled)
    time_s: float = 0.0


@dataclass
class DiffusionResult:
    text: str
    token_ids: list[int]  # the answer: canvas tokens before the first end-of-text
    canvas: list[int]  # the whole decoded canvas
    stats: DecodeStats

    def to_dict(self, with_steps: bool = False) -> dict:
        return dict(text=self.text, token_ids=self.token_ids, canvas=self.canvas,
                    stats=self.stats.to_dict(with_steps=with_steps))


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """argmax of exp(logits) / (-log u)^temperature with u ~ U(0, 1) in float64: a sample from
    softmax(logits / temperature) (LLaDA: low-precision Gumbel noise hurts quality)."""
    if temperature == 0:
        return logits.argmax(-1)
    noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator)
    return (logits.double().exp() / (-torch.log(noise)) ** temperature).argmax(-1)


def block_plan(cfg: DecodeConfig, gen_length: int, sampler: Sampler) -> tuple[int, int, int]:
    """(block length, number of blocks, steps per block), with errors that say what to change."""
    block = cfg.block_length or gen_length
    if gen_length % block:
        raise ParadecodeError(f"block length {block} must divide the canvas length {gen_length}.")
    blocks = gen_length // block
    if not sampler.fixed_steps:
        if cfg.steps is not None:
            raise ParadecodeError(f"sampler {sampler.name!r} chooses its own number of steps; --steps applies to "
                                  "the fixed-step samplers (topk, random, entropy, margin).")
        return block, blocks, 0
    steps = cfg.steps or gen_length
    if steps % blocks or steps > gen_length:
        raise ParadecodeError(f"steps ({steps}) must be a multiple of the number of blocks ({blocks}) and at most "
                              f"the canvas length ({gen_length}).")
    return block, blocks, steps // blocks


class _Runner:
    """Runs the model for one step, through the cache the config asks for; counts forward passes."""

    def __init__(self, model: DiffusionLM, cfg: DecodeConfig):
        if cfg.cache != "none" and not model.supports_cache:
            raise ParadecodeError(f"this model has no key/value cache; use --cache none (got {cfg.cache!r}).")
        self.model, self.cfg, self.forwards = model, cfg, 0
        self.cache = model.new_cache() if cfg.cache != "none" else None

    @torch.no_grad()
    def block_logits(self, x: torch.Tensor, lo: int, hi: int, step: int) -> torch.Tensor:  # -> [hi - lo, V]
        self.forwards += 1
        total = x.shape[0]
        refresh = step == 0 or (self.cfg.refresh_every and step % self.cfg.refresh_every == 0)
        if self.cache is None or refresh:
            logits = self.model(x[None], index=torch.arange(total), cache=self.cache)[0]  # [T, V]
            return logits[lo:hi]
        end = total if self.cfg.cache == "prefix" else hi  # dual: the suffix after the block is cached too
        logits = self.model(x[None, lo:end], index=torch.arange(lo, end), cache=self.cache)[0]
        return logits[: hi - lo]


def diffuse(model: DiffusionLM, prompt_ids: list[int], sampler: Sampler, cfg: DecodeConfig = DecodeConfig(),
            target: list[int] | None = None) -> DiffusionResult:
    """Decode an answer for ``prompt_ids``; ``target`` (answer + end-of-text padding) feeds the oracle."""
    start_time = time.perf_counter()
    gen_length = cfg.gen_length or model.gen_length
    block, blocks, steps_per_block = block_plan(cfg, gen_length, sampler)
    prompt_len = len(prompt_ids)
    if prompt_len + gen_length > model.max_length:
        raise ParadecodeError(f"prompt ({prompt_len} tokens) + canvas ({gen_length}) = {prompt_len + gen_length} "
                              f"positions, more than this model's context of {model.max_length}.")
    mask_id, eot_id = model.mask_id, model.eot_id
    x = torch.tensor(list(prompt_ids) + [mask_id] * gen_length)  # [T]
    answer = torch.tensor(target) if target is not None else None  # [gen_length]
    generator = torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else int(torch.randint(2**62, ())))
    runner, records = _Runner(model, cfg), []
    sampler.reset()
    for b in range(blocks):
        lo, hi = prompt_len + b * block, prompt_len + (b + 1) * block
        counts = planned_counts(int((x[lo:hi] == mask_id).sum()), steps_per_block) if steps_per_block else []
        step = 0
        while bool((x[lo:hi] == mask_id).any()):
            step_start = time.perf_counter()
            logits = runner.block_logits(x, lo, hi, step)  # [block, V]
            logits[:, mask_id] = float("-inf")  # committing the mask token would leave the position masked
            masked = torch.nonzero(x[lo:hi] == mask_id).flatten()  # [n] block offsets still masked
            probs = torch.softmax(logits[masked].double(), -1)  # [n, V]
            x0 = gumbel_argmax(logits[masked], cfg.temperature, generator)  # [n]
            confidence = probs.gather(-1, x0[:, None])[:, 0]  # [n]
            view = StepView(x0=x0, confidence=confidence, probs=probs, generator=generator,
                            count=counts[step] if step < len(counts) else 1,
                            target=answer[lo - prompt_len + masked] if answer is not None else None,
                            positions=lo - prompt_len + masked)
            chosen, tokens = sampler.choose(view)  # [k] indices into `masked`, [k] tokens to write there
            positions = lo + masked[chosen]
            x[positions] = tokens
            record = CommitStep(positions=(positions - prompt_len).tolist(), tokens=tokens.tolist(),
                                confidences=[round(c, 4) for c in probs[chosen, tokens].tolist()])
            if cfg.eot_stop:
                record.filled = _fill_after_eot(x, prompt_len, mask_id, eot_id)
            record.committed = len(record.positions) + len(record.filled)
            record.time_s = time.perf_counter() - step_start
            records.append(record)
            step += 1
        if not bool((x[prompt_len:] == mask_id).any()):
            break  # the EoT stop filled the later blocks: no forward pass spent on padding
    stop_reason = "eot" if any(r.filled for r in records) else "canvas"
    canvas = x[prompt_len:].tolist()
    ids = canvas[: canvas.index(eot_id)] if eot_id in canvas else canvas
    stats = DecodeStats(method=f"dllm-{sampler.name}", prompt_tokens=prompt_len, new_tokens=len(ids),
                        forward_passes=runner.forwards, wall_time_s=time.perf_counter() - start_time,
                        stop_reason=stop_reason, steps=records,
                        info=dict(sampler=sampler.name, options=asdict(sampler.options), decode=asdict(cfg),
                                  gen_length=gen_length))
    return DiffusionResult(text=model.decode(ids), token_ids=ids, canvas=canvas, stats=stats)


def _fill_after_eot(x: torch.Tensor, prompt_len: int, mask_id: int, eot_id: int) -> list[int]:
    """EoT stop: fill masked canvas positions after the first committed end-of-text; returns them."""
    canvas = x[prompt_len:]  # a view: writes go to x
    eots = torch.nonzero(canvas == eot_id).flatten()
    if not eots.numel():
        return []
    after = torch.arange(canvas.shape[0]) > int(eots[0])
    fill = torch.nonzero(after & (canvas == mask_id)).flatten()
    canvas[fill] = eot_id
    return fill.tolist()
