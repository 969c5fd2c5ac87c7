"""``python -m benchmarks quality``: are constrained answers as good as free ones?

The same prompts are answered greedily by the batched ``Generator`` in several settings. The
prompts come from one of three sources:

- ``families`` (the default, ``extraction_tasks``): extraction of records users extract (people,
  products and prices, events and dates, yes/no flags, categories, lists, a nested object) from
  everyday prose, half the prompts naming the fields, half only asking for the record;
- ``terse``: the same passages, each asked for without saying JSON ("... Extract the person.");
- ``maskbench`` (``quality_tasks``): extraction of a MaskBench schema's JSON from prose that
  states every value, plus choice and regex questions.

Settings:

- ``free``: unconstrained generation, then parse (the first JSON object / option / regex match
  in the text): the baseline people use;
- ``<policy>``: constrained under a JSON whitespace policy (``compact``, ``spaced``,
  ``flexible``, ``newlines``, ``any`` or a bounded regex), with the loop guard on, as the
  library decodes by default (``decoding.loops``);
- ``<policy>+noguard``: the same without the loop guard (what the guard costs or saves);
- ``<policy>+nostrings``: the same without the string guard (``decoding.strings``).

Choice and regex answers do not depend on the whitespace policy, so they are decoded once and
shared by the constrained settings (their time counts once, for the first setting that decoded
them). Per setting, and per family: per-field accuracy with a bootstrap CI (resampling tasks),
its paired difference to ``free``, outputs that are valid (constrained: complete; free:
parsed), outputs cut by ``max_tokens``, tokens per answer against the same values written
compactly, the share of outputs whose tokens are not what re-tokenising their text gives, mask
time and wall time; per field, its accuracy (the worst fields show what a policy breaks).

``choose_default`` picks, from a tune-split run, the most accurate constrained whitespace policy
whose extraction answers use at most ``TOKEN_BUDGET`` times the compact form's tokens and that
runs at most ``LENGTH_CUT_BUDGET`` of its answers to ``max_tokens``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from cdsl_struct import Reasoning
from cdsl_struct.bench import write_report
from cdsl_struct.constraints import WhitespacePolicy, compile
from cdsl_struct.errors import CompileError

from .extraction_tasks import family_tasks
from .quality_tasks import Path_, Task, build_tasks

DEFAULT_SETTINGS = ("free", "compact", "spaced", "flexible", "newlines", "any")
SOURCES = ("families", "terse", "maskbench")
TOKEN_BUDGET = 1.30
"""A default may write at most this many tokens per answer against the compact form of its value."""
LENGTH_CUT_BUDGET = 0.01
THOUGHT_MARKERS = 8
"""Tokens a ``+thinkN`` setting adds to ``max_tokens`` beside N: the two markers, spelled out."""
"""A default may run at most this share of its answers to ``max_tokens``."""


@dataclass
class QualityConfig:
    split: str = "tune"
    cases: int = 210
    source: str = "families"
    settings: tuple[str, ...] = DEFAULT_SETTINGS
    kinds: tuple[str, ...] = ("extract", "choice", "regex")
    max_tokens: int = 128
    concurrency: int = 16
    draft: str | None = "auto"
    model: str = "smollm2"
    dtype: str = "auto"
    torch_compile: bool = False
    bootstrap: int = 1000
    seed: int = 0


@dataclass
class Answer:
    """One task answered in one setting."""

    task: Task
    text: str
    valid: bool
    correct: dict[Path_, bool]
    tokens: int
    retokenized: int
    mask_seconds: float
    finish_reason: str = ""
    compact_tokens: int = 0
    """Tokens of the answer's value re-serialised compactly (valid extraction answers only)."""


@dataclass
class SettingRun:
    name: str
    answers: list[Answer] = field(default_factory=list)
    wall_seconds: float = 0.0


def parse_setting(name: str) -> tuple[str | None, bool]:
    """``"flexible"`` -> (the whitespace policy, loop guard on); ``"flexible+noguard"`` -> the
    same with the loop guard off; ``"free"`` -> (None, True). ``+thinkN`` (see ``thinking_of``)
    may follow either."""
    base, *extras = name.split("+")
    if any(extra not in ("noguard", "nostrings") and thinking_of(f"+{extra}") is None for extra in extras):
        raise ValueError(f"unknown setting {name!r}: use free, a whitespace policy, or POLICY+noguard / "
                         "+nostrings / +thinkN")
    guard = "noguard" not in extras
    if base == "free":
        return None, guard
    WhitespacePolicy.parse(base)  # a bad or unbounded pattern fails here, before any decoding
    return base, guard


def thinking_of(name: str) -> int | None:
    """``"flexible+think64"`` -> 64: the answer comes after a thought of at most 64 tokens
    (``reasoning=Reasoning(budget=64, required=True)``, with ``max_tokens`` raised by as much);
    None without ``+thinkN``."""
    for extra in name.split("+")[1:]:
        if extra.startswith("think") and extra[5:].isdigit():
            return int(extra[5:])
    return None


# --- scoring ------------------------------------------------------------------------------------


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (code fences and prose around it are skipped)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def same_value(predicted: Any, gold: Any) -> bool:
    """Exact match of one field (numbers compare by value, booleans only with booleans)."""
    if isinstance(gold, bool) or isinstance(predicted, bool):
        return predicted is gold
    if isinstance(gold, (int, float)) and isinstance(predicted, (int, float)):
        return float(predicted) == float(gold)
    return type(predicted) is type(gold) and predicted == gold


def _lookup(value: Any, path: Path_) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


_MISSING = object()


def score(task: Task, text: str, constrained: bool) -> tuple[bool, dict[Path_, bool]]:
    """(valid, correct per field) of an answer's text."""
    if task.kind == "extract":
        value = first_json_object(text) if not constrained else _loads(text)
        valid = value is not None
        if valid and constrained:
            try:
                jsonschema.validate(value, task.constraint)
            except jsonschema.exceptions.SchemaError:
                pass
            except jsonschema.ValidationError:
                valid = False
        return valid, {p: valid and same_value(_lookup(value, p), g) for p, g in task.fields.items()}
    (path, gold), = task.fields.items()
    if task.kind == "choice":
        if constrained:
            answer = text if text in task.constraint else None
        else:
            found = [(m.start(), o) for o in task.constraint for m in [re.search(re.escape(o), text)] if m]
            answer = min(found)[1] if found else None
    else:
        match = re.fullmatch(task.constraint, text) if constrained else re.search(task.constraint, text)
        answer = match.group(0).rstrip(".") if match else None
    return answer is not None, {path: answer == gold}


def _loads(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- running ------------------------------------------------------------------------------------


def usable_tasks(tasks: list[Task], generator: Any, settings: tuple[str, ...]) -> tuple[list[Task], list[str]]:
    """The tasks every setting can compile (llguidance and outlines-core refuse some schemas)."""
    keep, dropped = [], []
    patterns = {parse_setting(s)[0] for s in settings} - {None}
    for task in tasks:
        if task.kind != "extract":
            keep.append(task)
            continue
        try:
            for pattern in patterns:
                compile(task.constraint, generator.vocabulary, whitespace=pattern, timeout=10.0)
        except CompileError as exc:
            dropped.append(f"{task.id}: {type(exc).__name__}")
            continue
        keep.append(task)
    return keep, dropped


def _request(task: Task) -> dict[str, Any]:
    if task.kind == "extract":
        return {"schema": task.constraint}
    if task.kind == "choice":
        return {"choices": task.constraint}
    return {"regex": task.constraint}


def answer_all(generator: Any, tasks: list[Task], config: QualityConfig, *, constrained: bool,
               thinking: int | None = None) -> list[Answer]:
    """Answer every task (concurrent callers share the batched engine's steps); with ``thinking``,
    after a thought of at most that many tokens (scored on the answer alone)."""
    if not tasks:
        return []
    tokenizer = generator.tokenizer
    eos = set(generator.vocabulary.eos_token_ids)

    def one(task: Task) -> Answer:
        request = _request(task) if constrained else {}
        budget = config.max_tokens
        if thinking is not None:
            request["reasoning"] = Reasoning(budget=thinking, required=True)
            budget += thinking + THOUGHT_MARKERS
        result = generator.generate(task.prompt, max_tokens=budget, temperature=0.0, **request)
        tokens = [t for t in result.tokens if t not in eos]
        valid, correct = score(task, result.text, constrained)
        if constrained:
            valid = valid and result.complete
        compact = 0
        if valid and task.kind == "extract":
            value = _loads(result.text) if constrained else first_json_object(result.text)
            compact_text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            compact = len(tokenizer.encode(compact_text, add_special_tokens=False))
        retokenized = len(tokenizer.encode(result.text, add_special_tokens=False))
        return Answer(task, result.text, valid, correct, len(tokens), retokenized, result.stats.mask_seconds,
                      result.finish_reason, compact)

    with ThreadPoolExecutor(config.concurrency, thread_name_prefix="quality") as pool:
        return list(pool.map(one, tasks))


def run_quality(data_dir: str | Path, config: QualityConfig, progress: bool = True) -> dict[str, Any]:
    """Answer the split's tasks in every setting; return the summary (and every answer).

    One Generator answers every setting, so the batched engine's prefix cache prefills each
    prompt once: tasks go in chunks of ``concurrency``, and each chunk is answered in every
    setting (the order rotates from chunk to chunk, so no setting always pays the prefill).
    """
    from cdsl_struct.models import load_model

    loaded = load_model(config.model, dtype=config.dtype)
    generator = _switching_generator(loaded, config)
    try:
        tasks, dropped = usable_tasks(load_tasks(data_dir, config), generator, config.settings)
        runs = {name: SettingRun(name) for name in config.settings}
        shared: dict[str, Answer] = {}  # choice / regex answers, the same under every policy
        chunks = [tasks[i:i + config.concurrency] for i in range(0, len(tasks), config.concurrency)]
        for number, chunk in enumerate(chunks):
            order = list(config.settings)
            order = order[number % len(order):] + order[:number % len(order)]
            for name in order:
                pattern, guard = parse_setting(name)
                thinking = thinking_of(name)
                shares = pattern is not None and thinking is None  # choice/regex answers: one decode
                generator.whitespace, generator.loop_guard = pattern or "compact", guard
                generator.string_guard = "nostrings" not in name.split("+")
                todo = [t for t in chunk if t.kind == "extract" or t.id not in shared] if shares else chunk
                if progress:
                    print(f"[quality] {config.split} chunk {number + 1}/{len(chunks)}: {name}", flush=True)
                start = time.perf_counter()
                answers = answer_all(generator, todo, config, constrained=pattern is not None, thinking=thinking)
                runs[name].wall_seconds += time.perf_counter() - start
                if shares:
                    shared.update((a.task.id, a) for a in answers if a.task.kind != "extract")
                    answers = [a for a in answers if a.task.kind == "extract"]
                    answers += [shared[t.id] for t in chunk if t.kind != "extract"]
                runs[name].answers += answers
    finally:
        generator.close()
    summary = summarize(runs, config)
    summary["dropped_tasks"] = dropped
    summary["answers"] = {name: [_answer_row(a) for a in run.answers] for name, run in runs.items()}
    return summary


def load_tasks(data_dir: str | Path, config: QualityConfig) -> list[Task]:
    """The split's tasks from ``config.source`` (``data_dir`` is read for ``maskbench`` only)."""
    if config.source in ("families", "terse"):
        return family_tasks(config.split, config.cases, terse=config.source == "terse")
    if config.source == "maskbench":
        return build_tasks(data_dir, config.split, config.cases, config.kinds)
    raise ValueError(f"unknown source {config.source!r}; choose from {', '.join(SOURCES)}")


def _switching_generator(loaded: Any, config: QualityConfig) -> Any:
    """A Generator whose whitespace policy the bench switches between settings (``.whitespace``)."""
    from cdsl_struct.api import Generator

    return Generator(loaded, draft=config.draft, max_batch_size=config.concurrency,
                     torch_compile=config.torch_compile)


def _answer_row(answer: Answer) -> dict[str, Any]:
    return {"id": answer.task.id, "text": answer.text, "valid": answer.valid, "tokens": answer.tokens,
            "retokenized": answer.retokenized, "finish_reason": answer.finish_reason,
            "correct": {".".join(p): c for p, c in answer.correct.items()}}


# --- summarising --------------------------------------------------------------------------------


def bootstrap_ci(per_task: list[tuple[int, int]], samples: int, seed: int) -> tuple[float, float]:
    """95% percentile interval of sum(correct)/sum(fields), resampling tasks."""
    if not per_task:
        return 0.0, 0.0
    rng = random.Random(seed)
    values = []
    for _ in range(samples):
        pick = [per_task[rng.randrange(len(per_task))] for _ in per_task]
        total = sum(n for _, n in pick)
        values.append(sum(c for c, _ in pick) / total if total else 0.0)
    values.sort()
    return values[int(0.025 * (samples - 1))], values[int(0.975 * (samples - 1))]


def paired_delta_ci(a: list[tuple[int, int]], b: list[tuple[int, int]], samples: int,
                    seed: int) -> tuple[float, float, float]:
    """Accuracy of ``a`` minus ``b`` on the same tasks, with a 95% paired bootstrap interval."""
    def acc(rows: list[tuple[int, int]]) -> float:
        total = sum(n for _, n in rows)
        return sum(c for c, _ in rows) / total if total else 0.0

    rng = random.Random(seed)
    deltas = []
    for _ in range(samples):
        idx = [rng.randrange(len(a)) for _ in a]
        deltas.append(acc([a[i] for i in idx]) - acc([b[i] for i in idx]))
    deltas.sort()
    return acc(a) - acc(b), deltas[int(0.025 * (samples - 1))], deltas[int(0.975 * (samples - 1))]


def _per_task(answers: list[Answer], kind: str | None) -> list[tuple[int, int]]:
    return [(sum(a.correct.values()), len(a.correct)) for a in answers if kind is None or a.task.kind == kind]


def _groups(answers: list[Answer]) -> dict[str, list[Answer]]:
    """Answers by what they are reported under: all, each task kind, each family, each prompt style."""
    groups: dict[str, list[Answer]] = {"all": list(answers)}
    for answer in answers:
        groups.setdefault(answer.task.kind, []).append(answer)
        family, _, style = answer.task.source.partition("/")
        if style:
            groups.setdefault(f"family:{family}", []).append(answer)
            groups.setdefault(f"prompt:{style}", []).append(answer)
    return groups


def _field_accuracy(answers: list[Answer]) -> dict[str, list[int]]:
    """``family.field`` (or ``kind.field``) -> [correct, total] over the answers."""
    fields: dict[str, list[int]] = {}
    for answer in answers:
        family = answer.task.source.partition("/")[0] if "/" in answer.task.source else answer.task.kind
        for path, correct in answer.correct.items():
            counts = fields.setdefault(f"{family}.{'.'.join(path)}", [0, 0])
            counts[0] += int(correct)
            counts[1] += 1
    return dict(sorted(fields.items()))


def _entry(answers: list[Answer], baseline: dict[str, Answer] | None, config: QualityConfig) -> dict[str, Any]:
    per_task = _per_task(answers, None)
    fields = sum(n for _, n in per_task)
    low, high = bootstrap_ci(per_task, config.bootstrap, config.seed)
    finished = [a for a in answers if a.finish_reason == "stop"]
    entry: dict[str, Any] = {
        "tasks": len(answers), "fields": fields,
        "accuracy": round(sum(c for c, _ in per_task) / fields, 4), "ci95": [round(low, 4), round(high, 4)],
        "valid": round(sum(a.valid for a in answers) / len(answers), 4),
        "tokens_per_answer": round(sum(a.tokens for a in answers) / len(answers), 2),
        "retokenized_per_answer": round(sum(a.retokenized for a in answers) / len(answers), 2),
        "non_canonical_outputs": round(sum(a.tokens != a.retokenized for a in answers) / len(answers), 4),
        "mask_ms_per_token": round(1000 * sum(a.mask_seconds for a in answers)
                                   / max(1, sum(a.tokens for a in answers)), 4),
        "length_cut": sum(a.finish_reason == "length" for a in answers),
        "length_cut_share": round(sum(a.finish_reason == "length" for a in answers) / len(answers), 4),
        "valid_finished": round(sum(a.valid for a in finished) / max(1, len(finished)), 4),
    }
    paired = [a for a in answers if a.compact_tokens]
    if paired:
        entry["tokens_vs_compact_form"] = round(sum(a.tokens for a in paired) / sum(a.compact_tokens for a in paired),
                                                4)
    if baseline is not None and all(a.task.id in baseline for a in answers):
        ours = _per_task(answers, None)
        theirs = _per_task([baseline[a.task.id] for a in answers], None)
        delta, d_low, d_high = paired_delta_ci(ours, theirs, config.bootstrap, config.seed)
        entry["delta_vs_free"] = [round(delta, 4), round(d_low, 4), round(d_high, 4)]
    return entry


def summarize(runs: dict[str, SettingRun], config: QualityConfig) -> dict[str, Any]:
    """Per setting, and per task kind, family and prompt style: accuracy with CIs, validity,
    answers cut by ``max_tokens``, tokens, canonicality, time; per field, its accuracy."""
    baseline = {a.task.id: a for a in runs["free"].answers} if "free" in runs else None
    table: dict[str, Any] = {}
    for name, run in runs.items():
        row: dict[str, Any] = {"wall_s": round(run.wall_seconds, 1)}
        for group, answers in _groups(run.answers).items():
            if answers:
                row[group] = _entry(answers, None if name == "free" else baseline, config)
        row["fields"] = _field_accuracy(run.answers)
        table[name] = row
    return {"split": config.split, "cases": config.cases, "source": config.source, "settings": table,
            "chosen_default": choose_default(table)}


def choose_default(table: dict[str, Any]) -> str | None:
    """The most accurate constrained whitespace policy on extraction whose answers take at most
    ``TOKEN_BUDGET`` times the tokens of the same values written compactly and run at most
    ``LENGTH_CUT_BUDGET`` of its answers to ``max_tokens``; ties go to fewer tokens."""
    candidates = []
    for name, row in table.items():
        entry = row.get("extract")
        if name == "free" or "+" in name or entry is None:
            continue
        if entry.get("tokens_vs_compact_form", 1.0) > TOKEN_BUDGET or entry["length_cut_share"] > LENGTH_CUT_BUDGET:
            continue
        candidates.append((-entry["accuracy"], entry.get("tokens_vs_compact_form", 1.0), name))
    return min(candidates)[2] if candidates else None


def format_summary(summary: dict[str, Any], worst_fields: int = 4) -> str:
    """A text table of one run: every group of every setting, then each setting's worst fields."""
    lines = [f"bench quality, split {summary['split']} ({summary['cases']} cases, source {summary.get('source')})",
             f"{'setting':<12}{'group':<18}{'n':>5}{'acc':>7}  {'ci95':<15}{'d vs free [ci95]':<26}{'valid':>6}"
             f"{'cut':>4}{'tok':>7}{'retok':>7}{'/cmp':>6}{'noncan':>7}{'mask ms/tok':>12}{'wall s':>8}"]
    for name, row in summary["settings"].items():
        for group, e in row.items():
            if not isinstance(e, dict) or "accuracy" not in e:
                continue
            delta = e.get("delta_vs_free")
            delta_text = f"{delta[0]:+.3f} [{delta[1]:+.3f},{delta[2]:+.3f}]" if delta else ""
            lines.append(f"{name:<12}{group:<18}{e['fields']:>5}{e['accuracy']:>7.3f}  "
                         f"[{e['ci95'][0]:.3f},{e['ci95'][1]:.3f}]  {delta_text:<26}{e['valid']:>6.2f}"
                         f"{e['length_cut']:>4}{e['tokens_per_answer']:>7.1f}{e['retokenized_per_answer']:>7.1f}"
                         f"{e.get('tokens_vs_compact_form', float('nan')):>6.2f}"
                         f"{e['non_canonical_outputs']:>7.2f}{e['mask_ms_per_token']:>12.3f}"
                         f"{row['wall_s'] if group == 'all' else '':>8}")
    for name, row in summary["settings"].items():
        worst = sorted(row.get("fields", {}).items(), key=lambda item: item[1][0] / item[1][1])[:worst_fields]
        lines.append(f"worst fields, {name}: " + ", ".join(f"{f} {c}/{n}" for f, (c, n) in worst))
    lines.append(f"chosen default whitespace (most accurate on extraction within {TOKEN_BUDGET:.2f}x the compact "
                 f"form's tokens and {LENGTH_CUT_BUDGET:.0%} answers cut): {summary['chosen_default']}")
    if summary.get("dropped_tasks"):
        lines.append(f"dropped (a setting could not compile): {len(summary['dropped_tasks'])}")
    return "\n".join(lines)


# --- command line -------------------------------------------------------------------------------


def add_arguments(parser: Any) -> None:
    """``python -m benchmarks quality``'s options (defaults are ``QualityConfig``'s)."""
    defaults = QualityConfig()
    parser.add_argument("--source", default=defaults.source, choices=SOURCES,
                        help="families: extraction in seven everyday families (default); terse: the same, "
                             "asked for without saying JSON; maskbench: tasks from MaskBench cases (needs --data)")
    parser.add_argument("--data", default="../shared/data/maskbench", help="MaskBench .jsonl.gz folder (maskbench)")
    parser.add_argument("--split", default="both", choices=["tune", "report", "both"],
                        help="both: choose the whitespace default on tune, then measure on report (default)")
    parser.add_argument("--cases", type=int, default=defaults.cases, help="cases per split")
    parser.add_argument("--settings", default=",".join(defaults.settings),
                        help="comma-separated: free, compact, spaced, flexible, newlines, any, a bounded "
                             "whitespace regex, each optionally +noguard (loop guard off)")
    parser.add_argument("--kinds", default=",".join(defaults.kinds), help="task kinds: extract, choice, regex")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency, help="rows decoded together")
    parser.add_argument("--draft", default=defaults.draft, help="the Generator's draft (default auto: prompt lookup)")
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--dtype", default=defaults.dtype, choices=["auto", "float32", "bfloat16", "float16"],
                        help="weights' precision (default auto, as load_model)")
    parser.add_argument("--torch-compile", action="store_true",
                        help="the Generator's batched forward through torch.compile (answers of the compiled path)")
    parser.add_argument("--threads", type=int, help="torch threads (1 suits a shared machine)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--json", dest="json_out", help="write the summaries and every answer here")


def run_from_args(args: Any) -> tuple[dict[str, Any], str]:
    """Run ``python -m benchmarks quality`` as the command line asked; return (report, printed table)."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    settings = tuple(s for s in args.settings.split(",") if s)
    for name in settings:
        parse_setting(name)
    splits = ("tune", "report") if args.split == "both" else (args.split,)
    report: dict[str, Any] = {"summary": {}}
    tables = []
    for split in splits:
        config = QualityConfig(split=split, cases=args.cases, source=args.source, settings=settings,
                               kinds=tuple(k for k in args.kinds.split(",") if k), max_tokens=args.max_tokens,
                               concurrency=args.concurrency, draft=None if args.draft == "none" else args.draft,
                               model=args.model, dtype=args.dtype, torch_compile=args.torch_compile)
        report[split] = run_quality(args.data, config, progress=not args.no_progress)
        tables.append(format_summary(report[split]))
    if "tune" in report:
        report["summary"]["default_chosen_on_tune"] = report["tune"]["chosen_default"]
    if "report" in report:
        report["summary"]["report"] = {name: row.get("all") for name, row in report["report"]["settings"].items()}
    return report, "\n\n".join(tables)


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    return write_report(*run_from_args(args), args)
