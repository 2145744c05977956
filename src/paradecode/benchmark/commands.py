"""The ``paradecode bench`` command (added to the CLI by ``add_commands``).

    paradecode bench --methods ar,pld,hf,hf-pld --per-category 1 --max-new-tokens 128 --out results/

It validates its arguments before loading a model and raises ``ParadecodeError`` for user mistakes (the CLI
prints the message and exits 2). An interrupted bench still writes results.json and report.md for the runs
that finished; the CLI then exits 130.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paradecode.arguments import add_model_arguments, file_to_read, folder_to_write, load_model, model_name
from paradecode.errors import ParadecodeError


def add_commands(commands) -> None:
    from paradecode.benchmark.runner import DEFAULT_METHODS
    from paradecode.models import DEFAULT_MODEL

    bench = commands.add_parser(
        "bench", help="benchmark methods and peers on Spec-Bench-format questions",
        description="Run every method on every selected question in one process (warm-up first, methods "
                    "interleaved per question) and write results.json, report.md, plots and Spec-Bench answer files.")
    add_model_arguments(bench, DEFAULT_MODEL)
    bench.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                       help="comma-separated paradecode methods (see `paradecode methods`) and peers (hf, hf-pld, "
                            "hf-draft, llamacpp, llamacpp-pld), or 'all'; LABEL=METHOD adds a variant with its own "
                            f"--opt LABEL.key=value, e.g. pld,pld4=pld (default: {','.join(DEFAULT_METHODS)})")
    bench.add_argument("--questions", type=file_to_read("--questions"),
                       help="Spec-Bench-format .jsonl (question_id, category, turns); default: the Spec-Bench "
                            "question set shipped with paradecode (480 questions, 13 categories)")
    bench.add_argument("--per-category", default="1", help="questions per category, or 'all' (default: 1)")
    bench.add_argument("--categories", help="comma-separated categories to keep (default: all)")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="most tokens per answer (default: 128)")
    bench.add_argument("--turns", choices=("first", "all"), default="first",
                       help="first turn only (default), or every turn with the model's own answers in context")
    bench.add_argument("--opt", action="append", default=[], metavar="METHOD.KEY=VALUE",
                       help="method option, e.g. --opt pld.num_draft=4 (repeatable)")
    bench.add_argument("--draft-model", type=model_name("--draft-model"),
                       help="draft model for 'draft' and 'hf-draft' (name, .gguf or directory)")
    bench.add_argument("--out", default="results", type=folder_to_write("--out"),
                       help="output folder (default: results)")
    bench.add_argument("--resume", action="store_true", help="continue the run logged in --out")
    bench.add_argument("--batch", type=int, default=1, metavar="N",
                       help="answer N questions at once per method (Model.generate_batch: their forward passes "
                            "shared, each answer the one it gets alone); each answer's time is its share, by "
                            "tokens, of its batch's wall time, so tokens/s is the batch's throughput. paradecode "
                            "methods only (default: 1, one question at a time)")
    bench.add_argument("--warmup-tokens", type=int, default=8, help="tokens of the untimed warm-up (default: 8)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(run=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from paradecode.benchmark import outputs, questions as qs, runner

    names = runner.all_methods(args.draft_model) if args.methods.strip() == "all" else args.methods.split(",")
    specs = runner.plan_methods(names, args.opt, args.draft_model)
    if args.max_new_tokens < 1:
        raise ParadecodeError(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}.")
    if args.warmup_tokens < 1:
        raise ParadecodeError(f"--warmup-tokens must be a positive integer, got {args.warmup_tokens}.")
    if args.batch < 1:
        raise ParadecodeError(f"--batch must be a positive integer, got {args.batch}.")
    peers = [s.name for s in specs if s.peer]
    if args.batch > 1 and peers:
        raise ParadecodeError(f"--batch {args.batch} runs paradecode methods only; {', '.join(peers)} answer one "
                              "question at a time: bench them in a run without --batch, or compare serving under "
                              "load with benchmarks/serve_compare.py (llama-server --parallel).")
    path = Path(args.questions) if args.questions else qs.default_questions_path()
    if path is None:
        raise ParadecodeError(f"no questions file: pass --questions FILE.jsonl (Spec-Bench format; the shipped "
                              f"default {qs.DEFAULT_QUESTIONS} is missing from this install).")
    per_category = qs.parse_per_category(args.per_category)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    selected = qs.select(qs.load_questions(path), per_category, categories)
    turns = 1 if args.turns == "first" else max(len(q.turns) for q in selected)
    settings = dict(model=args.model, backend=args.backend, dtype=args.dtype, max_new_tokens=args.max_new_tokens, turns=args.turns,
                    draft_model=args.draft_model, options={s.name: s.options for s in specs if s.options})
    if args.batch > 1:  # (absent at 1, so runs logged before --batch existed still resume)
        settings["batch"] = args.batch
    variants = {s.name: s.method for s in specs if s.name != s.method}
    if variants:
        settings["variants"] = variants  # label -> method it runs
    out_dir = Path(args.out)
    runner.start_log(out_dir, settings, args.resume)
    kept = kept_state_settings(specs, selected[0], args.warmup_tokens)
    if kept:  # in results.json only: it follows from the settings compared on --resume
        settings["kept_state"] = kept

    wanted = {q.question_id for q in selected}
    context = dict(
        methods=[s.name for s in specs], skipped={}, settings=settings, total=len(selected) * len(specs),
        questions=dict(path=str(path.resolve()), per_category=per_category, categories=categories,
                       selected=len(selected)),
        model_info=dict(name=args.model),
    )

    def logged() -> list[dict]:  # this run's records (methods and questions), from the log
        return [r for r in runner.read_records(out_dir)
                if r["method"] in context["methods"] and r["question_id"] in wanted]

    try:
        model = load_model(args)
        context["model_info"] = dict(name=model.name, model_dir=str(model.model_dir),
                                     backend=type(model.backend).__name__, dtype=model.dtype, chat=model.chat,
                                     max_length=getattr(model.backend, "max_length", None))
        contenders, skipped, copies = runner.contenders(specs, model, lambda dtype: load_model(args, dtype),
                                                        args.draft_model)
        if copies:
            context["settings"]["variant_dtypes"] = {s.name: s.dtype for s in specs if s.dtype}
        for name, reason in skipped.items():
            context["skipped"][name] = reason
            print(f"paradecode: skipping {name}: {reason}", file=sys.stderr)
        if not contenders:
            raise ParadecodeError("none of the requested methods can run here: " +
                                  "; ".join(f"{m}: {why}" for m, why in context["skipped"].items()) + ".")
        context.update(methods=[c.name for c in contenders], total=len(selected) * len(contenders))
        records = runner.run_all(contenders, selected, turns=turns, max_new_tokens=args.max_new_tokens,
                                 out_dir=out_dir, done=logged(), warmup_tokens=args.warmup_tokens,
                                 progress=not args.no_progress, batch=args.batch)
    except BaseException as error:  # Ctrl-C (or a failure) mid-run: leave a valid partial results.json + report
        records = logged()
        if isinstance(error, KeyboardInterrupt) or records:
            outputs.write_outputs(outputs.assemble(records, complete=False, **context), out_dir)
            print(f"paradecode: wrote partial results for {len(records)} of {context['total']} runs to "
                  f"{out_dir / 'results.json'} and {out_dir / 'report.md'}; continue with --resume", file=sys.stderr)
        raise
    results = outputs.assemble(records, complete=True, **context)
    outputs.write_outputs(results, out_dir)
    print(f"paradecode: wrote {out_dir / 'report.md'} and {out_dir / 'results.json'}", file=sys.stderr)
    print(_overall_lines(results))
    return 0


def kept_state_settings(specs: list, first, warmup_tokens: int) -> dict:
    """For each method that keeps state across requests of the loaded model (``auto``: its estimates), whether
    it does here, so its answers after the first may run warm, and the untimed warm-up it learns from first."""
    from paradecode.registry import resolve_method

    kept = {}
    for spec in specs:
        if spec.peer:
            continue
        choice = resolve_method(spec.method, spec.options)
        keeps = choice.drafter.kept_across_requests(choice.settings)
        if keeps is not None:
            kept[spec.name] = dict(kept_across_questions=keeps,
                                   warmup=dict(question_id=first.question_id, tokens=warmup_tokens))
    return kept


def _overall_lines(results: dict) -> str:
    """The report's overall table, for the terminal."""
    from paradecode.benchmark.report import render_report

    text = render_report(results)
    start = text.index("## Overall")
    end = text.find("\n## ", start + 1)
    return text[start: end if end > 0 else None].strip()

