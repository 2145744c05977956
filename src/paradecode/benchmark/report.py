"""``report.md`` and the plots, from the summary that ``metrics`` computes (nothing here measures anything).

Tables: overall (one row per method) and per category (speedup, tokens/s, mean accepted); the lossless check
with every differing question; plots with matplotlib's Agg backend: speedup by category and method, and the
distribution of tokens committed per target forward pass.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from paradecode.benchmark.metrics import OVERALL


def _num(value, fmt: str = "{:.2f}", missing: str = "–") -> str:
    return missing if value is None else fmt.format(value)


def _rates(rates, shown: int = 4) -> str:
    if rates is None:
        return "n/a"
    if not rates:
        return "–"
    return " / ".join(f"{r:.2f}" for r in rates[:shown]) + (" …" if len(rates) > shown else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def cpu_line(machine: dict) -> str:
    """The CPU's name and kernel-deciding ISA flags for the report's machine line ("" for results written before
    they were recorded)."""
    from paradecode.profile import isa_text

    return f"{machine['cpu']} (ISA: {isa_text(machine.get('isa') or [])}), " if "cpu" in machine else ""


def render_report(results: dict) -> str:
    """Markdown for a ``results.json`` payload (complete or partial)."""
    summary, lossless, methods = results["summary"], results["lossless"], results["methods"]
    settings, machine, versions = results["settings"], results["machine"], results["versions"]
    done, total = results["progress"]["done"], results["progress"]["total"]
    lines = ["# paradecode benchmark", ""]
    if not results["complete"]:
        lines += [f"**Partial run**: {done} of {total} (method, question) runs finished; "
                  "continue it with `--resume`.", ""]
    lines += [
        f"- model: `{settings['model']}` (backend {results['model']['backend']}, "
        f"dtype {results['model'].get('dtype', 'fp32')}), greedy, "
        f"max {settings['max_new_tokens']} new tokens, turns: {settings['turns']}",
        f"- questions: {results['questions']['selected']} from `{results['questions']['path']}` "
        f"(per category: {results['questions']['per_category'] or 'all'})",
        f"- machine: {cpu_line(machine)}{machine['cpu_count']} CPUs, {machine['platform']}; torch {versions['torch']}, "
        f"transformers {versions['transformers']}, paradecode {versions['paradecode']}",
        "- tok/s: mean over questions of tokens / wall time; speedup: ratio of those means on shared questions; "
        "wall ratio: baseline's total wall time / the method's; τ: tokens per target forward pass (bonus "
        "counted); accept@i: share of steps drafting ≥ i tokens that accepted ≥ i.",
        "",
    ]
    if settings.get("batch", 1) > 1:
        lines += [f"Batched: each method answered {settings['batch']} questions at once (`--batch`, one shared "
                  "forward pass per step); an answer's wall time is its share, by tokens, of its batch's, so tok/s "
                  "is the batch's throughput, not one request's speed.", ""]
    variants, options = settings.get("variants") or {}, settings.get("options") or {}
    dtypes = settings.get("variant_dtypes") or {}
    described = [f"`{m}`" + (f" = `{variants[m]}`" if m in variants else "")
                 + (f" on a {dtypes[m]} copy of the model" if m in dtypes else "")
                 + (" with " + ", ".join(f"{k}={v}" for k, v in options[m].items()) if options.get(m) else "")
                 for m in methods if m in variants or options.get(m) or m in dtypes]
    if described:
        lines += ["Options (every other method runs with its defaults): " + "; ".join(described) + ".", ""]
    for method, kept in (settings.get("kept_state") or {}).items():
        warmup = kept["warmup"]
        lines += [f"`{method}` " + (f"keeps what it learns across questions (from the untimed {warmup['tokens']}-token "
                  f"warm-up on question {warmup['question_id']} on), so its answers run warm"
                  if kept["kept_across_questions"] else "starts every answer cold") + ".", ""]
    if results.get("skipped"):
        lines += ["Skipped: " + "; ".join(f"`{m}` ({why})" for m, why in results["skipped"].items()), ""]

    lines += ["## Overall", ""]
    rows = []
    overall = summary.get(OVERALL, {})
    for method in (m for m in methods if m in overall):
        f = overall[method]
        check = lossless.get(method)
        rows.append([
            f"`{method}`", str(f["questions"]), str(f["new_tokens"]), _num(f["tokens_per_s"], "{:.1f}"),
            _num(f["speedup_vs_ar"], "{:.2f}×"), _num(f["speedup_vs_hf"], "{:.2f}×"),
            _num(f["wall_ratio_vs_ar"], "{:.2f}×"), _num(f["wall_ratio_vs_hf"], "{:.2f}×"),
            _num(f["mean_accepted"]), _num(f["forwards_per_token"], "{:.3f}"), _rates(f["acceptance_by_position"]),
            _num(f["wall_time_s"], "{:.1f}"),
            "reference" if method == results["reference"] else
            (f"{check['identical']}/{check['compared']}" if check else "–"),
        ])
    lines += _table(["method", "questions", "tokens", "tok/s", "speedup vs ar", "speedup vs hf", "wall ratio vs ar",
                     "wall ratio vs hf", "τ", "forwards/token", "accept@1/2/3/4", "wall s",
                     f"same as {results['reference']}"], rows)

    categories = [g for g in summary if g != OVERALL]
    if categories:
        lines += ["", "## Per category", ""]
        for title, key, fmt in (("Speedup over ar (tok/s ratio)", "speedup_vs_ar", "{:.2f}×"),
                                ("Speedup over hf (tok/s ratio)", "speedup_vs_hf", "{:.2f}×"),
                                ("Tokens per second", "tokens_per_s", "{:.1f}"),
                                ("Mean accepted tokens per forward (τ)", "mean_accepted", "{:.2f}")):
            lines += [f"### {title}", ""]
            shown = [m for m in methods if m in overall]
            rows = [[c] + [_num(summary[c].get(m, {}).get(key), fmt) for m in shown] for c in categories]
            lines += _table(["category"] + [f"`{m}`" for m in shown], rows) + [""]

    lines += ["## Lossless check", ""]
    if not lossless:
        lines += [f"No comparison: `{results['reference']}` was not run (or nothing else was).", ""]
    for method, check in lossless.items():
        lines.append(f"- `{method}`: {check['identical']}/{check['compared']} questions identical to "
                     f"`{results['reference']}` ({check['share']:.0%})")
        for diff in check["differences"]:
            lines.append(f"  - question {diff['question_id']} ({diff['category']}), turn {diff['turn'] + 1}: "
                         f"first difference at token {diff['position']}")
    errors = [r for r in results["records"] if r.get("error")]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- `{r['method']}` on question {r['question_id']}: {r['error']}" for r in errors]
    if results.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in results["plots"]]
    return "\n".join(lines) + "\n"


def write_plots(results: dict, out_dir: Path) -> list[str]:
    """PNG plots next to the report; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, methods = results["summary"], results["methods"]
    names: list[str] = []
    base = "ar" if any("ar" in summary[g] for g in summary) else "hf"
    key = f"speedup_vs_{base}"
    groups = [g for g in summary if g != OVERALL] + [OVERALL]
    shown = [m for m in methods if m != base and any(summary[g].get(m, {}).get(key) is not None for g in groups)]
    if shown:
        fig, ax = plt.subplots(figsize=(min(16, 3 + 0.25 * len(groups) * (len(shown) + 1)), 4.8))
        width = 0.8 / len(shown)
        for i, method in enumerate(shown):
            values = [summary[g].get(method, {}).get(key) or 0.0 for g in groups]
            ax.bar([x + i * width - 0.4 + width / 2 for x in range(len(groups))], values, width, label=method)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
        ax.set_ylabel(f"speedup over {base} (tok/s ratio)")
        ax.set_title(f"Speedup by category — {results['settings']['model']}")
        ax.legend(fontsize=8, ncols=min(len(shown), 4))
        fig.tight_layout()
        fig.savefig(out_dir / "speedup_by_category.png", dpi=110)
        plt.close(fig)
        names.append("speedup_by_category.png")

    overall = summary.get(OVERALL, {})
    # methods that drafted something (plain decoding would only show a bar at 1)
    per_step = {m: overall[m]["accepted_per_step"] for m in methods
                if m in overall and overall[m]["accepted_per_step"] and overall[m]["acceptance_by_position"]}
    if per_step:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        longest = max(max(v) for v in per_step.values())
        width = 0.8 / len(per_step)
        for i, (method, values) in enumerate(per_step.items()):
            counts = Counter(values)
            shares = [counts.get(n, 0) / len(values) for n in range(1, longest + 1)]
            ax.bar([n + i * width - 0.4 + width / 2 for n in range(1, longest + 1)], shares, width,
                   label=f"{method} (τ {_num(overall[method]['mean_accepted'])})")
        ax.set_xticks(range(1, longest + 1))
        ax.set_xlabel("tokens committed by one target forward pass")
        ax.set_yscale("log")  # most steps commit one token; the log scale keeps the long tail visible
        ax.set_ylabel("share of steps (log scale)")
        ax.set_title("Distribution of accepted tokens per step (bonus counted)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "accepted_per_step.png", dpi=110)
        plt.close(fig)
        names.append("accepted_per_step.png")
    return names
