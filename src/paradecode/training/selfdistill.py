"""Self-distillation data for draft heads: the target's own answers and its hidden states along them.

Two teachers answer the prompts (``DistillConfig.teacher``):

* ``int8`` (the default): paradecode's own int8 backend, the one the heads draft for by default (its greedy
  answers differ from fp32's after the first differing token, so data from fp32 teaches the head text it will
  not be asked to draft). ``batch_size`` prompts decode at once through the engine (``ar``) on the model's
  batcher (``Model.generate_batch``: their passes share forwards, each answer exactly what it is alone), then
  one forward over prompt + answer gives each row's hidden states (every row of the native forward equals the
  row decoding computed, to the bit). ``workers`` processes answer shards side by side (one batch each).
* ``fp32``: transformers ``generate`` on the checkpoint's weights in left-padded batches sorted by prompt
  length, keeping the last hidden state generation computed at every position (after the final norm, what
  the LM head reads: the same rows ``Backend.forward(return_hidden=True)`` returns), plus one cached step
  for the last token.

Each shard is saved as soon as it is done (``shard-NNNNN.pt``: token ids, prompt lengths, fp16 hidden
states), so an interrupted run resumes at the first missing shard. With ``hidden=False`` a shard holds the
token ids only (the expensive part, decoding, is kept; the features a head kind needs are computed from the
tokens when it trains, ``training.features``: 20,000 answers of final hidden states alone are ~6 GB).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from paradecode.errors import ParadecodeError

SHARD_SIZE = 64  # prompts per saved shard


@dataclass(frozen=True)
class DistillConfig:
    max_new_tokens: int = 128
    batch_size: int = 32
    temperature: float = 0.0  # 0: greedy answers (what greedy decoding will be asked to draft)
    max_prompt_tokens: int = 256
    seed: int = 0
    teacher: str = "int8"  # int8: paradecode's int8 backend (batched passes); fp32: transformers generate, batched
    hidden: bool = True  # False: token ids only (features are computed at training time)
    shard_size: int = 0  # prompts per saved shard (0: SHARD_SIZE)

    def key(self) -> dict:
        """The settings a shard's answers depend on (the manifest's hash): the fields added later count only when
        they differ from their defaults, so folders written before them stay valid."""
        fields = dataclasses.asdict(self)
        for name in ("hidden", "shard_size"):
            if fields[name] == DistillConfig.__dataclass_fields__[name].default:
                del fields[name]
        return fields


TEACHERS = ("int8", "fp32")


def generate_dataset(model_dir: Path, prompts: list[str], out: Path, config: DistillConfig,
                     log: Callable[[str], None] = print, workers: int = 1, cache_dir: str | None = None) -> list[Path]:
    """Answer ``prompts`` with the target and save shards to ``out``; returns every shard path. ``workers`` > 1
    answers shards in that many processes of one torch thread each (the int8 teacher)."""
    if config.teacher not in TEACHERS:
        raise ParadecodeError(f"unknown teacher {config.teacher!r}; choose one of: {', '.join(TEACHERS)}.")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"  # what each shard answers, so a reused folder cannot mix data sets
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    shards, missing = [], []
    size = config.shard_size or SHARD_SIZE
    for index, first in enumerate(range(0, len(prompts), size)):
        path = out / f"shard-{index:05d}.pt"
        shards.append(path)
        chunk = prompts[first : first + size]
        key = hashlib.sha256(json.dumps([config.key(), chunk]).encode()).hexdigest()
        if manifest.setdefault(path.name, key) != key:
            raise ParadecodeError(f"{out} holds answers to other prompts or settings ({path.name}); "
                                  "pass another --data folder.")
        if not path.exists():
            missing.append((path, chunk))
    manifest_path.write_text(json.dumps(manifest, indent=1))
    if not missing:
        return shards
    start, done = time.perf_counter(), len(prompts) - sum(len(chunk) for _, chunk in missing)

    def report(path: Path, count: int, answer_tokens: int) -> None:
        nonlocal done
        done += count
        log(f"data: {done}/{len(prompts)} prompts, {path.name} ({answer_tokens} answer tokens), "
            f"{time.perf_counter() - start:.0f} s")

    if workers <= 1 or config.teacher != "int8" or len(missing) == 1:
        teacher = Teacher(model_dir, config, cache_dir)
        for path, chunk in missing:
            report(path, len(chunk), _save_shard(teacher, path, chunk))
        return shards
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(min(workers, len(missing)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_start_worker, initargs=(model_dir, config, cache_dir)) as pool:
        futures = {pool.submit(_worker_shard, path, chunk): (path, chunk) for path, chunk in missing}
        try:
            for future in as_completed(futures):
                path, chunk = futures[future]
                report(path, len(chunk), future.result())
        except BrokenProcessPool:
            raise ParadecodeError(f"a data worker process died (out of memory or killed?); the shards it finished "
                                  f"are kept in {out}: run the same command again to resume, or with --workers 1."
                                  ) from None
    return shards


class Teacher:
    """The target that answers the prompts: loaded on first use, answers a list of prompts -> shard rows."""

    def __init__(self, model_dir: Path, config: DistillConfig, cache_dir: str | None = None) -> None:
        self.model_dir, self.config, self.cache_dir = model_dir, config, cache_dir
        self.model = self.tokenizer = None

    def answer(self, prompts: list[str]) -> list[dict]:
        config = self.config
        if self.model is None:
            self._load()
        chunk = [encode_prompt(self.tokenizer, p)[-config.max_prompt_tokens:] for p in prompts]
        if config.teacher == "fp32":
            return answer_and_record(self.model, self.tokenizer, chunk, config)
        return answer_on_backend(self.model, chunk, config)

    def _load(self) -> None:
        if self.config.teacher == "fp32":
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        else:
            from paradecode.api import load

            self.model = load(str(self.model_dir), backend="llama", dtype="int8", cache_dir=self.cache_dir)
            self.tokenizer = self.model.tokenizer


def _save_shard(teacher: Teacher, path: Path, prompts: list[str]) -> int:
    rows = teacher.answer(prompts)
    torch.save(rows, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)
    return sum(len(r["tokens"]) - r["prompt_len"] for r in rows)


_WORKER_TEACHER: Teacher | None = None


def _start_worker(model_dir: Path, config: DistillConfig, cache_dir: str | None) -> None:
    global _WORKER_TEACHER
    torch.set_num_threads(1)
    _WORKER_TEACHER = Teacher(model_dir, config, cache_dir)


def _worker_shard(path: Path, prompts: list[str]) -> int:
    return _save_shard(_WORKER_TEACHER, path, prompts)


@torch.inference_mode()
def answer_on_backend(model, prompts: list[list[int]], config: DistillConfig) -> list[dict]:
    """Answers of a loaded ``paradecode.Model`` (``ar``, ``config.batch_size`` prompts decoding at once) and the
    hidden states along them: a list of {tokens [T], prompt_len, hidden [T, D] fp16 (with config.hidden)}, as
    ``answer_and_record``. Prompt ``i`` of a sampled set uses seed ``config.seed + i``, batched or not."""
    sampled = config.temperature > 0
    requests = [dict(prompt=prompt, seed=config.seed + number if sampled else None)
                for number, prompt in enumerate(prompts)]
    results = model.generate_batch(requests, max_batch=config.batch_size, method="ar",
                                   max_new_tokens=config.max_new_tokens, temperature=config.temperature)
    rows = []
    for prompt, result in zip(prompts, results):
        tokens = prompt + result.token_ids
        row = dict(tokens=torch.tensor(tokens, dtype=torch.int32), prompt_len=len(prompt))
        rows.append(row)
    if config.hidden:  # [T, D] per row, as decoding computed them
        from paradecode.training.features import TargetFeatures

        for row, hidden in zip(rows, TargetFeatures(None, model=model)(rows)):
            row["hidden"] = hidden.to(torch.float16)
    return rows


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as the chat model sees it at generation time (``Model.encode``)."""
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer.encode(prompt)]


@torch.inference_mode()
def answer_and_record(model, tokenizer, prompts: list[list[int]], config: DistillConfig) -> list[dict]:
    """Answers and hidden states for tokenized prompts: a list of {tokens [T], prompt_len, hidden [T, D] fp16}."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    configured = model.config.eos_token_id  # what the engine stops at too (api._eos_ids)
    eos |= set([configured] if isinstance(configured, int) else configured or [])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    rows: list[dict | None] = [None] * len(prompts)
    for first in range(0, len(order), config.batch_size):
        batch = [prompts[i] for i in order[first : first + config.batch_size]]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)  # [B, P] left-padded
        attention = torch.zeros(len(batch), width, dtype=torch.long)
        for row, prompt in enumerate(batch):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention[row, width - len(prompt):] = 1
        sampled = config.temperature > 0
        if sampled:
            torch.manual_seed(config.seed + first)
        generated = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=config.max_new_tokens,
                                   do_sample=sampled, temperature=config.temperature if sampled else None,
                                   top_p=None, top_k=None, pad_token_id=pad, eos_token_id=sorted(eos),
                                   output_hidden_states=True, return_dict_in_generate=True)
        states = generation_hidden(model, generated, attention)  # [B, P + A, D]
        for row, prompt in enumerate(batch):
            answer = generated.sequences[row, width:].tolist()
            cut = next((i + 1 for i, t in enumerate(answer) if t in eos), len(answer))
            rows[order[first + row]] = dict(tokens=torch.tensor(prompt + answer[:cut], dtype=torch.int32),
                                            prompt_len=len(prompt))
            if config.hidden:
                rows[order[first + row]]["hidden"] = states[row, width - len(prompt) : width + cut].to(
                    torch.float16).clone()
    return rows


def generation_hidden(model, generated, attention: torch.Tensor) -> torch.Tensor:
    """The last hidden state (after the final norm) at every position of ``generate``'s sequences [B, P + A, D].

    ``generate`` computed them already: the prefill's for the prompt, then one per fed answer token. Only the
    last generated token was never fed; one more cached step gives its state, so no second pass over the
    whole sequence is needed (it cost as much as the generation itself)."""
    steps = [generated.hidden_states[0][-1]] + [step[-1] for step in generated.hidden_states[1:]]  # [B, *, D]
    sequences = generated.sequences  # [B, P + A]
    mask = torch.cat((attention, torch.ones(len(sequences), sequences.shape[1] - attention.shape[1],
                                            dtype=attention.dtype)), dim=1)  # [B, P + A]
    last = model.model(input_ids=sequences[:, -1:], attention_mask=mask, cache=generated.cache,
                       position_ids=mask.sum(1, keepdim=True) - 1).last_hidden_state  # [B, 1, D]
    return torch.cat(steps + [last], dim=1)


def saved_shards(folder: Path) -> list[Path]:
    """The shards already saved in a data folder (of a run still going or stopped), in order."""
    if not (folder / "manifest.json").is_file():
        raise ParadecodeError(f"{folder} holds no train-draft data (no manifest.json); answer prompts into it first.")
    return sorted(folder.glob("shard-*.pt"))


def load_shards(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        rows.extend(torch.load(path))
    return rows
