"""The commands over the core library: ``generate``, ``models``, ``methods``, ``trace`` (``trace.py``),
``profile`` (``profile.py``) and ``quality`` (``quality.py``), added to the CLI by ``add_commands``.

    paradecode generate "Write a haiku about the sea"
    paradecode trace --method pld "Write a Python function that ..." --out trace.html
    paradecode profile --dtypes fp32,int8

Every command checks its arguments before it loads a model. ``generate`` without ``--temperature`` samples a
chat prompt with the model's recommended settings (``models.recommended_sampling``) and a seed it prints;
``--raw`` prompts, ``--verify`` and ``trace`` decode greedily, and ``--temperature 0`` always does.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from paradecode.arguments import (EXIT_NOT_LOSSLESS, add_cache_argument, add_decoding_arguments, add_model_arguments,
                                  file_to_read, file_to_write, folder_to_write, load_model, method_options, positive,
                                  read_prompt, structured_output)
from paradecode.backends import DTYPES as DTYPE_CHOICES
from paradecode.config import GenerationConfig, SamplingConfig
from paradecode.errors import ParadecodeError

TEMPERATURE_HELP = ("0 decodes greedily, > 0 samples. Without it a chat prompt samples with the model's "
                    "recommended settings (its generation_config.json, else llama.cpp's temperature 0.8, "
                    "top-k 40, top-p 0.95) and a seed printed with the stats, so --seed repeats the run; "
                    "--raw prompts and --verify decode greedily")


def add_commands(commands) -> None:
    from paradecode.models import DEFAULT_MODEL

    gen = commands.add_parser("generate", help="generate text with a decoding method",
                              description="Generate text from a prompt (argument or stdin) with a decoding method.")
    gen.add_argument("prompt", nargs="?", help="the prompt; read from stdin when absent or '-'")
    add_model_arguments(gen, DEFAULT_MODEL)
    add_decoding_arguments(gen, temperature_help=TEMPERATURE_HELP)
    gen.add_argument("--raw", action="store_true", help="raw completion: do not apply the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats, sampling")
    gen.add_argument("--trace", action="store_true", help="with --json: include every step's draft and verdict")
    structured = gen.add_mutually_exclusive_group()
    structured.add_argument("--json-schema", metavar="FILE", type=file_to_read("--json-schema"),
                            help="structured output: the answer is JSON valid under this JSON schema (a .json file)")
    structured.add_argument("--regex", help="structured output: the answer matches this regular expression")
    structured.add_argument("--grammar", metavar="FILE", type=file_to_read("--grammar"),
                            help="structured output: the answer follows this grammar (a Lark file with a 'start:' "
                                 "rule, or GBNF with 'root ::=')")
    gen.add_argument("--logprobs", type=int, metavar="K",
                     help="with --json: each token's log-probability under the model (read from the verify pass) "
                          "and the K most likely alternatives (0: the chosen token only)")
    gen.add_argument("--verify", action="store_true",
                     help="also decode with 'ar' and report whether the output is identical (exit 3 if not); "
                          "greedy")
    gen.set_defaults(run=run_generate)

    models = commands.add_parser("models", help="list built-in and cached models")
    add_cache_argument(models)
    models.set_defaults(run=run_models)

    methods = commands.add_parser("methods", help="list decoding methods and their options")
    methods.set_defaults(run=run_methods)

    trace = commands.add_parser(
        "trace", help="write an HTML view of every decoding step",
        description="Generate with a method and write a self-contained HTML file showing, step by step, what was "
                    "drafted, accepted and rejected, and which step committed each token.")
    trace.add_argument("prompt", nargs="?", help="the prompt; read from stdin when absent or '-'")
    add_model_arguments(trace, DEFAULT_MODEL)
    add_decoding_arguments(trace)
    trace.add_argument("--raw", action="store_true", help="raw completion: do not apply the chat template")
    trace.add_argument("--out", default="trace.html", type=file_to_write("--out"),
                       help="HTML file to write (default: trace.html)")
    trace.set_defaults(run=run_trace)

    profile = commands.add_parser(
        "profile", help="time a forward pass over T = 1..32 new tokens per dtype (the verify cost curve)",
        description="Time one forward pass over T new tokens after a 256-token context, for each dtype, on this "
                    "machine: the cost curve that decides how many draft tokens are worth verifying.")
    add_model_arguments(profile, DEFAULT_MODEL)
    profile.add_argument("--dtypes", default="fp32,int8",
                         help="comma-separated dtypes to profile (default: fp32,int8; q4 for a GGUF model)")
    profile.add_argument("--sizes", default="1,2,4,8,16,32", help="token counts T (default: 1,2,4,8,16,32)")
    profile.add_argument("--context", type=int, default=256, help="cached tokens before each pass (default: 256)")
    profile.add_argument("--repeats", type=int, default=15, help="timed passes per T; the median is kept (default: 15)")
    profile.add_argument("--stages", action="store_true",
                         help="also time each stage of the forward (norm, quantize, GEMM, attention, ...) per T, "
                              "where the backend runs the native int8 pass")
    profile.add_argument("--out", type=folder_to_write("--out"),
                         help="folder for cost_curve.json and cost_curve.png")
    profile.set_defaults(run=run_profile)

    quality = commands.add_parser(
        "quality", help="perplexity and top-1 agreement with fp32 of each dtype, on human-written text",
        description="Teacher-forced perplexity on Spec-Bench's human-written summarization and RAG passages, and "
                    "the share of positions whose argmax equals fp32's, for each dtype. The figures are kept in "
                    "the model cache and shown by `paradecode models`.")
    add_model_arguments(quality, DEFAULT_MODEL)
    quality.add_argument("--dtypes", default="int8",
                         help="comma-separated dtypes to compare with fp32 (default: int8; q4 for a GGUF model)")
    quality.add_argument("--texts", type=int, default=12, help="passages to score (default: 12)")
    quality.add_argument("--max-tokens", type=int, default=512, help="tokens kept per passage (default: 512)")
    quality.add_argument("--json", action="store_true", help="print the figures as JSON")
    quality.set_defaults(run=run_quality)


# -- generate ---------------------------------------------------------------------------------------------
def run_generate(args: argparse.Namespace) -> int:
    options = method_options(args)
    if args.verify and args.temperature:
        raise ParadecodeError("--verify compares token ids with greedy 'ar' decoding: use it with temperature 0.")
    given = SamplingConfig(args.temperature or 0.0, args.top_k or 0, 1.0 if args.top_p is None else args.top_p,
                           args.seed)
    GenerationConfig(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop), sampling=given)  # fail fast
    if args.logprobs is not None and (not args.json or args.logprobs < 0):
        raise ParadecodeError("--logprobs K (K >= 0 alternatives per token) adds logprobs to the JSON output: use "
                              "it with --json.")
    structured = structured_output(args)
    prompt = read_prompt(args.prompt)
    load_start = time.perf_counter()
    model = load_model(args)
    load_time = time.perf_counter() - load_start
    sampling, source = generate_sampling(args, model)
    kwargs = dict(method=args.method, max_new_tokens=args.max_new_tokens, temperature=sampling.temperature,
                  top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.seed, stop=args.stop,
                  chat=False if args.raw else None, options=options, **structured)
    if args.json:
        result = model.generate(prompt, **kwargs, logprobs=args.logprobs is not None, top_logprobs=args.logprobs or 0)
        payload = result.to_dict(with_steps=args.trace)
        payload["stats"]["load_time_s"] = load_time
        payload["sampling"] = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                                   seed=sampling.seed, source=source)
    else:
        stream = model.stream(prompt, **kwargs)
        for delta in stream:
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        result = stream.result
        s = result.stats
        print(f"[{args.method}] {s.new_tokens} tokens in {s.wall_time_s:.2f} s ({s.tokens_per_second:.1f} tok/s), "
              f"{s.forward_passes} forward passes, {s.mean_accepted:.2f} tokens/forward, stop: {s.stop_reason}",
              file=sys.stderr)
        if not sampling.greedy:
            print(f"sampled at temperature {sampling.temperature:g}, top-k {sampling.top_k}, top-p "
                  f"{sampling.top_p:g}, seed {sampling.seed}" + (f" ({source})" if source else "")
                  + f": --seed {sampling.seed} repeats it, --temperature 0 decodes greedily", file=sys.stderr)
    code = 0
    if args.verify:
        from paradecode.lossless import compare_with_ar

        check = compare_with_ar(model, prompt, result, **kwargs)
        if args.json:
            payload["verify"] = check.to_dict()
        else:
            print(f"verify: output {'IDENTICAL to' if check.identical else 'DIFFERS from'} ar"
                  + ("" if check.identical else f" (first difference at token {check.first_difference})")
                  + f"; ar ran at {check.ar_tokens_per_second:.1f} tok/s", file=sys.stderr)
        code = 0 if check.identical else EXIT_NOT_LOSSLESS
    if args.json:
        print(json.dumps(payload))
    return code


def generate_sampling(args: argparse.Namespace, model) -> tuple[SamplingConfig, str | None]:
    """What ``generate`` samples with, and where the settings come from when the user gave no temperature
    (None when they are the user's own). A chat prompt without --temperature (and without --verify) samples
    with the model's recommended settings; anything else decodes greedily unless --temperature says otherwise.
    Sampling without --seed draws a seed, so the run can be repeated."""
    from paradecode.models import recommended_sampling

    source = None
    temperature, top_k, top_p = args.temperature or 0.0, args.top_k or 0, 1.0 if args.top_p is None else args.top_p
    if args.temperature is None and model.chat and not args.raw and not args.verify:
        recommended = recommended_sampling(model.model_dir)
        temperature, source = recommended.temperature, recommended.source
        top_k = recommended.top_k if args.top_k is None else args.top_k
        top_p = recommended.top_p if args.top_p is None else args.top_p
    seed = args.seed
    if temperature > 0 and seed is None:
        seed = random.SystemRandom().randrange(2**31)
    return SamplingConfig(temperature, top_k, top_p, seed), source


# -- models, methods --------------------------------------------------------------------------------------
def run_models(args: argparse.Namespace) -> int:
    from paradecode import quality
    from paradecode.models import cache_root, cached_models, default_dtype
    from paradecode.profile import kept_curves

    for row in cached_models(args.cache_dir):
        state = f"cached, {row['size_mb']:.0f} MB" if row["cached"] else "not cached yet (converted on first use)"
        kind = "built-in" if row["builtin"] else "converted"
        print(f"{row['name']:<28} {kind:<10} {state:<40} {row['description']}")
        if row["cached"]:
            print(f"{'':<28} {row['path']}")
        print(f"{'':<28} default dtype: {default_dtype(row['name'])}")
        for dtype, q in sorted(quality.known(cache_root(args.cache_dir), row["name"]).items()):
            if dtype != "fp32":
                print(f"{'':<28} {dtype}: perplexity {q['perplexity']:.3f} vs fp32 {q['reference_perplexity']:.3f} "
                      f"({100 * q['perplexity_change']:+.2f}%), top-1 agreement with fp32 "
                      f"{100 * q['top1_agreement']:.1f}% ({q['tokens']} tokens of {q['texts']} human-written texts)")
        curves = kept_curves(cache_root(args.cache_dir), row["path"]) if row["cached"] else {}
        for dtype, (curve, when) in sorted(curves.items()):
            one, wide = curve[min(curve)], max(t for t in curve if t <= 8)
            day = time.strftime("%Y-%m-%d", time.localtime(when))
            print(f"{'':<28} {dtype} speed here: one-token forward {1000 * one:.1f} ms ({1 / one:.0f}/s), "
                  f"{wide} tokens {curve[wide] / one:.2f}x one (measured on this machine {day} by a cost-aware "
                  "method's first run)")
        if row["cached"] and not curves:
            print(f"{'':<28} speed here: not measured yet (the first `--method auto` run measures it)")
    return 0


def run_methods(args: argparse.Namespace) -> int:
    import dataclasses

    from paradecode.registry import get_method, method_names

    for name in method_names():
        cls = get_method(name)
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        print(f"{name:<12} {doc}")
        if dataclasses.is_dataclass(cls.Options):
            opts = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Options))
            print(f"{'':<12} options: {opts}")
    return 0


# -- trace ------------------------------------------------------------------------------------------------
def run_trace(args: argparse.Namespace) -> int:
    from paradecode.trace import render_trace, trace_payload

    options = method_options(args)
    SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)  # fail fast on bad sampling values
    positive("--max-new-tokens", args.max_new_tokens)
    prompt = read_prompt(args.prompt)
    out = Path(args.out)
    model = load_model(args)
    result = model.generate(prompt, method=args.method, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                            stop=args.stop, chat=False if args.raw else None, options=options)
    payload = trace_payload(model, result, method=args.method, options=options, prompt=prompt)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_trace(payload), encoding="utf-8")
    s = result.stats
    print(f"paradecode: wrote {out}: {s.new_tokens} tokens in {len(s.steps)} steps, "
          f"{s.mean_accepted:.2f} tokens/forward", file=sys.stderr)
    return 0


# -- profile, quality -------------------------------------------------------------------------------------
def _dtypes(raw: str) -> list[str]:
    dtypes = [d.strip() for d in raw.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPE_CHOICES]
    if not dtypes or bad:
        raise ParadecodeError(f"--dtypes takes a comma-separated list of {', '.join(DTYPE_CHOICES)}, got {raw!r}.")
    return dtypes


def run_profile(args: argparse.Namespace) -> int:
    from paradecode.backends.base import ARGMAX
    from paradecode.backends.int8_llama import Int8LlamaBackend
    from paradecode.profile import isa_text, machine_report, measure_curve, measure_curves, measure_stages, plot
    from paradecode.quality import calibration_ids

    dtypes = _dtypes(args.dtypes)
    try:
        sizes = sorted({positive("--sizes", int(t)) for t in args.sizes.split(",")})
    except ValueError:
        raise ParadecodeError(f"--sizes takes comma-separated positive integers, got {args.sizes!r}.") from None
    positive("--context", args.context)
    positive("--repeats", args.repeats)
    curves: dict[str, dict[int, float]] = {}
    stages: dict[str, dict[int, dict[str, float]]] = {}
    kernels: dict[str, dict] = {}
    for dtype in dtypes:
        model = load_model(args, dtype)
        label = f"{type(model.backend).__name__} {model.dtype}"
        print(f"profiling {label} ...", file=sys.stderr, flush=True)
        try:
            if isinstance(model.backend, Int8LlamaBackend) and model.backend.available_kernels():
                # and greedy verification's pass, which computes the LM head's residual rows only where they may
                # change a row's argmax, taking turns, after a context of text (the shipped calibration text)
                text = [t for ids in calibration_ids(model.tokenizer) for t in ids]
                both = measure_curves(model.backend, (True, ARGMAX), sizes, args.context, args.repeats, text)
                curves[label], curves[f"{label} greedy"] = both[True], both[ARGMAX]
            else:
                curves[label] = measure_curve(model.backend, sizes, args.context, args.repeats)
            if args.stages:
                stages[label] = measure_stages(model.backend, sizes, args.context, args.repeats)
        except ValueError as error:
            raise ParadecodeError(str(error)) from None
        if isinstance(model.backend, Int8LlamaBackend):
            kernels[label] = dict(model.backend.kernel_report(), weight_bytes=model.backend.weight_bytes)
    machine = machine_report()
    print(f"CPU: {machine['cpu']} ({machine['machine']}, {machine['threads']} threads); "
          f"ISA: {isa_text(machine['isa'])}"
          + (f"; memory read {machine['read_gb_per_s']:.1f} GB/s" if "read_gb_per_s" in machine else ""))
    for label, report in kernels.items():
        if report.get("choice"):
            chosen = []
            for bucket, kernel in report["choice"].items():
                timed = ", ".join(f"{k} {1000 * t:.2f} ms" for k, t in report["timings"].get(bucket, {}).items())
                chosen.append(f"{bucket}={kernel}" + (f" ({timed})" if timed else ""))
            print(f"{label}: int8 GEMM built for {report['isa']}; kernel per pass size: {'; '.join(chosen)}")
        if "read_gb_per_s" in machine and sizes[0] == 1:
            floor = report["weight_bytes"] / (machine["read_gb_per_s"] * 1e9)
            print(f"{label}: {report['weight_bytes'] / 1e6:.1f} MB of weights per token, {1000 * floor:.2f} ms at the "
                  f"measured bandwidth; the one-token forward takes {curves[label][1] / floor:.2f}x that")
    print(f"{'backend / dtype':<28}" + "".join(f"{'T=' + str(t):>10}" for t in sizes))
    for label, curve in curves.items():
        one = curve[sizes[0]]
        cells = [f"{1000 * one:8.1f}ms"] + [f"{curve[t] / one:9.2f}x" for t in sizes[1:]]
        print(f"{label:<28}" + "".join(f"{c:>10}" for c in cells))
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
            {"machine": machine_key(), "cpu": machine, "kernels": kernels, "model": args.model,
             "context": args.context, "repeats": args.repeats, "seconds": curves, "stage_seconds": stages},
            indent=2))
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
    positive("--texts", args.texts)
    positive("--max-tokens", args.max_tokens)
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
