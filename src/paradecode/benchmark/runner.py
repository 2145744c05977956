"""Running the benchmark: one process, warm-up first, methods interleaved per question, a record per run.

Every requested name is either a registered paradecode method or a peer (``peers.PEERS``); both become a
``Contender`` with ``prepare`` and ``generate(prompt_ids, max_new_tokens) -> turn``. Each finished
(method, question) record is appended to ``records.jsonl`` at once, so an interrupted run loses at most the
record in flight and ``--resume`` continues from the log.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from paradecode import utf8
from paradecode.backends import DTYPES
from paradecode.benchmark.peers import PEERS, Peer
from paradecode.benchmark.questions import Question, round_robin
from paradecode.errors import ParadecodeError
from paradecode.registry import METHODS, build_options, parse_options, resolve_method
from paradecode.tree_layout import tree_depths

RECORDS = "records.jsonl"
SETTINGS = "settings.json"


@dataclass
class MethodSpec:
    name: str  # the label in records and reports: the method's name, or LABEL of a LABEL=METHOD variant
    peer: type[Peer] | None  # None: a registered paradecode method
    options: dict[str, Any]  # raw values, validated against the method's Options
    method: str  # the registered method or peer that runs (``name`` itself unless a variant)
    dtype: str | None = None  # a paradecode method run on its own copy of the model in this dtype (--opt L.dtype=)


def parse_method(entry: str) -> tuple[str, str]:
    """``--methods`` entry -> (label, method): ``pld`` runs pld as ``pld``; ``pld4=pld`` runs pld as ``pld4``,
    so one run can compare option sets of one method (``--opt pld4.num_draft=4``)."""
    label, sep, method = (part.strip() for part in entry.partition("="))
    if not sep:
        return label, label
    if not label or not method:
        raise ParadecodeError(f"--methods entry {entry!r}: a variant takes the form LABEL=METHOD, e.g. pld4=pld.")
    if any(c in label for c in ".:/\\ ") or label in ("all",):
        raise ParadecodeError(f"--methods entry {entry!r}: the label {label!r} may not contain '.', ':', '/', "
                              "'\\' or spaces (it names option keys and answer files).")
    return label, method


def plan_methods(names: Iterable[str], opts: Iterable[str], draft_model: str | None) -> list[MethodSpec]:
    """Validate method names and ``--opt METHOD.key=value`` options before any model is loaded."""
    entries = [parse_method(n) for n in names if n.strip()]
    if not entries:
        raise ParadecodeError("no methods given: pass --methods ar,pld,... (see `paradecode methods`).")
    names = [label for label, _ in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ParadecodeError(f"method {', '.join(duplicates)} is listed twice in --methods; to compare option "
                              "sets of one method, label them: --methods pld,pld4=pld --opt pld4.num_draft=4.")
    by_method: dict[str, list[str]] = {}
    for opt in opts:
        key, sep, value = opt.partition("=")
        method, dot, option = key.partition(".")
        if not sep or not dot or not option:
            raise ParadecodeError(f"bench options take the form METHOD.key=value (e.g. pld.num_draft=4), got {opt!r}.")
        if method.strip() not in names:
            raise ParadecodeError(f"--opt {opt!r} is for method {method!r}, which is not in --methods.")
        by_method.setdefault(method.strip(), []).append(f"{option}={value}")
    specs = []
    for name, method in entries:
        if name != method and (name in METHODS or name in PEERS):
            raise ParadecodeError(f"--methods entry {name}={method}: the label {name!r} is itself a method; pick "
                                  "another label, e.g. " + f"{method}2={method}.")
        if method not in METHODS and method not in PEERS:
            raise ParadecodeError(
                f"unknown method {method!r}; paradecode methods: {', '.join(METHODS.names())}; "
                f"peers: {', '.join(PEERS.names())}."
            )
        peer = PEERS[method] if method not in METHODS else None
        if peer and peer.requirement(draft_model):
            raise ParadecodeError(peer.requirement(draft_model))
        options = parse_options(by_method.get(name, []))
        dtype = options.pop("dtype", None)
        if dtype is not None and (peer or dtype not in DTYPES):
            raise ParadecodeError(f"--opt {name}.dtype={dtype}: a paradecode method takes dtype "
                                  f"{' or '.join(DTYPES)} (peers run their own weights).")
        if peer:
            build_options(peer, options)  # raises a ParadecodeError for a bad option
        else:
            options = resolve_method(method, options, draft_model).options
        specs.append(MethodSpec(name, peer, options, method, dtype))
    return specs


DEFAULT_METHODS = ("ar", "auto", "pld", "hf", "hf-pld")  # plain decoding, the default method, prompt lookup, and
# transformers' both


def all_methods(draft_model: str | None) -> list[str]:
    """``--methods all``: every registered method that runs with the given options, then every peer whose
    requirements are met (a peer unavailable on this machine is skipped later, with a note)."""
    names = []
    for name in METHODS.names():
        try:
            plan_methods([name], [], draft_model)
        except ParadecodeError:
            continue  # needs something not given (e.g. a draft model)
        names.append(name)
    return names + [p for p, cls in PEERS.items() if cls.requirement(draft_model) is None and p not in names]


class Contender:
    """One method ready to run on a loaded model."""

    def __init__(self, spec: MethodSpec, model: Any, draft_model: str | None) -> None:
        self.name, self.method, self.model = spec.name, spec.method, model
        self.options = spec.options
        self.peer = spec.peer(build_options(spec.peer, spec.options), model, draft_model) if spec.peer else None

    def prepare(self) -> None:
        if self.peer:
            self.peer.prepare()

    def close(self) -> None:
        if self.peer:
            self.peer.close()

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> dict:
        start = time.perf_counter()
        if self.peer:
            run = self.peer.generate(prompt_ids, max_new_tokens)
            wall = time.perf_counter() - start
            if run.wall_time_s is not None:  # timed by the peer itself (llama.cpp: inside its child process)
                run.info["call_wall_time_s"] = wall  # with the overhead around it (for llama.cpp, the pipe)
                wall = run.wall_time_s
            return dict(prompt_tokens=len(prompt_ids), token_ids=run.token_ids, new_tokens=len(run.token_ids),
                        text=self.model.decode(run.token_ids), wall_time_s=wall, forward_passes=run.forward_passes,
                        draft_forward_passes=run.draft_forward_passes, draft_lengths=run.draft_lengths,
                        accepted_lengths=run.accepted_lengths, accepted_per_step=run.accepted_per_step,
                        stop_reason=_peer_stop(run.token_ids, max_new_tokens, self.model.eos_ids), stats=None,
                        info=run.info)
        result = self.model.generate(prompt_ids, method=self.method, max_new_tokens=max_new_tokens,
                                     options=dict(self.options))
        return _turn(prompt_ids, result, time.perf_counter() - start)

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int, batch: int) -> list[dict | ParadecodeError]:
        """Every prompt's turn, decoded together (``Model.generate_batch``, up to ``batch`` at once; each answer is
        the one it gets alone). The batch's wall time is shared out by tokens: each turn's ``wall_time_s`` is the
        batch's times its share of the batch's new tokens, so the turns' tokens over their times is the batch's
        throughput; ``info`` holds the batch's size and wall time. A prompt that fails gets its error instead."""
        start = time.perf_counter()
        results = self.model.generate_batch([dict(prompt=ids) for ids in prompts], max_batch=batch,
                                            return_errors=True, method=self.method, max_new_tokens=max_new_tokens,
                                            options=dict(self.options))
        wall = time.perf_counter() - start
        done = [r for r in results if not isinstance(r, ParadecodeError)]
        tokens = sum(len(r.token_ids) for r in done)
        info = dict(batch_size=len(prompts), batch_wall_time_s=wall)
        return [r if isinstance(r, ParadecodeError) else
                _turn(ids, r, wall * (len(r.token_ids) / tokens if tokens else 1 / len(done)), dict(info))
                for ids, r in zip(prompts, results)]


def _turn(prompt_ids: list[int], result: Any, wall: float, info: dict | None = None) -> dict:
    """A turn's record from a paradecode ``GenerationResult`` and its wall time."""
    stats = result.stats
    return dict(prompt_tokens=len(prompt_ids), token_ids=result.token_ids, new_tokens=len(result.token_ids),
                text=result.text, wall_time_s=wall, forward_passes=stats.forward_passes,
                draft_forward_passes=stats.draft_forward_passes,
                draft_lengths=[draft_depth(s.drafted, s.parents) for s in stats.steps],
                accepted_lengths=[s.accepted_len for s in stats.steps],
                accepted_per_step=stats.accepted_per_step, stop_reason=stats.stop_reason,
                stats=stats.to_dict(with_steps=False), info=info)


def contenders(specs: list[MethodSpec], model: Any, load: Callable[[str], Any], draft_model: str | None
               ) -> tuple[list[Contender], dict[str, str], bool]:
    """Each spec ready to run, on ``model`` or, for a variant with its own dtype, on a copy ``load(dtype)``
    loaded once per dtype. Returns (contenders, {name: why a peer cannot run here}, whether copies were
    loaded)."""
    models = {model.dtype: model}
    for dtype in {spec.dtype for spec in specs} - {None, model.dtype}:
        models[dtype] = load(dtype)
    ready, skipped = [], {}
    for spec in specs:
        reason = spec.peer.unavailable(model) if spec.peer else None
        if reason:
            skipped[spec.name] = reason
        else:
            ready.append(Contender(spec, models[spec.dtype or model.dtype], draft_model))
    return ready, skipped, len(models) > 1


def _peer_stop(tokens: list[int], max_new_tokens: int, eos_ids) -> str | None:
    if tokens and tokens[-1] in eos_ids:
        return "eos"
    return "max_new_tokens" if len(tokens) >= max_new_tokens else None


def draft_depth(drafted: list[int], parents: list[int] | None) -> int:
    """How many positions deep a proposal reaches: its length for a chain, its depth for a tree."""
    if parents is None:
        return len(drafted)
    return max(tree_depths(parents), default=0)


def build_prompt(model: Any, user_turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of a conversation: user turns with the model's own answers between them, ready for the
    next answer. Chat models get their chat template; others the turns joined by blank lines."""
    if not model.chat:
        parts = [p for pair in zip(user_turns, answers + [""]) for p in pair if p]
        return model.encode("\n\n".join(parts), chat=False)
    messages = []
    for i, turn in enumerate(user_turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return model.encode_chat(messages)


def new_record(contender: Contender, question: Question) -> dict:
    return dict(method=contender.name, question_id=question.question_id, category=question.category, turns=[],
                error=None)


def run_question(contender: Contender, question: Question, turns: int, max_new_tokens: int) -> dict:
    """One (method, question) record: its first ``turns`` turns, each answered in the context of the last."""
    record = new_record(contender, question)
    answers: list[str] = []
    try:
        for user_turns in (list(question.turns[: i + 1]) for i in range(min(turns, len(question.turns)))):
            turn = contender.generate(build_prompt(contender.model, user_turns, answers), max_new_tokens)
            record["turns"].append(turn)
            answers.append(turn["text"])
    except ParadecodeError as error:  # e.g. a prompt longer than the context: recorded, the run goes on
        record["error"] = str(error)
    record["tstamp"] = time.time()
    return record


def run_questions_batched(contender: Contender, questions: list[Question], turns: int, max_new_tokens: int,
                          batch: int) -> list[dict]:
    """The (method, question) records of ``questions`` answered together: each turn of every question in one
    batch (``Contender.generate_batch``), each next turn in the context of the question's own last answer."""
    records = [new_record(contender, q) for q in questions]
    answers: list[list[str]] = [[] for _ in questions]
    for turn in range(turns):
        live = [i for i, q in enumerate(questions) if turn < len(q.turns) and records[i]["error"] is None]
        if not live:
            break
        prompts: dict[int, list[int]] = {}  # question index -> this turn's prompt
        for i in live:
            try:
                prompts[i] = build_prompt(contender.model, list(questions[i].turns[: turn + 1]), answers[i])
            except ParadecodeError as error:
                records[i]["error"] = str(error)
        outs = contender.generate_batch(list(prompts.values()), max_new_tokens, batch) if prompts else []
        for i, out in zip(prompts, outs):
            if isinstance(out, ParadecodeError):  # e.g. a prompt longer than the context: recorded, the run goes on
                records[i]["error"] = str(out)
            else:
                records[i]["turns"].append(out)
                answers[i].append(out["text"])
    for record in records:
        record["tstamp"] = time.time()
    return records


def read_records(out_dir: Path) -> list[dict]:
    """Records logged so far; a torn last line (the process died mid-write) is ignored."""
    path = out_dir / RECORDS
    if not path.is_file():
        return []
    records = []
    for line in utf8.json_lines(path.read_text(encoding="utf-8")):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def start_log(out_dir: Path, settings: dict, resume: bool) -> None:
    """Prepare ``out_dir`` for a run; with ``resume``, first check the logged run had the same settings."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings_path, log_path = out_dir / SETTINGS, out_dir / RECORDS
    if resume and settings_path.is_file():
        before = json.loads(settings_path.read_text())
        changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
        if changed:
            raise ParadecodeError(
                f"--resume: {out_dir} holds a run with other settings ({', '.join(changed)} differ). "
                "Resume with the same model, token limit, turns and options, or write to a new --out folder."
            )
        # rewrite the log without a torn last line, so the next record starts on a line of its own
        log_path.write_text("".join(json.dumps(r) + "\n" for r in read_records(out_dir)), encoding="utf-8")
        return
    if resume and log_path.is_file() and log_path.stat().st_size:
        raise ParadecodeError(f"--resume: {out_dir} has {RECORDS} but no {SETTINGS}, so its settings are unknown; "
                              "start a new run in another --out folder.")
    if log_path.is_file() and log_path.stat().st_size:
        print(f"paradecode: starting over in {out_dir} (pass --resume to continue the run logged there)",
              file=sys.stderr)
    settings_path.write_text(json.dumps(settings, indent=1))
    log_path.write_text("")


def run_all(
    contenders: list[Contender],
    questions: list[Question],
    *,
    turns: int,
    max_new_tokens: int,
    out_dir: Path,
    done: list[dict],
    warmup_tokens: int = 8,
    progress: bool = True,
    batch: int = 1,
) -> list[dict]:
    """Warm up every method, then run the (question, method) pairs not in ``done``, interleaved per question,
    questions in ``round_robin`` order (one of each category per round). With ``batch`` > 1, the questions go in
    groups of ``batch`` in that order, each method answering a group's questions together (paradecode methods
    only). Returns every record, old and new; a KeyboardInterrupt propagates after the finished ones are logged."""
    records = list(done)
    finished = {(r["method"], r["question_id"]) for r in done}
    todo = [(q, c) for q in round_robin(questions) for c in contenders if (c.name, q.question_id) not in finished]
    if not todo:
        return records
    warm_prompt = build_prompt(contenders[0].model, [questions[0].turns[0]], [])
    try:
        for contender in contenders:
            contender.prepare()
            try:
                contender.generate(warm_prompt, warmup_tokens)  # untimed: first-call costs stay out of the figures
            except ParadecodeError:
                pass  # the same error will be recorded with the question it concerns
        run_todo(todo, turns, max_new_tokens, out_dir, records, progress, batch)
    finally:
        for contender in contenders:
            contender.close()  # e.g. ends llama.cpp's child process
    return records


def run_todo(todo: list[tuple[Question, Contender]], turns: int, max_new_tokens: int, out_dir: Path,
             records: list[dict], progress: bool, batch: int = 1) -> None:
    """Run and log each (question, method) pair in order (or, with ``batch`` > 1, each method's share of each
    group of ``batch`` questions together), appending the records to ``records``."""
    from tqdm import tqdm

    bar = tqdm(total=len(todo), file=sys.stderr, unit="run", disable=not progress, dynamic_ncols=True)
    try:
        with (out_dir / RECORDS).open("a", encoding="utf-8") as log:
            for contender, questions in _groups(todo, batch):
                bar.set_postfix_str(f"{contender.name} q{questions[0].question_id}"
                                    + (f" +{len(questions) - 1}" if len(questions) > 1 else ""), refresh=False)
                if batch > 1:
                    done = run_questions_batched(contender, questions, turns, max_new_tokens, batch)
                else:
                    done = [run_question(contender, questions[0], turns, max_new_tokens)]
                for record in done:
                    log.write(json.dumps(record) + "\n")
                log.flush()
                records.extend(done)
                bar.update(len(done))
    finally:
        bar.close()


def _groups(todo: list[tuple[Question, Contender]], batch: int) -> Iterable[tuple[Contender, list[Question]]]:
    """(method, questions) to run together, in ``todo``'s order: each pair alone, or with ``batch`` > 1 the
    questions of each run of ``batch`` questions that one method still has to answer."""
    if batch <= 1:
        yield from ((contender, [question]) for question, contender in todo)
        return
    order: list[int | str] = []  # question ids in todo's order
    questions: dict[int | str, Question] = {}
    pending: dict[int | str, list[Contender]] = {}
    for question, contender in todo:
        if question.question_id not in questions:
            order.append(question.question_id)
            questions[question.question_id] = question
        pending.setdefault(question.question_id, []).append(contender)
    for start in range(0, len(order), batch):
        group = order[start : start + batch]
        contenders = list(dict.fromkeys(c for qid in group for c in pending[qid]))
        for contender in contenders:
            yield contender, [questions[qid] for qid in group if contender in pending[qid]]
