"""``report.md`` and the trade-off plots of a ``dllm bench`` run (nothing here measures anything).

Per model: the overall table (every setting: exact match, loss against the one-token-per-step reference,
tokens per forward over answer tokens, wall and CPU time, tokens/s), a per-task table of accuracy / tokens per forward,
the best setting within 1 point of the reference per task beside the oracle, and the cache agreement.
The plot puts exact match against tokens per forward, one curve per sampler, the oracle and the AR twin marked.
"""

from __future__ import annotations

from pathlib import Path

ALL = "all"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + \
           ["| " + " | ".join(r) + " |" for r in rows]


def _ratio(a: dict, b: dict, key: str) -> str:
    return f"{a[key] / b[key]:.2f}" if b.get(key) and key in a else "–"


def best_within(by_setting: dict, task: str, reference: str, points: float = 1.0) -> tuple[str, dict] | None:
    """The real sampler setting with the most tokens per forward whose accuracy on ``task`` is at most
    ``points`` below the reference's (the oracle and the AR twin are not candidates)."""
    ref = by_setting[reference][task]["accuracy"]
    fits = [(s, f[task]) for s, f in by_setting.items()
            if s != "oracle" and not s.startswith("ar-twin") and task in f and f[task]["accuracy"] >= ref - points]
    return max(fits, key=lambda sf: sf[1]["tokens_per_forward"]) if fits else None


def render_report(results: dict) -> str:
    lines = ["# paradecode dLLM benchmark", "",
             f"- held-out examples: {results['per_task']} per task (never seen in training), batch 1, seed 0",
             "- exact match: `Task.check` (shuffle: any permutation of the input; latin: any Latin square keeping "
             "the given cells); tokens/forward: answer tokens (end-of-text padding not counted) / forward passes",
             f"- reference: `{results['reference']}` = topk with steps = canvas length (one token per forward); "
             "oracle: commits a position as soon as the model's token equals the known answer (one answer: where "
             "many are right, as on shuffle, a sampler can beat it)",
             f"- command: `{' '.join(results.get('command', []))}`", ""]
    for model, by_setting in results["summary"].items():
        info = results["models"][model]
        ref = by_setting[results["reference"]]
        lines += [f"## Model `{model}` ({info['parameters']:,} parameters)", "",
                  f"Bench time {results['bench_time_s'][model]:.0f} s.", "", "### Overall", ""]
        rows = []
        for setting, by_task in by_setting.items():
            f = by_task[ALL]
            rows.append([f"`{setting}`", f"{f['accuracy']:.1f}", f"{f['accuracy'] - ref[ALL]['accuracy']:+.1f}",
                         f"{f['tokens_per_forward']:.2f}", f"{f['wall_ms']:.1f}", f"{f['tokens_per_s']:.0f}",
                         f"{f.get('cpu_ms', 0.0):.1f}", f"{f.get('tokens_per_cpu_s', 0.0):.0f}"])
        lines += _table(["setting", "exact match %", "Δ vs reference", "tokens/forward", "ms/example", "tokens/s",
                         "CPU ms/example", "tokens/CPU-s"], rows) + [""]
        tasks = [t for t in ref if t != ALL]
        if len(tasks) > 1:
            lines += ["### Per task (exact match % / tokens per forward)", ""]
            rows = [[f"`{s}`"] + [f"{b[t]['accuracy']:.0f} / {b[t]['tokens_per_forward']:.2f}" for t in tasks]
                    for s, b in by_setting.items()]
            lines += _table(["setting"] + tasks, rows) + [""]
        lines += ["### Best setting within 1 point of the reference, against the oracle", ""]
        rows = []
        for task in tasks + [ALL]:
            best = best_within(by_setting, task, results["reference"])
            oracle = by_setting.get("oracle", {}).get(task)
            rows.append([task, f"{ref[task]['accuracy']:.1f}",
                         f"`{best[0]}`" if best else "–", f"{best[1]['accuracy']:.1f}" if best else "–",
                         f"{best[1]['tokens_per_forward']:.2f}" if best else "–",
                         f"{oracle['tokens_per_forward']:.2f} ({oracle['accuracy']:.0f}%)" if oracle else "–"])
        lines += _table(["task", "reference %", "best setting", "its %", "its tokens/forward",
                         "oracle tokens/forward (its %)"], rows) + [""]
        agreement = results.get("cache_agreement", {}).get(model)
        if agreement:
            lines += ["### Approximate caches (refreshed once per block)", ""]
            rows = [[f"`{s}`", f"{a:.1f}", f"{by_setting[s][ALL]['accuracy']:.1f}",
                     f"{by_setting[s][ALL]['wall_ms']:.2f}"] for s, a in agreement.items()]
            base = next((s.rsplit(" cache=", 1)[0] + " cache=none" for s in agreement), None)
            if base in by_setting:
                rows.insert(0, [f"`{base}`", "100.0", f"{by_setting[base][ALL]['accuracy']:.1f}",
                                f"{by_setting[base][ALL]['wall_ms']:.2f}"])
            lines += _table(["setting", "same canvas as uncached %", "exact match %", "ms/example"], rows) + [""]
        if "ar-twin" in by_setting:
            twin = by_setting["ar-twin"][ALL]
            best = best_within(by_setting, ALL, results["reference"])
            if best:
                lines += [f"Wall clock: the AR twin (greedy, KV cache) runs {twin['tokens_per_s']:.0f} tokens/s "
                          f"({twin.get('tokens_per_cpu_s', 0.0):.0f} per CPU second) at {twin['accuracy']:.1f}% exact "
                          f"match; `{best[0]}` runs {best[1]['tokens_per_s']:.0f} tokens/s "
                          f"({best[1].get('tokens_per_cpu_s', 0.0):.0f} per CPU second) at {best[1]['accuracy']:.1f}% "
                          f"({best[1]['tokens_per_s'] / twin['tokens_per_s']:.2f}× the twin's tokens/s, "
                          f"{_ratio(best[1], twin, 'tokens_per_cpu_s')}× per CPU second).", ""]
        same = results.get("twin_agreement", {}).get(model, {})
        if len(same) > 1:
            lines += ["Lossless AR methods on the twin (drafts verified by the twin, greedy): answers identical to "
                      "the twin's greedy answers: " + "; ".join(f"`{s}` {a} of {n}" for s, (a, n) in same.items()
                                                             if s != "ar-twin") + ".", ""]
        for plot in results.get("plots", {}).get(model, []):
            lines += [f"![trade-off]({plot})", ""]
    return "\n".join(lines)


def write_plots(results: dict, out_dir: Path) -> dict:
    """One PNG per model: a panel per task (and all tasks), exact match against tokens per forward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = {}
    for model, by_setting in results["summary"].items():
        tasks = [t for t in by_setting[results["reference"]] if t != ALL] + [ALL]
        tasks = tasks if len(tasks) > 2 else [ALL]
        cols = min(4, len(tasks))
        rows = (len(tasks) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
        for ax, task in zip(axes.flat, tasks):
            curves: dict = {}
            for setting, by_task in by_setting.items():
                if task in by_task and " cache=" not in setting:
                    curves.setdefault(setting.split()[0], []).append(by_task[task])
            for name, points in curves.items():
                points.sort(key=lambda f: f["tokens_per_forward"])
                style = dict(oracle=dict(marker="*", ms=12, color="k", ls=""), **{
                    "ar-twin": dict(marker="s", color="grey", ls=""), "one-per-step": dict(marker="D", color="r", ls="")})
                ax.plot([p["tokens_per_forward"] for p in points], [p["accuracy"] for p in points],
                        label=name, **style.get(name, dict(marker="o", ms=3)))
            ax.set_title(f"{model}: {task}")
            ax.set_xlabel("tokens per forward")
            ax.set_ylabel("exact match %")
            ax.set_ylim(-3, 103)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(tasks):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        name = f"tradeoff-{model}.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        plots[model] = [name]
    return plots
