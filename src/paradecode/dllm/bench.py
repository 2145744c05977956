"""``dllm bench``: every sampler setting on a fixed held-out set, per task, against the one-token-per-step
reference, the oracle and the AR twin; the cache modes against the uncached run.

A *setting* is a sampler with one value of its swept knob (``steps`` for fixed-step samplers, ``threshold``,
``factor``). Each run is one example decoded at batch 1 (after one untimed warm-up); a record keeps whether the
answer was correct (``Task.check``), the answer tokens (end-of-text padding not counted), the forward passes,
the wall time, the process CPU time (one thread: the same as wall time on an idle machine, but unaffected by
other jobs on a shared one) and the decoded canvas. ``report`` turns the records into report.md and the plot.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field

from paradecode.dllm.decode import DecodeConfig, diffuse
from paradecode.dllm.samplers import build_sampler, sampler_names
from paradecode.dllm.tasks import get_task, heldout
from paradecode.errors import ParadecodeError

REFERENCE = "one-per-step"  # topk with steps = gen_length: one token per forward, the quality reference
STEP_FRACTIONS = (1, 2, 3, 4, 6)  # fixed-step sweeps: gen_length / k steps
SWEEPS = {"threshold": ("threshold", (0.99, 0.9, 0.8, 0.7, 0.5, 0.3)), "factor": ("factor", (0.5, 1.0, 2.0, 4.0)),
          "pool": ("threshold", (0.99, 0.9, 0.8, 0.7))}
TWIN_METHODS = (None, "pld", "ngram")  # the twin's greedy decoding, then paradecode's lossless methods on it
CACHE_SETTING = dict(sampler="threshold", options={"threshold": 0.9}, block_length=4)


@dataclass(frozen=True)
class Setting:
    label: str
    sampler: str
    options: dict = field(default_factory=dict)
    steps: int | None = None
    block_length: int | None = None
    cache: str = "none"

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(steps=self.steps, block_length=self.block_length, cache=self.cache, seed=0)


def plan_settings(samplers: list[str], gen_length: int, overrides: dict[str, list[float]],
                  caches: list[str]) -> list[Setting]:
    """The reference, each sampler's sweep (``overrides``: sampler -> values of its knob), the oracle, caches."""
    known = sampler_names()
    for name in samplers:
        if name not in known:
            raise ParadecodeError(f"unknown sampler {name!r}; choose from: {', '.join(known)}.")
    unknown = sorted(set(overrides) - set(samplers))
    if unknown:
        raise ParadecodeError(f"--sweep names samplers not in --samplers: {', '.join(unknown)}.")
    settings = [Setting(REFERENCE, "topk", steps=gen_length)]
    for name in samplers:
        sampler = build_sampler(name)
        if name == "oracle":
            continue
        if sampler.fixed_steps:
            values = overrides.get(name) or sorted({max(1, gen_length // k) for k in STEP_FRACTIONS}, reverse=True)
            for steps in values:
                if not isinstance(steps, int) or not 1 <= steps <= gen_length:
                    raise ParadecodeError(f"{name} steps must be integers in [1, {gen_length}], got {steps!r}.")
                if not (name == "topk" and steps == gen_length):
                    settings.append(Setting(f"{name} steps={steps}", name, steps=steps))
        else:
            knob, values = SWEEPS[name]
            for value in overrides.get(name) or values:
                build_sampler(name, {knob: value})  # fail fast on bad values
                settings.append(Setting(f"{name} {knob}={value}", name, {knob: value}))
    settings.append(Setting("oracle", "oracle"))
    for cache in caches:
        base = CACHE_SETTING
        label = f"{base['sampler']} {next(iter(base['options']))}={next(iter(base['options'].values()))} " \
                f"block={base['block_length']} cache={cache}"
        settings.append(Setting(label, base["sampler"], dict(base["options"]), block_length=base["block_length"],
                                cache=cache))
    return settings


def run_model(model, twin, settings: list[Setting], per_task: int, progress: bool = True) -> list[dict]:
    """Records for every (setting, held-out example) of one model, then the AR twin's (when given)."""
    from tqdm import tqdm

    examples = heldout(model.config.suite, per_task)
    name = model.config.suite
    gen_length = model.gen_length
    eot = model.eot_id
    records = []
    warm = examples[0]
    diffuse(model, model.encode(warm[1]), build_sampler("threshold"), DecodeConfig(seed=0))  # untimed warm-up
    total = (len(settings) + (len(TWIN_METHODS) if twin is not None else 0)) * len(examples)
    bar = tqdm(total=total, desc=f"dllm bench {name}", disable=not progress, file=sys.stderr, mininterval=2.0)
    for setting in settings:
        sampler = build_sampler(setting.sampler, setting.options)
        config = setting.decode_config()
        for index, (task, prompt, answer) in enumerate(examples):
            target = model.encode(answer)
            target = target + [eot] * (gen_length - len(target))
            cpu_start = time.process_time()
            result = diffuse(model, model.encode(prompt), sampler, config, target=target)
            cpu_s = time.process_time() - cpu_start
            records.append(dict(model=name, setting=setting.label, sampler=setting.sampler, task=task, example=index,
                                correct=get_task(task).check(prompt, result.text),
                                answer_tokens=result.stats.new_tokens, forwards=result.stats.forward_passes,
                                wall_s=result.stats.wall_time_s, cpu_s=cpu_s, canvas=result.canvas))
            bar.update(1)
    if twin is not None:
        records += _twin_records(twin, name, examples, gen_length, bar)
    bar.close()
    return records


def _twin_records(twin, name: str, examples: list, gen_length: int, bar) -> list[dict]:
    """The AR twin's records: greedy (``ar-twin``), then ``ar-twin METHOD`` through the engine, each answer
    compared with the greedy one (``same_as_greedy``: lossless methods must reproduce it exactly)."""
    from paradecode.dllm.ar import ar_generate
    from paradecode.dllm.ar_backend import TwinBackend, ar_engine_generate

    backend, records, greedy = TwinBackend(twin), [], {}
    for method in TWIN_METHODS:
        for index, (task, prompt, answer) in enumerate(examples):
            prompt_ids = twin.encode(prompt)
            cpu_start = time.process_time()
            if method is None:
                ids, stats = ar_generate(twin, prompt_ids, gen_length)
                greedy[index] = ids
            else:
                ids, stats = ar_engine_generate(twin, prompt_ids, gen_length, method, backend=backend)
            cpu_s = time.process_time() - cpu_start
            records.append(dict(model=name, setting="ar-twin" + (f" {method}" if method else ""), sampler="ar",
                                task=task, example=index, correct=get_task(task).check(prompt, twin.decode(ids)),
                                answer_tokens=stats.new_tokens, forwards=stats.forward_passes,
                                wall_s=stats.wall_time_s, cpu_s=cpu_s, canvas=ids,
                                same_as_greedy=ids == greedy[index]))
            bar.update(1)
    return records


def twin_agreement(records: list[dict]) -> dict:
    """model -> twin setting -> [answers identical to the twin's greedy answers, examples]."""
    out: dict = {}
    for r in records:
        if "same_as_greedy" in r:
            counts = out.setdefault(r["model"], {}).setdefault(r["setting"], [0, 0])
            counts[0] += bool(r["same_as_greedy"])
            counts[1] += 1
    return out


def summarize(records: list[dict]) -> dict:
    """model -> setting -> task (and "all") -> accuracy, tokens/forward, wall and CPU ms, tokens/s (both), n."""
    groups: dict = {}
    for r in records:
        for task in (r["task"], "all"):
            groups.setdefault(r["model"], {}).setdefault(r["setting"], {}).setdefault(task, []).append(r)
    summary: dict = {}
    for model, by_setting in groups.items():
        for setting, by_task in by_setting.items():
            for task, rows in by_task.items():
                tokens, forwards, wall, cpu = (sum(r.get(k, 0.0) for r in rows)
                                               for k in ("answer_tokens", "forwards", "wall_s", "cpu_s"))
                summary.setdefault(model, {}).setdefault(setting, {})[task] = dict(
                    n=len(rows), accuracy=100.0 * sum(r["correct"] for r in rows) / len(rows),
                    tokens_per_forward=tokens / forwards if forwards else 0.0,
                    wall_ms=1000.0 * wall / len(rows), tokens_per_s=tokens / wall if wall else 0.0,
                    cpu_ms=1000.0 * cpu / len(rows), tokens_per_cpu_s=tokens / cpu if cpu else 0.0)
    return summary


def cache_agreement(records: list[dict]) -> dict:
    """model -> cached setting -> share of examples whose canvas equals the uncached run's (same sampler)."""
    out: dict = {}
    by_key = {(r["model"], r["setting"], r["task"], r["example"]): r["canvas"] for r in records}
    for r in records:
        if " cache=" in r["setting"] and not r["setting"].endswith("cache=none"):
            base = r["setting"].rsplit(" cache=", 1)[0] + " cache=none"
            other = by_key.get((r["model"], base, r["task"], r["example"]))
            if other is not None:
                counts = out.setdefault(r["model"], {}).setdefault(r["setting"], [0, 0])
                counts[0] += other == r["canvas"]
                counts[1] += 1
    return {m: {s: 100.0 * a / n for s, (a, n) in d.items()} for m, d in out.items()}


def run_bench(models: list, twins: dict, samplers: list[str], overrides: dict, caches: list[str],
              per_task: int, progress: bool = True) -> dict:
    records, plans, times = [], {}, {}
    for model in models:
        settings = plan_settings(samplers, model.gen_length, overrides, caches)
        plans[model.config.suite] = [asdict(s) for s in settings]
        start = time.perf_counter()
        records += run_model(model, twins.get(model.config.suite), settings, per_task, progress)
        times[model.config.suite] = time.perf_counter() - start
    return dict(settings=plans, per_task=per_task, bench_time_s=times, reference=REFERENCE,
                models={m.config.suite: dict(parameters=m.num_parameters(), info=m.config.info) for m in models},
                summary=summarize(records), cache_agreement=cache_agreement(records),
                twin_agreement=twin_agreement(records), records=records)
