"""The ``paradecode`` command line: generate, models, methods (and bench / trace / serve, registered by their modules).

Every user mistake ends in a one-paragraph message on stderr and exit code 2; ``--verify`` exits 3 when the
method's output differs from plain autoregressive decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from paradecode.errors import ParadecodeError

EXIT_USAGE = 2
EXIT_NOT_LOSSLESS = 3


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.run(args) or 0
    except ParadecodeError as error:
        print(f"paradecode: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("paradecode: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    from paradecode.models import DEFAULT_MODEL

    parser = argparse.ArgumentParser(
        prog="paradecode", description="Parallel decoding for language models: faster, with the same output."
    )
    commands = parser.add_subparsers(metavar="COMMAND")

    gen = commands.add_parser("generate", help="generate text with a decoding method",
                              description="Generate text from a prompt (argument or stdin) with a decoding method.")
    gen.add_argument("prompt", nargs="?", help="the prompt; read from stdin when absent or '-'")
    add_model_arguments(gen, DEFAULT_MODEL)
    add_decoding_arguments(gen)
    gen.add_argument("--raw", action="store_true", help="raw completion: do not apply the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    gen.add_argument("--trace", action="store_true", help="with --json: include every step's draft and verdict")
    structured = gen.add_mutually_exclusive_group()
    structured.add_argument("--json-schema", metavar="FILE",
                            help="structured output: the answer is JSON valid under this JSON schema (a .json file)")
    structured.add_argument("--regex", help="structured output: the answer matches this regular expression")
    structured.add_argument("--grammar", metavar="FILE",
                            help="structured output: the answer follows this grammar (a Lark file with a 'start:' "
                                 "rule, or GBNF with 'root ::=')")
    gen.add_argument("--logprobs", type=int, metavar="K",
                     help="with --json: each token's log-probability under the model (read from the verify pass) "
                          "and the K most likely alternatives (0: the chosen token only)")
    gen.add_argument("--verify", action="store_true",
                     help="also decode with 'ar' and report whether the output is identical (exit 3 if not)")
    gen.set_defaults(run=run_generate)

    models = commands.add_parser("models", help="list built-in and cached models")
    models.add_argument("--cache-dir", help="model cache folder (default: $PARADECODE_CACHE or ~/.cache/paradecode)")
    models.set_defaults(run=run_models)

    methods = commands.add_parser("methods", help="list decoding methods and their options")
    methods.set_defaults(run=run_methods)
    from paradecode.benchmark.commands import add_commands
    add_commands(commands)
    from paradecode.measure import add_commands as add_measure_commands
    add_measure_commands(commands)
    from paradecode.server.commands import add_commands as add_server_commands
    add_server_commands(commands)
    from paradecode.training.commands import add_commands as add_training_commands
    add_training_commands(commands)
    from paradecode.dllm.commands import add_commands as add_dllm_commands
    add_dllm_commands(commands)
    return parser


def add_model_arguments(parser: argparse.ArgumentParser, default_model: str) -> None:
    parser.add_argument("--model", "-m", default=default_model,
                        help=f"built-in name, .gguf file or HF model directory (default: {default_model})")
    parser.add_argument("--backend", default="auto", choices=("auto", "llama", "hf"),
                        help="auto: our reference Llama transformer for Llama models, transformers otherwise")
    from paradecode.api import DTYPES

    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="weights: int8 (llama backend: int8 weights and activations, 2-3x faster on a CPU), "
                             "fp32 (agrees with transformers), auto (default): int8 where its measured perplexity "
                             "is within 1%% of fp32 (see `paradecode models`), else fp32")
    parser.add_argument("--cache-dir", help="model cache folder (default: $PARADECODE_CACHE or ~/.cache/paradecode)")


def load_model(args: argparse.Namespace, dtype: str | None = None):
    """``paradecode.load`` with the model arguments of ``add_model_arguments`` (``dtype`` overrides ``--dtype``)."""
    import paradecode

    return paradecode.load(args.model, backend=args.backend, dtype=dtype or args.dtype, cache_dir=args.cache_dir)


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", default="ar", help="decoding method (see `paradecode methods`; default: ar)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="most tokens to generate (default: 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), > 0 samples")
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--draft-model", help="draft model for --method draft (name, .gguf or directory)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                        help="method option, e.g. --opt num_draft=4 (repeatable)")


def method_options(args: argparse.Namespace) -> dict:
    """Validate --method / --opt before any model is loaded, so mistakes fail fast."""
    from paradecode.drafters.base import build_options
    from paradecode.registry import get_method, parse_options

    options = parse_options(args.opt)
    if args.draft_model:
        options["draft_model"] = args.draft_model
    build_options(get_method(args.method), options)
    return options


def structured_output(args: argparse.Namespace) -> dict:
    """``--json-schema FILE`` / ``--regex RE`` / ``--grammar FILE`` as ``Model.generate`` arguments, checked before
    any model is loaded."""
    from paradecode.constraints import grammar_source

    def read(path: str, what: str) -> str:
        try:
            with open(path, encoding="utf-8") as file:
                return file.read()
        except OSError as error:
            raise ParadecodeError(f"cannot read the {what} file {path!r}: {error.strerror}.") from None

    given = {}
    if args.json_schema:
        given["json_schema"] = read(args.json_schema, "JSON schema")
    if args.regex is not None:
        given["regex"] = args.regex
    if args.grammar:
        given["grammar"] = read(args.grammar, "grammar")
    grammar_source(**given)
    return given


def read_prompt(prompt: str | None) -> str:
    if prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise ParadecodeError("no prompt: pass it as an argument or pipe it on stdin.")
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise ParadecodeError("the prompt is empty: give some text to continue or a question to answer.")
    return prompt


def run_generate(args: argparse.Namespace) -> int:
    import paradecode
    from paradecode.config import GenerationConfig, SamplingConfig

    options = method_options(args)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop),
                              sampling=SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed))
    if args.verify and not config.sampling.greedy:
        raise ParadecodeError("--verify compares token ids with greedy 'ar' decoding: use it with temperature 0.")
    if args.logprobs is not None and (not args.json or args.logprobs < 0):
        raise ParadecodeError("--logprobs K (K >= 0 alternatives per token) adds logprobs to the JSON output: use "
                              "it with --json.")
    structured = structured_output(args)
    prompt = read_prompt(args.prompt)
    load_start = time.perf_counter()
    model = load_model(args)
    load_time = time.perf_counter() - load_start
    kwargs = dict(method=args.method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=args.stop, chat=False if args.raw else None,
                  options=options, **structured)
    if args.json:
        result = model.generate(prompt, **kwargs, logprobs=args.logprobs is not None, top_logprobs=args.logprobs or 0)
        payload = result.to_dict(with_steps=args.trace)
        payload["stats"]["load_time_s"] = load_time
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
    code = 0
    if args.verify:
        reference = model.generate(prompt, **{**kwargs, "method": "ar", "options": {}})
        identical = reference.token_ids == result.token_ids
        first_diff = next((i for i, (a, b) in enumerate(zip(reference.token_ids, result.token_ids)) if a != b),
                          None if identical else min(len(reference.token_ids), len(result.token_ids)))
        verdict = dict(identical=identical, first_difference=first_diff,
                       ar_tokens_per_second=reference.stats.tokens_per_second)
        if args.json:
            payload["verify"] = verdict
        else:
            print(f"verify: output {'IDENTICAL to' if identical else 'DIFFERS from'} ar"
                  + ("" if identical else f" (first difference at token {first_diff})")
                  + f"; ar ran at {reference.stats.tokens_per_second:.1f} tok/s", file=sys.stderr)
        code = 0 if identical else EXIT_NOT_LOSSLESS
    if args.json:
        print(json.dumps(payload))
    return code


def run_models(args: argparse.Namespace) -> int:
    from paradecode import quality
    from paradecode.models import cache_root, cached_models, default_dtype

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


if __name__ == "__main__":
    sys.exit(main())
