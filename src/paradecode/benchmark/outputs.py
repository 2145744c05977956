"""The files a benchmark run leaves in ``--out``: results.json, report.md, plots and Spec-Bench answer files.

``assemble`` gathers every raw record with the run's context (model, options, machine, library versions,
command line) and the figures ``metrics`` computes; ``write_outputs`` writes them all. Both run after every
record is known, after an interruption too, so a partial run still leaves a valid results.json and report.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from paradecode.benchmark.answers import write_answers
from paradecode.benchmark.metrics import lossless_check, summarize
from paradecode.benchmark.report import render_report, write_plots

REFERENCE = "ar"  # the lossless check compares every method's token ids with this one's


def machine_info() -> dict:
    """Where the run ran: the CPU's name and the instruction-set flags that decide the kernels (every speed table
    names them), core count, platform and torch's threads."""
    import torch

    from paradecode.profile import cpu_name, isa_flags

    return dict(cpu=cpu_name(), isa=isa_flags(), cpu_count=os.cpu_count(),
                platform=platform.platform(), machine=platform.machine(), processor=platform.processor(),
                python=platform.python_version(), torch_threads=torch.get_num_threads())


def library_versions() -> dict:
    versions = {}
    for key, package in (("paradecode", "paradecode"), ("torch", "torch"), ("transformers", "transformers"),
                         ("llama_cpp", "llama-cpp-python")):
        try:
            versions[key] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def assemble(records: list[dict], *, methods: list[str], skipped: dict, settings: dict, questions: dict,
             total: int, complete: bool, model_info: dict) -> dict:
    return dict(
        paradecode_bench=1,
        complete=complete,
        progress=dict(done=len(records), total=total),
        command=sys.argv,
        settings=settings,
        model=model_info,
        questions=questions,
        methods=methods,
        skipped=skipped,
        reference=REFERENCE,
        machine=machine_info(),
        versions=library_versions(),
        summary=summarize(records),
        lossless=lossless_check(records, REFERENCE),
        records=records,
    )


def write_outputs(results: dict, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results["plots"] = write_plots(results, out_dir)
    results["answer_files"] = [str(p.relative_to(out_dir))
                               for p in write_answers(results["records"], out_dir, results["settings"]["model"])]
    _write_atomic(out_dir / "results.json", json.dumps(results, indent=1))
    _write_atomic(out_dir / "report.md", render_report(results))


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file, so a second Ctrl-C never leaves half a file."""
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(text, encoding="utf-8")
    staging.replace(path)
