"""The ``paradecode train-draft`` and ``paradecode export-draft`` commands (added to the CLI by ``add_commands``).

    paradecode train-draft --kind eagle --model smollm2-135m --prompts builtin --out heads/eagle-mine
    paradecode generate --method eagle --opt head=heads/eagle-mine "..."
    paradecode export-draft --head heads/eagle-mine --model smollm2-135m --out heads/eagle-mine-vllm

``train-draft`` answers the prompts with the target (batched, saved in shards under ``--data``, default
``OUT/data``), then trains the head; both stages resume after an interruption when run again with the same
arguments. Arguments are checked before any model is loaded.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from paradecode.arguments import (add_cache_argument, file_to_read, file_to_write, folder_to_read, folder_to_write,
                                  model_name)
from paradecode.errors import ParadecodeError


def add_commands(commands) -> None:
    from paradecode.heads.store import KINDS
    from paradecode.models import DEFAULT_MODEL

    train = commands.add_parser(
        "train-draft", help="train an EAGLE, EAGLE-3, parallel or Medusa draft head by self-distillation",
        description="Answer a prompt set with the target model, record its hidden states, and train a draft head "
                    "on them. Writes OUT/head.safetensors and OUT/config.json (use with --opt head=OUT).")
    train.add_argument("--kind", choices=KINDS, required=True,
                       help="eagle (EAGLE-1: the last hidden state, predicts the next one), eagle3 (the inputs of "
                            "three target layers, its own draft LM head), parallel (eagle3's head drafting every "
                            "position of a chain in one forward, from mask rows) or medusa")
    train.add_argument("--aux-layers", default="",
                       help="eagle3, parallel: comma-separated target layers whose inputs it reads "
                            "(default: 2, L/2, L-3)")
    train.add_argument("--model", "-m", default=DEFAULT_MODEL, type=model_name("--model"),
                       help=f"target model (default: {DEFAULT_MODEL})")
    add_cache_argument(train)
    train.add_argument("--prompts", default="builtin",
                       help="'builtin', 'builtin-tasks' (paradecode's own prompt sets) or a .jsonl file of "
                            "{\"prompt\": ...} lines; several, comma-separated, each answered into DATA/<name>")
    train.add_argument("--num-prompts", default="640",
                       help="prompts to answer from each source, or one count per source, comma-separated "
                            "(default: 640)")
    train.add_argument("--max-new-tokens", type=int, default=128, help="answer length (default: 128)")
    train.add_argument("--teacher", choices=("int8", "fp32"), default="int8",
                       help="what answers the prompts: int8 (paradecode's int8 backend, the one the heads draft "
                            "for by default; default) or fp32 (transformers on the checkpoint's weights, batched)")
    train.add_argument("--workers", type=int, default=None,
                       help="int8 teacher: processes answering shards side by side, one thread each "
                            "(default: the number of CPU cores)")
    train.add_argument("--gen-batch-size", type=int, default=32,
                       help="prompts decoding at once (int8: passes packed into shared forwards; fp32: one "
                            "generate() batch; default: 32)")
    train.add_argument("--shard-size", type=int, default=0,
                       help="prompts per saved data shard (default: 64)")
    train.add_argument("--tokens-only", action="store_true",
                       help="store the answers' token ids only, not their hidden states (~0.3 MB per answer "
                            "fewer); the features are computed from the tokens when a head trains")
    train.add_argument("--keep-features", action="store_true",
                       help="with --tokens-only data: keep the target's features computed for training in "
                            "DATA/features/<model> (half floats, ~1.2 KB per token for eagle/medusa, three times "
                            "that for eagle3/parallel), so later epochs and later runs on the same data (also runs side by "
                            "side) read them instead of running the target again (half of a training step)")
    train.add_argument("--data-only", action="store_true",
                       help="answer the prompts into --data and stop (train later with the same --prompts)")
    train.add_argument("--train-only", action="store_true",
                       help="answer nothing: train on the shards already saved in --data (e.g. while a "
                            "--data-only run is still answering, or after it was stopped)")
    train.add_argument("--data", type=folder_to_write("--data"),
                       help="folder for the generated data (default: OUT/data); shared by several runs")
    train.add_argument("--out", required=True, type=folder_to_write("--out"),
                       help="folder for the head and its checkpoint")
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--batch-size", type=int, default=8, help="sequences per training step (default: 8)")
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--draft-vocab", type=int, default=4096,
                       help="draft logits over this many most frequent answer tokens; 0: full vocabulary")
    train.add_argument("--depth", type=int, default=3,
                       help="eagle, eagle3, parallel: draft depths unrolled in training (default: 3)")
    train.add_argument("--medusa-heads", type=int, default=4)
    train.add_argument("--init", default="", type=folder_to_read("--init"),
                       help="start from this head folder (same kind and target) instead of a fresh head, e.g. "
                            "to go on training with more data")
    train.add_argument("--on-policy", action="store_true",
                       help="with --init: fine-tune the head on the drafts greedy speculative decoding with it "
                            "makes along the answers (the roots its chains reach, the depths verification checks, "
                            "where it fails), the other drafts weighted 0.1 (Draft-OPD's on-policy data)")
    train.add_argument("--labels", choices=("hard", "soft"), default="hard",
                       help="train against the token the target chose (hard, default: the higher greedy "
                            "acceptance in docs/heads.md) or its distribution over the draft vocabulary (soft)")
    train.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                       help="training arithmetic: bf16 autocast with fp32 weights, fp32, or auto (bf16 where a "
                            "timed matmul shows this CPU runs it faster; default)")
    train.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(run=run_train)

    prompts = commands.add_parser(
        "make-prompts", help="have the target model write a prompt set for train-draft",
        description="The target continues a numbered list of requests (three seed requests shown per call) by "
                    "sampling; the requests it writes that read like one, are new and share no 8-word run with "
                    "the benchmark's questions are written to OUT (.jsonl, one {\"prompt\": ...} per line; run "
                    "again to resume or extend). Use it with train-draft --prompts OUT.")
    prompts.add_argument("--model", "-m", default=DEFAULT_MODEL, type=model_name("--model"),
                         help=f"target model (default: {DEFAULT_MODEL})")
    add_cache_argument(prompts)
    prompts.add_argument("--count", type=int, default=1000, help="prompts to write (default: 1000)")
    prompts.add_argument("--out", required=True, type=file_to_write("--out"), help=".jsonl file to write")
    prompts.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    prompts.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default: 0.8)")
    prompts.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    prompts.set_defaults(run=run_make_prompts)

    accept = commands.add_parser(
        "eval-draft", help="teacher-forced acceptance of draft heads on the benchmark's answers",
        description="The target answers the benchmark's first turns (greedy); each head then drafts a greedy "
                    "chain from every root of those answers on the target's true features: the share of roots "
                    "right at depths 1..k, the tokens per step a chain of that length would give from any root, "
                    "and the tokens per step greedy decoding with chains of 1..depth makes along the answers "
                    "(only the roots it reaches).")
    accept.add_argument("--head", required=True, action="append", type=folder_to_read("--head"),
                        help="head folder written by train-draft (repeat for several)")
    accept.add_argument("--model", "-m", default=DEFAULT_MODEL, type=model_name("--model"),
                        help=f"their target model (default: {DEFAULT_MODEL})")
    add_cache_argument(accept)
    accept.add_argument("--questions", type=file_to_read("--questions"),
                        help="Spec-Bench-format .jsonl (default: the shipped Spec-Bench questions)")
    accept.add_argument("--per-category", default="5", help="questions per category, or 'all' (default: 5)")
    accept.add_argument("--max-new-tokens", type=int, default=128, help="answer length (default: 128)")
    accept.add_argument("--depth", type=int, default=6, help="deepest draft position scored (default: 6)")
    accept.add_argument("--json", type=file_to_write("--json"), help="also write the results to this file")
    accept.set_defaults(run=run_eval)

    export = commands.add_parser(
        "export-draft", help="export an EAGLE or EAGLE-3 head as a vLLM / SGLang checkpoint",
        description="Write an EAGLE head in the layout of EAGLE-1 checkpoints that vLLM's and SGLang's 'eagle' "
                    "speculative method loads, or an EAGLE-3 head in the layout their 'eagle3' method loads "
                    "(config.json + model.safetensors).")
    export.add_argument("--head", required=True, type=folder_to_read("--head"),
                        help="head folder written by train-draft")
    export.add_argument("--model", "-m", default=DEFAULT_MODEL, type=model_name("--model"),
                        help=f"its target model (default: {DEFAULT_MODEL})")
    add_cache_argument(export)
    export.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                        help="serving engine whose EAGLE loader the config names (default: vllm)")
    export.add_argument("--out", required=True, type=folder_to_write("--out"), help="folder to write")
    export.set_defaults(run=run_export)


def run_train(args: argparse.Namespace) -> int:
    import torch

    from paradecode.heads.store import AUX_KINDS

    from paradecode.models import resolve
    from paradecode.training.pipeline import train_draft_head
    from paradecode.training.prompts import read_prompts
    from paradecode.training.selfdistill import DistillConfig
    from paradecode.training.trainer import TrainConfig

    sources = [s.strip() for s in args.prompts.split(",") if s.strip()]
    counts = _counts(args.num_prompts, len(sources))
    if args.workers is None:
        args.workers = os.cpu_count() or 1
    for name in ("max_new_tokens", "gen_batch_size", "epochs", "batch_size", "depth",
                 "medusa_heads", "threads", "workers", "shard_size"):
        least = 0 if name == "shard_size" else 1  # (--shard-size 0: the default size)
        if getattr(args, name) < least:
            raise ParadecodeError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}.")
    if args.draft_vocab < 0 or args.lr <= 0:
        raise ParadecodeError("--draft-vocab must be >= 0 and --lr > 0.")
    try:
        aux_layers = tuple(int(i) for i in args.aux_layers.split(",") if i.strip())
    except ValueError:
        raise ParadecodeError(f"--aux-layers must be comma-separated layer numbers, got {args.aux_layers!r}.") from None
    if args.data_only and args.train_only:
        raise ParadecodeError("--data-only and --train-only exclude each other.")
    if aux_layers and args.kind not in AUX_KINDS:
        raise ParadecodeError("--aux-layers applies to --kind eagle3 and parallel only.")
    if args.kind in AUX_KINDS and args.labels == "soft":
        raise ParadecodeError(f"{args.kind} heads train on hard labels only: drop --labels soft.")
    if args.init and not (Path(args.init) / "config.json").is_file():
        raise ParadecodeError(f"--init {args.init} is not a head folder (it needs config.json and head.safetensors).")
    train = TrainConfig(kind=args.kind, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                        draft_vocab=args.draft_vocab, depth=args.depth, medusa_heads=args.medusa_heads,
                        soft_labels=args.labels == "soft", precision=args.precision, init=args.init,
                        aux_layers=aux_layers, on_policy=args.on_policy)
    prompt_sets = [(source, read_prompts(source, count)) for source, count in zip(sources, counts)]
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    model_dir, _ = resolve(args.model, args.cache_dir)
    info = dict(command="paradecode " + " ".join(shlex.quote(a) for a in sys.argv[1:]), prompts=args.prompts)
    saved = train_draft_head(args.model, model_dir, prompt_sets, out, Path(args.data) if args.data else out / "data",
                             DistillConfig(args.max_new_tokens, args.gen_batch_size, teacher=args.teacher,
                                           hidden=not args.tokens_only, shard_size=args.shard_size), train,
                             workers=args.workers, cache_dir=args.cache_dir, log=_log, progress=not args.no_progress,
                             info=info, data_only=args.data_only, train_only=args.train_only,
                             keep_features=args.keep_features)
    if args.data_only:
        _log(f"answers saved in {args.data or out / 'data'}; train on them with the same command without --data-only")
        return 0
    last = saved["training"]["history"][-1]
    _log(f"saved {out}/head.safetensors; held-out estimated tokens/step {last['tau_chain']:.2f}; "
         f"use it with: paradecode generate --method {args.kind} --opt head={out} ...")
    return 0


def run_make_prompts(args: argparse.Namespace) -> int:
    import torch

    from paradecode.api import load
    from paradecode.training.self_prompts import make_prompts

    if args.count < 1 or args.threads < 1 or not 0 < args.temperature <= 2:
        raise ParadecodeError("--count and --threads must be >= 1 and --temperature in (0, 2].")
    out = Path(args.out)
    if out.suffix != ".jsonl":
        raise ParadecodeError(f"--out must name a .jsonl file, got {args.out}.")
    torch.set_num_threads(args.threads)
    model = load(args.model, cache_dir=args.cache_dir)
    kept = make_prompts(model, args.count, out, seed=args.seed, temperature=args.temperature, log=_log)
    _log(f"wrote {len(kept)} prompts to {out}; use them with: paradecode train-draft --prompts {out} ...")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    import json

    from paradecode.api import load
    from paradecode.benchmark.questions import default_questions_path, load_questions, parse_per_category, select
    from paradecode.benchmark.runner import build_prompt
    from paradecode.training.acceptance import evaluate_heads

    if args.max_new_tokens < 1 or args.depth < 1:
        raise ParadecodeError("--max-new-tokens and --depth must be >= 1.")
    path = args.questions or default_questions_path()
    if path is None:
        raise ParadecodeError("no questions file: pass --questions FILE.jsonl (Spec-Bench format).")
    questions = select(load_questions(path), parse_per_category(args.per_category))
    for folder in args.head:
        if not (Path(folder) / "config.json").is_file():
            raise ParadecodeError(f"--head {folder} is not a head folder (it needs config.json and head.safetensors).")
    model = load(args.model, backend="llama", dtype="int8", cache_dir=args.cache_dir)
    prompts = [build_prompt(model, [q.turns[0]], []) for q in questions]
    results = evaluate_heads(model, Path(model.model_dir), args.head, prompts, args.max_new_tokens, args.depth,
                             log=_log)
    print(f"teacher-forced chain acceptance on {len(questions)} questions' answers ({Path(path).name})")
    print("head | kind | " + " | ".join(f"depth {k}" for k in range(1, args.depth + 1)) +
          " | tau (chain) | tau decoding, chains of 1..depth | draft step ms (tokens) | target forward ms | ratio")
    for r in results:
        print(f"{r['head']} | {r['kind']} | " + " | ".join(f"{a:.3f}" for a in r["acceptance"]) +
              f" | {r['tau_chain']:.2f} | {' '.join(f'{t:.2f}' for t in r['tau_decode'])}"
              f" | {r['draft_step_ms']:.2f} ({r['draft_tokens']}) | {r['target_forward_ms']:.2f} | {r['ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(questions=len(questions), results=results), indent=1) + "\n")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from paradecode.heads.store import load_head, target_weights
    from paradecode.models import resolve
    from paradecode.training.export import export_eagle

    model_dir, _ = resolve(args.model, args.cache_dir)
    target = target_weights(str(model_dir))
    head = load_head(args.head, None, target)
    export_eagle(head, target, Path(args.out), args.engine)
    layout = "EAGLE-3" if head.config["kind"] == "eagle3" else "EAGLE-1"
    _log(f"wrote {args.out}/config.json and model.safetensors ({args.engine} {layout} layout)")
    return 0


def _counts(raw: str, sources: int) -> list[int]:
    """``--num-prompts``: one count for every source, or one per source."""
    try:
        counts = [int(c) for c in raw.split(",")]
    except ValueError:
        raise ParadecodeError(f"--num-prompts must be a count or comma-separated counts, got {raw!r}.") from None
    if sources == 0 or len(counts) not in (1, sources):
        raise ParadecodeError(f"--num-prompts gives {len(counts)} counts for {sources} prompt sources.")
    if min(counts) < 1:
        raise ParadecodeError(f"--num-prompts must be >= 1, got {raw}.")
    return counts * sources if len(counts) == 1 else counts


def _log(message: str) -> None:
    print(f"paradecode: {message}", file=sys.stderr, flush=True)
