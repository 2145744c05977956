"""The ``paradecode dllm`` command group: generate, bench, train, samplers (added by ``add_commands``).

    paradecode dllm generate --model waiting-line --sampler threshold --opt threshold=0.9 "reverse : 7 3 9 1 4"
    paradecode dllm bench --samplers topk,random,threshold,factor,entropy,margin --out results-dllm/
    paradecode dllm train --suite waiting-line --out my-model/

Every argument is checked before a model loads; mistakes raise ``ParadecodeError`` (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paradecode import utf8
from paradecode.arguments import file_to_write, folder_to_write
from paradecode.errors import ParadecodeError

DEFAULT_MODEL = "waiting-line"
BENCH_SAMPLERS = "topk,random,threshold,factor,entropy,margin,pool"


def add_commands(commands) -> None:
    dllm = commands.add_parser("dllm", help="masked diffusion language models: generate, bench, train",
                               description="Decode with masked diffusion LMs: fill a canvas of masks, several "
                                           "positions per forward pass.")
    sub = dllm.add_subparsers(metavar="COMMAND")
    dllm.set_defaults(run=lambda args: dllm.print_help() or 2)

    gen = sub.add_parser("generate", help="answer a prompt with a sampler")
    gen.add_argument("prompt", help="e.g. 'reverse : 7 3 9 1 4'")
    gen.add_argument("--model", "-m", default=DEFAULT_MODEL,
                     help=f"shipped model, checkpoint folder or HF diffusion folder (default: {DEFAULT_MODEL})")
    gen.add_argument("--sampler", default="topk", help="topk, random, threshold, factor, entropy, margin, pool")
    gen.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="sampler option (repeatable)")
    gen.add_argument("--steps", type=int, help="fixed-step samplers: forward passes (default: one per token)")
    gen.add_argument("--gen-length", type=int, help="canvas length (default: the model's)")
    gen.add_argument("--block-length", type=int, help="semi-autoregressive block length (default: the canvas)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: argmax; > 0: Gumbel-max sampling")
    gen.add_argument("--seed", type=int, default=None, help="random seed")
    gen.add_argument("--cache", default="none", help="none, prefix or dual (Fast-dLLM's approximate caches)")
    gen.add_argument("--no-eot-stop", action="store_true", help="denoise the padding after end-of-text too")
    gen.add_argument("--json", action="store_true", help="print text, token ids, canvas and stats as JSON")
    gen.add_argument("--trace", metavar="FILE.html", type=file_to_write("--trace"),
                     help="write an HTML view of which positions each step committed")
    gen.set_defaults(run=run_generate)

    bench = sub.add_parser("bench", help="accuracy against tokens per forward for every sampler setting")
    bench.add_argument("--models", default="waiting-line,latin", help="comma-separated dLLMs (default: both shipped)")
    bench.add_argument("--samplers", default=BENCH_SAMPLERS, help=f"comma-separated (default: {BENCH_SAMPLERS})")
    bench.add_argument("--sweep", action="append", default=[], metavar="SAMPLER=V1,V2",
                       help="values of a sampler's knob (steps, threshold, factor), e.g. threshold=0.9,0.5")
    bench.add_argument("--caches", default="none,prefix,dual", help="cache modes to compare ('' for none)")
    bench.add_argument("--per-task", type=int, default=50, help="held-out examples per task (default: 50)")
    bench.add_argument("--no-twin", action="store_true", help="skip the AR twin row")
    bench.add_argument("--out", default="results-dllm", type=folder_to_write("--out"),
                       help="output folder (default: results-dllm)")
    bench.add_argument("--no-progress", action="store_true")
    bench.set_defaults(run=run_bench)

    train = sub.add_parser("train", help="train a model on a synthetic suite (re-creates the shipped ones)")
    train.add_argument("--suite", default="waiting-line", help="waiting-line or latin")
    train.add_argument("--objective", default="diffusion", help="diffusion (the dLLM) or ar (its twin)")
    train.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the shipped model's)")
    train.add_argument("--cooldown", type=int, default=None,
                       help="last steps with a linearly decaying learning rate (default: the shipped model's)")
    train.add_argument("--batch-size", type=int, default=128)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    train.add_argument("--out", required=True, type=folder_to_write("--out"),
                       help="folder for the checkpoint (resumes a run found there)")
    train.set_defaults(run=run_train)

    samplers = sub.add_parser("samplers", help="list samplers and their options")
    samplers.set_defaults(run=run_samplers)


def _decode_config(args):
    from paradecode.dllm.decode import DecodeConfig

    return DecodeConfig(gen_length=args.gen_length, block_length=args.block_length, steps=args.steps,
                        temperature=args.temperature, seed=args.seed, eot_stop=not args.no_eot_stop, cache=args.cache)


def run_generate(args: argparse.Namespace) -> int:
    from paradecode.dllm.decode import diffuse
    from paradecode.dllm.protocol import load_diffusion_model
    from paradecode.dllm.samplers import build_sampler
    from paradecode.registry import parse_options

    sampler = build_sampler(args.sampler, parse_options(args.opt))
    config = _decode_config(args)
    prompt = utf8.check(args.prompt, "the prompt argument", escaped_bytes=True)
    model = load_diffusion_model(args.model)
    _one_thread_for_tiny(model)
    result = diffuse(model, model.encode(prompt), sampler, config)
    if args.trace:
        from paradecode.dllm.trace import render_dllm_trace

        Path(args.trace).parent.mkdir(parents=True, exist_ok=True)
        Path(args.trace).write_text(render_dllm_trace(model, prompt, result, args.model), encoding="utf-8")
    if args.json:
        print(json.dumps(result.to_dict(with_steps=True)))
        return 0
    print(result.text)
    s = result.stats
    print(f"[{args.sampler}] {s.new_tokens} answer tokens in {s.forward_passes} forward passes "
          f"({s.mean_accepted:.2f} tokens/forward), {s.wall_time_s * 1000:.1f} ms, stop: {s.stop_reason}",
          file=sys.stderr)
    return 0


def _one_thread_for_tiny(model) -> None:
    """Our tiny models run fastest on one thread (a forward is ~1 ms of work; threads only add contention)."""
    import torch

    from paradecode.dllm.model import TinyLM

    if isinstance(model, TinyLM):
        torch.set_num_threads(1)


def _sweeps(pairs: list[str]) -> dict[str, list]:
    from paradecode.registry import parse_value

    sweeps = {}
    for pair in pairs:
        name, sep, values = pair.partition("=")
        parsed = [parse_value(v.strip()) for v in values.split(",") if v.strip()]
        if not sep or not parsed:
            raise ParadecodeError(f"--sweep takes SAMPLER=V1,V2,..., got {pair!r}.")
        sweeps[name.strip()] = parsed
    return sweeps


def run_bench(args: argparse.Namespace) -> int:
    from paradecode.dllm import bench, report
    from paradecode.dllm.cache import CACHE_MODES
    from paradecode.dllm.protocol import load_tiny, resolve_folder

    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    caches = [c.strip() for c in args.caches.split(",") if c.strip()]
    bad = [c for c in caches if c not in CACHE_MODES]
    if bad:
        raise ParadecodeError(f"unknown cache mode {bad[0]!r}; choose from: {', '.join(CACHE_MODES)}.")
    if args.per_task < 1:
        raise ParadecodeError(f"--per-task must be a positive integer, got {args.per_task}.")
    sweeps = _sweeps(args.sweep)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    models = [load_tiny(name) for name in names]
    _one_thread_for_tiny(models[0])
    for model in models:
        bench.plan_settings(samplers, model.gen_length, sweeps, caches)  # fail fast before any run
    twins = {}
    if not args.no_twin:
        for name, model in zip(names, models):  # the twin of NAME is NAME-ar (shipped, or a sibling folder)
            try:
                resolve_folder(f"{name.rstrip('/')}-ar")
            except ParadecodeError:
                continue
            twins[model.config.suite] = load_tiny(f"{name.rstrip('/')}-ar", causal=True)
    results = bench.run_bench(models, twins, samplers, sweeps, caches, args.per_task, not args.no_progress)
    results["command"] = ["paradecode"] + sys.argv[1:]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results["plots"] = report.write_plots(results, out)
    (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    text = report.render_report(results)
    (out / "report.md").write_text(text, encoding="utf-8")
    print(f"paradecode: wrote {out / 'report.md'}, {out / 'results.json'} and the plots", file=sys.stderr)
    return 0


def run_train(args: argparse.Namespace) -> int:
    from paradecode.dllm.train import SHIPPED, TrainConfig, train

    steps, cooldown = SHIPPED.get((args.suite, args.objective), (3000, 0))
    cfg = TrainConfig(suite=args.suite, objective=args.objective, steps=args.steps or steps,
                      cooldown=cooldown if args.cooldown is None else args.cooldown, batch_size=args.batch_size,
                      seed=args.seed, threads=args.threads)
    model = train(cfg, Path(args.out))
    print(f"paradecode: wrote {args.out} ({model.num_parameters():,} parameters, "
          f"{model.config.info['train_time_s']:.0f} s)", file=sys.stderr)
    return 0


def run_samplers(args: argparse.Namespace) -> int:
    import dataclasses

    from paradecode.dllm.samplers import build_sampler, sampler_names

    for name in sampler_names():
        sampler = build_sampler(name)
        doc = (sys.modules[type(sampler).__module__].__doc__ or "").strip().splitlines()[0]
        opts = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(sampler.Options))
        print(f"{name:<10} {doc}")
        print(f"{'':<10} {'uses --steps' if sampler.fixed_steps else 'adaptive'}" + (f"; options: {opts}" if opts else ""))
    return 0
