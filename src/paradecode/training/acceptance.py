"""Teacher-forced acceptance of draft heads on a benchmark's answers (``paradecode eval-draft``).

The target answers the benchmark's first turns itself (greedy ``ar``, the answers every lossless method
produces); then each head drafts a greedy chain from every root of every answer, reading the target's true
features along the answer: the share of roots whose draft is right at depths 1..k, and the tokens per step a
chain of length k would give (1 + the sum of those shares). This is what a head would accept when drafting
the benchmark, without the decoding loop: the held-out estimate training prints is the same measure on the
training data's own kind of answers, so the two side by side show how far the training data is from the
benchmark.

The cost side: ``draft_step_seconds`` times one draft step of a head as it drafts (one pair through the head
with its own cache, then its draft logits; a parallel head's pair comes with its mask rows; ``head_dtype`` int8
by default, so an EAGLE, EAGLE-3 or parallel head's step runs on the native forward where the drafter runs it)
against a one-token forward of the target, both at the same context length, interleaved, medians.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from paradecode.heads.store import load_head, target_weights
from paradecode.training.features import TargetFeatures
from paradecode.training.losses import DraftVocab
from paradecode.training.trainer import TrainConfig, evaluate


def benchmark_rows(model, prompts: Sequence[list[int]], max_new_tokens: int, batch: int = 16) -> list[dict]:
    """The target's greedy answers to ``prompts`` (token ids) as training-style rows {tokens, prompt_len}."""
    results = model.generate_batch(list(prompts), max_batch=batch, method="ar", max_new_tokens=max_new_tokens)
    return [dict(tokens=torch.tensor(list(p) + r.token_ids, dtype=torch.int32), prompt_len=len(p))
            for p, r in zip(prompts, results)]


def head_acceptance(model, model_dir: Path, folder: str | Path, rows: list[dict], depth: int) -> dict:
    """Chain acceptance of the head in ``folder`` over ``rows``: {kind, acceptance by depth, tau_chain}."""
    target = target_weights(str(model_dir))
    head = load_head(folder, None, target)
    kind, module = head.config["kind"], head.module
    vocab_size = target.config["vocab_size"]
    ids = head.draft_ids if head.draft_ids is not None else torch.arange(vocab_size)
    to_draft = torch.full((vocab_size,), -100, dtype=torch.long)
    to_draft[ids] = torch.arange(len(ids))
    config = TrainConfig(kind=kind, eval_depth=depth, medusa_heads=getattr(module, "num_heads", 4))
    features = TargetFeatures(model_dir, model=model)
    aux = tuple(getattr(module, "aux_layers", ()))
    result = evaluate(module, target, target.lm_head[ids].contiguous(), DraftVocab(ids, to_draft), rows, config,
                      features=lambda batch: features(batch, aux_layers=aux))
    return dict(kind=kind, head=str(folder), **result)


@torch.inference_mode()
def draft_step_seconds(model, model_dir: Path, folder: str | Path, context: int = 256, repeats: int = 30,
                       head_dtype: str = "int8", depth: int = 4) -> dict:
    """Median seconds of one draft step of the head in ``folder`` and of a one-token target forward, at
    ``context`` tokens of context; and their ratio. A step drafts one token (EAGLE: what one drafted token
    costs in target forwards), or ``depth`` tokens for a parallel head (one pair and depth - 1 mask rows in
    one forward) and all of Medusa's at once (``draft_tokens``)."""
    from paradecode.backends.base import causal_mask
    from paradecode.drafters.head_drafter import load_runtime
    from paradecode.heads.eagle import EagleCache

    target = target_weights(str(model_dir))
    kind = load_head(folder, None, target).config["kind"]
    runtime = load_runtime(str(Path(folder).resolve()), kind, str(Path(model_dir).resolve()), 0, head_dtype)
    module, backend = runtime.module, model.backend
    context = min(context, backend.max_length - 2)
    ids = torch.randint(backend.vocab_size, (context + 1,), generator=torch.Generator().manual_seed(0))
    backend.reset()
    out = backend.forward(ids[:context], logits=False, return_hidden=True,
                          aux_layers=tuple(getattr(module, "aux_layers", ())))
    features = out.aux if out.aux is not None else out.hidden  # [context, W]
    head, cache = None, None
    masks = depth - 1 if kind == "parallel" else 0  # the parallel head drafts every depth in the one forward
    native = runtime.native_layer(context + 2 + masks)  # where the drafter runs its steps (natively, but Medusa's)
    if native is not None:
        fused = module.fuse(features.float())  # [context, D] as the drafters feed them
        native(torch.cat((runtime.embed[ids[1 : context + 1]], fused), -1), None, None, skip=context - 1)
        head = fused[-1:]  # [1, D]
        rows = torch.cat((runtime.embed[ids[-1:]], head), -1)  # [1, 2D]: the step's pair
        if masks:
            rows = torch.cat((rows, torch.cat(module.mask_rows(masks, head[0]), -1)))  # and its mask rows
    elif kind != "medusa":
        cache = EagleCache(module.shape, context + 2 + masks)
        module(runtime.embed[ids[1 : context + 1]][None], module.fuse(features)[None], torch.arange(context)[None],
               torch.ones(context, context, dtype=torch.bool).tril()[None], cache=cache)
        head = module.fuse(features[-1:])[None]  # [1, 1, D]: a feature as the step feeds it

    def step() -> None:
        if native is not None:
            native.length = context
            native(rows, None, None)
            return
        if kind == "medusa":
            runtime.draft_logits(module(features[-1:].float())[:, 0])
            return
        cache.length = context
        embeds, fed = runtime.embed[ids[-1:]], head[0]  # [1, D] each
        if masks:
            mask_embeds, mask_features = module.mask_rows(masks, head[0, 0])
            embeds, fed = torch.cat((embeds, mask_embeds)), torch.cat((fed, mask_features))
        feature, _ = module(embeds[None], fed[None], torch.arange(context, context + 1 + masks)[None],
                            causal_mask(context, 1 + masks)[None], cache=cache)
        runtime.draft_logits(feature[0])

    def forward() -> None:
        backend.rollback(context)
        backend.forward(ids[context:])

    draft, full = [], []
    for _ in range(repeats):
        for work, times in ((step, draft), (forward, full)):
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
    backend.reset()
    d, f = statistics.median(draft), statistics.median(full)
    drafts = depth if kind == "parallel" else getattr(module, "num_heads", 1) if kind == "medusa" else 1
    return dict(draft_step_ms=round(d * 1e3, 3), target_forward_ms=round(f * 1e3, 3), ratio=round(d / f, 3),
                draft_tokens=drafts)


def evaluate_heads(model, model_dir: Path, folders: Sequence[str], prompts: Sequence[list[int]],
                   max_new_tokens: int, depth: int, log: Callable[[str], None] = print) -> list[dict]:
    log(f"answering {len(prompts)} prompts with the target (greedy, {max_new_tokens} tokens)")
    rows = benchmark_rows(model, prompts, max_new_tokens)
    results = [head_acceptance(model, model_dir, folder, rows, depth) for folder in folders]
    for result in results:
        result.update(draft_step_seconds(model, model_dir, result["head"]))
    return results
