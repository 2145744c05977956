"""``paradecode profile`` (the verify cost curve per dtype) and ``paradecode quality`` (what a dtype costs in
perplexity and agreement with fp32), both on the machine at hand."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paradecode.backends import DTYPES as DTYPE_CHOICES
from paradecode.cli import load_model
from paradecode.errors import ParadecodeError



def add_commands(commands) -> None:
    from paradecode.cli import add_model_arguments
    from paradecode.models import DEFAULT_MODEL

    profile = commands.add_parser(
        "profile", help="time a forward pass over T = 1..32 new tokens per dtype (the verify cost curve)",
        description="Time one forward pass over T new tokens after a 256-token context, for each dtype, on this "
                    "machine: the cost curve that decides how many draft tokens are worth verifying.")
    add_model_arguments(profile, DEFAULT_MODEL)
    profile.add_argument("--dtypes", default="fp32,int8", help="comma-separated dtypes to profile (default: fp32,int8)")
    profile.add_argument("--sizes", default="1,2,4,8,16,32", help="token counts T (default: 1,2,4,8,16,32)")
    profile.add_argument("--context", type=int, default=256, help="cached tokens before each pass (default: 256)")
    profile.add_argument("--repeats", type=int, default=15, help="timed passes per T; the median is kept (default: 15)")
    profile.add_argument("--stages", action="store_true",
                         help="also time each stage of the forward (norm, quantize, GEMM, attention, ...) per T, "
                              "where the backend runs the native int8 pass")
    profile.add_argument("--out", help="folder for cost_curve.json and cost_curve.png")
    profile.set_defaults(run=run_profile)

    quality = commands.add_parser(
        "quality", help="perplexity and top-1 agreement with fp32 of each dtype, on human-written text",
        description="Teacher-forced perplexity on Spec-Bench's human-written summarization and RAG passages, and "
                    "the share of positions whose argmax equals fp32's, for each dtype. The figures are kept in "
                    "the model cache and shown by `paradecode models`.")
    add_model_arguments(quality, DEFAULT_MODEL)
    quality.add_argument("--dtypes", default="int8", help="comma-separated dtypes to compare with fp32 (default: int8)")
    quality.add_argument("--texts", type=int, default=12, help="passages to score (default: 12)")
    quality.add_argument("--max-tokens", type=int, default=512, help="tokens kept per passage (default: 512)")
    quality.add_argument("--json", action="store_true", help="print the figures as JSON")
    quality.set_defaults(run=run_quality)


def _dtypes(raw: str) -> list[str]:
    dtypes = [d.strip() for d in raw.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPE_CHOICES]
    if not dtypes or bad:
        raise ParadecodeError(f"--dtypes takes a comma-separated list of {', '.join(DTYPE_CHOICES)}, got {raw!r}.")
    return dtypes


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise ParadecodeError(f"{name} must be a positive integer, got {value}.")
    return value


def run_profile(args: argparse.Namespace) -> int:
    from paradecode.profile import measure_curve, measure_stages, plot

    dtypes = _dtypes(args.dtypes)
    try:
        sizes = sorted({_positive("--sizes", int(t)) for t in args.sizes.split(",")})
    except ValueError:
        raise ParadecodeError(f"--sizes takes comma-separated positive integers, got {args.sizes!r}.") from None
    _positive("--context", args.context)
    _positive("--repeats", args.repeats)
    curves: dict[str, dict[int, float]] = {}
    stages: dict[str, dict[int, dict[str, float]]] = {}
    for dtype in dtypes:
        model = load_model(args, dtype)
        label = f"{type(model.backend).__name__} {model.dtype}"
        print(f"profiling {label} ...", file=sys.stderr, flush=True)
        try:
            curves[label] = measure_curve(model.backend, sizes, args.context, args.repeats)
            if args.stages:
                stages[label] = measure_stages(model.backend, sizes, args.context, args.repeats)
        except ValueError as error:
            raise ParadecodeError(str(error)) from None
    print(f"{'backend / dtype':<22}" + "".join(f"{'T=' + str(t):>10}" for t in sizes))
    for label, curve in curves.items():
        one = curve[sizes[0]]
        cells = [f"{1000 * one:8.1f}ms"] + [f"{curve[t] / one:9.2f}x" for t in sizes[1:]]
        print(f"{label:<22}" + "".join(f"{c:>10}" for c in cells))
    for label, per_size in stages.items():
        print(f"\n{label}: ms per stage of one forward" if per_size else f"\n{label}: no stage clock (native int8 only)")
        if per_size:
            names = list(next(iter(per_size.values())))
            print(f"{'stage':<14}" + "".join(f"{'T=' + str(t):>9}" for t in per_size))
            for name in names:
                print(f"{name:<14}" + "".join(f"{1000 * per_size[t][name]:9.2f}" for t in per_size))
    if args.out:
        from paradecode.profile import machine_key

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cost_curve.json").write_text(json.dumps(
            {"machine": machine_key(), "model": args.model, "context": args.context, "repeats": args.repeats,
             "seconds": curves, "stage_seconds": stages}, indent=2))
        try:
            plot(curves, out / "cost_curve.png")
        except ImportError:
            print("paradecode: matplotlib is not installed; no plot (pip install 'paradecode[bench]')",
                  file=sys.stderr)
        print(f"wrote {out / 'cost_curve.json'}", file=sys.stderr)
    return 0


def run_quality(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from paradecode import quality
    from paradecode.benchmark.questions import default_questions_path, load_questions
    from paradecode.models import cache_root

    dtypes = [d for d in _dtypes(args.dtypes) if d != "fp32"]
    _positive("--texts", args.texts)
    _positive("--max-tokens", args.max_tokens)
    reference = load_model(args, "fp32")
    candidates = {d: load_model(args, d).backend for d in dtypes}
    texts = quality.evaluation_texts(load_questions(default_questions_path()), args.texts)
    sequences = [reference.tokenizer.encode(t)[: args.max_tokens] for t in texts]
    with tqdm(total=len(sequences), desc="scoring", unit="text", file=sys.stderr) as bar:
        results = quality.measure(reference.backend, candidates, sequences, progress=bar.update)
    path = quality.save(cache_root(args.cache_dir), args.model, results)
    if args.json:
        print(json.dumps({q.dtype: q.to_dict() for q in results}, indent=2))
    else:
        print(f"{'dtype':<8}{'perplexity':>12}{'vs fp32':>10}{'top-1 = fp32':>14}")
        for q in results:
            print(f"{q.dtype:<8}{q.perplexity:>12.3f}{100 * q.perplexity_change:>+9.2f}%{100 * q.top1_agreement:>13.1f}%")
        print(f"{results[0].tokens} tokens of {len(sequences)} texts; saved to {path}", file=sys.stderr)
    return 0
