"""``cdsl-struct bench throughput``: the batched engine over a mixed constrained workload.

One deterministic list of requests (JSON-schema extraction, regex, choice, free text; every
fourth with a prompt-lookup draft, the rest with the grammar's forced tokens only) runs through
a fresh ``BatchEngine`` per batch size B, all submitted at once, so B bounds the rows in flight.
Per B: wall time, tokens/s, requests/s, latency p50/p99 (from the start of the run to the
request's end, queueing included), target forward passes, the engine's counters, valid outputs
and the share of requests whose tokens equal the B=1 run's (batch invariance; B=1 itself is
checked on a few requests against a one-row padded reference with no adaptive width, mask threads
or prefix cache; the report keeps its old name, ``b1_equals_decode``). Beside it: the same prompts
unconstrained (free text, no drafts) at the largest B, as served and with no proposers (masks only).
Constraints compile before timing; other libraries hook in as ``baselines`` (``python -m benchmarks throughput``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..constraints import Choice, JsonSchema, Regex, compile
from ..decoding import BatchEngine, Request, SamplingParams, build_proposers
from ..models import BatchRunner, batch_runner, load_model
from ..prompts import prompt_ids
from . import write_report

FREE_TEXT = r"[\s\S]*"


def _object(**types: str) -> dict[str, Any]:
    """A closed JSON object schema whose keys are all required."""
    return {"type": "object", "properties": {k: {"type": t} for k, t in types.items()},
            "required": list(types), "additionalProperties": False}


@dataclass(frozen=True)
class Family:
    """A request template: ``kind``, an instruction with a ``{}`` slot, the constraint (schema
    dict, regex pattern, or choice options; None for free text) and the facts that fill the slot."""

    name: str
    kind: str
    template: str
    constraint: Any
    facts: tuple[str, ...]


_SENTIMENT = Family("sentiment", "choice", "Classify the sentiment of this review as positive, negative or neutral. "
                    "Answer with one word.\n\n{}", ("positive", "negative", "neutral"), (
    "The battery lasts all day and the screen is gorgeous.", "It broke after two days and support never answered.",
    "The package arrived on Tuesday.", "Best pizza I have had in years!", "The hotel was fine, nothing special.",
    "Terrible service and cold food."))

FAMILIES: tuple[Family, ...] = (
    Family("person", "json", "Extract the person as JSON with keys name, age, city.\n\n{}",
           _object(name="string", age="integer", city="string"), (
        "Maria Gonzalez, 34, works as a software engineer in Madrid.", "Tom Becker is 51 and runs a bakery in Hamburg.",
        "Aiko Tanaka, aged 27, teaches mathematics in Osaka.", "Samuel Okafor (42) is a surgeon based in Lagos.")),
    Family("date", "regex", "Write the date {} in ISO format (YYYY-MM-DD).", r"\d{4}-\d{2}-\d{2}",
           ("14 March 2025", "2 May 2024", "31 December 1999", "7 July 2021", "1 January 2030")),
    Family("order", "json", "Extract the order as JSON with keys order_id, customer, total.\n\n{}",
           _object(order_id="string", customer="string", total="number"), (
        "Order A-1043 was placed by Jonathan Pryce for a total of 259.99 dollars.",
        "Customer Lena Fischer placed order B-2210; the total came to 48.50 euros.",
        "Order C-0077 from Rahul Mehta totals 1200 dollars.", "Invoice for order D-5512: buyer Grace Liu, 19.95.")),
    _SENTIMENT,
    Family("phone", "regex", "What is the phone number in this text? Answer with the number only.\n\n{}",
           r"\d{3}-\d{3}-\d{4}", (
        "For support call 555-867-5309 between 9am and 5pm.", "Reach our office at 212-555-0147.",
        "Text 415-555-2671 to confirm your booking.", "The front desk number is 800-555-0199.")),
    Family("event", "json", "Extract the event as JSON with keys title, date, location.\n\n{}",
           _object(title="string", date="string", location="string"), (
        "The Annual Robotics Summit takes place on 2025-03-14 at the Berlin Congress Center.",
        "Join us for the Spring Jazz Night on 2024-04-20 at the Blue Note Club.",
        "The Open Source Day will be held on 2025-09-02 in the Zurich Town Hall.",
        "The Harvest Festival is on 2024-10-05 at Riverside Park.")),
    Family("free", "free", "{}", None, (
        "Write one sentence about the ocean.", "Give a short tip for staying focused.",
        "Describe a cat in one sentence.", "Name a good habit and say why in one sentence.")),
    Family("yesno", "regex", "Answer yes or no, then give a short reason.\n\n{}", r"(yes|no)\. [A-Z][a-z ,']{2,60}\.",
           ("Is the sun a star?", "Can penguins fly?", "Is Paris the capital of France?", "Do fish breathe air?")),
    Family("product", "json", "Extract the product as JSON with keys product, brand, price, in_stock.\n\n{}",
           _object(product="string", brand="string", price="number", in_stock="boolean"), (
        "The Aurora X2 headphones from SoundWave cost 149 dollars and are currently in stock.",
        "The TrailRunner 5 shoes by Peakline sell for 89.99 but are sold out.",
        "Brewmaster's Nova coffee grinder costs 59 dollars and is available now.",
        "The Lumo desk lamp by Brightway is 34.50 dollars; out of stock until May.")),
    _SENTIMENT,
)


@dataclass(frozen=True)
class WorkItem:
    """One request of the workload: its prompt text, constraint and draft source."""

    index: int
    family: str
    kind: str
    prompt: str
    constraint: Any
    draft: str

    @property
    def spec(self) -> Any:
        if self.kind == "json":
            return JsonSchema(self.constraint)
        if self.kind == "choice":
            return Choice(self.constraint)
        return Regex(FREE_TEXT if self.kind == "free" else self.constraint)

    def valid(self, text: str) -> bool:
        """Whether ``text`` satisfies the constraint, checked independently of the engines."""
        import jsonschema

        if self.kind == "json":
            try:
                jsonschema.validate(json.loads(text), self.constraint)
            except (ValueError, jsonschema.ValidationError):
                return False
            return True
        if self.kind == "regex":
            return re.fullmatch(self.constraint, text) is not None
        if self.kind == "choice":
            return text in self.constraint
        return True


def build_workload(count: int, lookup_every: int = 4) -> list[WorkItem]:
    """``count`` requests cycling through ``FAMILIES`` (each family through its facts); every
    ``lookup_every``-th request (0, 4, 8, ...) drafts with prompt lookup."""
    seen: Counter[str] = Counter()
    items = []
    for index in range(count):
        family = FAMILIES[index % len(FAMILIES)]
        fact = family.facts[seen[family.name] % len(family.facts)]
        seen[family.name] += 1
        draft = "lookup" if lookup_every and index % lookup_every == 0 else "none"
        items.append(WorkItem(index, family.name, family.kind, family.template.format(fact), family.constraint, draft))
    return items


@dataclass
class ThroughputConfig:
    """What ``run_throughput_bench`` runs: the batch sizes, the workload and the model."""

    batch_sizes: tuple[int, ...] = (1, 4, 8, 16)
    requests: int = 32
    max_tokens: int = 64
    k: int = 6
    temperature: float = 0.0
    model: str = "smollm2"
    device: str = "auto"
    threads: int | None = None
    with_unconstrained: bool = True
    reference_checks: int = 4


@dataclass
class Job:
    """A prepared request: everything a ``Request`` needs, built before timing."""

    item: WorkItem
    prompt: list[int]
    compiled: Any
    proposers: list[Any]
    params: SamplingParams


@dataclass
class ThroughputRun:
    """What a baseline sees after the engine's runs; it adds its entry to ``summary`` and its
    per-request entries under ``rows[i]["runs"]``."""

    config: ThroughputConfig
    loaded: Any
    items: list[WorkItem]
    jobs: list[Job]
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    pad: int
    progress: bool


Baseline = Callable[[ThroughputRun], None]
"""Something else run on the same workload after the engine's runs (e.g. another library)."""


def run_throughput_bench(config: ThroughputConfig, progress: bool = True,
                         baselines: Sequence[Baseline] = ()) -> dict[str, Any]:
    """Run the sweep (B=1 always first, as the reference), the reference check, the unconstrained
    run and ``baselines`` in order; return ``{"config", "machine", "requests", "summary"}``."""
    before = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _run(config, progress, baselines)
    finally:
        torch.set_num_threads(before)


def _run(config: ThroughputConfig, progress: bool, baselines: Sequence[Baseline]) -> dict[str, Any]:
    loaded = load_model(config.model, device=config.device)
    model, tokenizer = loaded.model, loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else loaded.eos_token_ids[0]
    items = build_workload(config.requests)
    jobs, free_jobs = _jobs(loaded, items, config)
    rows: list[dict[str, Any]] = [{"index": i.index, "family": i.family, "kind": i.kind, "draft": i.draft,
                                   "prompt": i.prompt, "prompt_tokens": len(j.prompt), "runs": {}}
                                  for i, j in zip(items, jobs, strict=True)]

    _engine_run(model, pad, jobs[:2], 1, config, max_tokens=4)  # warm-up, untimed
    sizes = sorted(set(config.batch_sizes) | {1})
    batches, reference = [], None
    for size in sizes:
        outcome = _engine_run(model, pad, jobs, size, config)
        if reference is None:
            reference = outcome["tokens"]
        summary = _summarise(outcome, items, rows, str(size), reference)
        batches.append({"batch": size, **summary})
        say(progress, f"B={size}: {summary['wall_s']:.1f} s, {summary['tokens_per_s']:.1f} tok/s")
    base = batches[0]["tokens_per_s"]
    for entry in batches:
        entry["speedup_vs_b1"] = round(entry["tokens_per_s"] / base, 3) if base else None

    report_summary: dict[str, Any] = {"batches": batches,
                                      "b1_equals_decode": _reference_check(model, jobs, reference, config)}

    if config.with_unconstrained:
        report_summary["unconstrained"] = _overhead(model, pad, jobs, free_jobs, items, rows, batches[-1], reference,
                                                    config)
        say(progress, f"unconstrained B={sizes[-1]}: {report_summary['unconstrained']['tokens_per_s']:.1f} tok/s")

    for baseline in baselines:
        baseline(ThroughputRun(config, loaded, items, jobs, rows, report_summary, pad, progress))

    machine = _machine(loaded)
    kinds = Counter(i.kind for i in items)
    report_summary["workload"] = {"requests": len(items), "kinds": dict(kinds),
                                  "lookup": sum(i.draft == "lookup" for i in items), "k": config.k,
                                  "max_tokens": config.max_tokens, "temperature": config.temperature}
    report_summary["machine"] = machine
    config_dict = asdict(config)
    config_dict["batch_sizes"] = sizes
    return {"config": config_dict, "machine": machine, "requests": rows, "summary": report_summary}


def _jobs(loaded: Any, items: list[WorkItem], config: ThroughputConfig) -> tuple[list[Job], list[Job]]:
    """Each item's job under its constraint, and the same prompt as free text (no drafts)."""
    tokenizer, eos = loaded.tokenizer, loaded.eos_token_ids
    shared = {name: build_proposers(name, loaded.model) for name in ("lookup", "none")}  # stateless: shared by rows
    free = compile(Regex(FREE_TEXT), tokenizer, eos_token_ids=eos)
    jobs, free_jobs = [], []
    for item in items:
        prompt = prompt_ids(tokenizer, item.prompt, chat=True)
        params = SamplingParams(temperature=config.temperature, seed=item.index)
        jobs.append(Job(item, prompt, compile(item.spec, tokenizer, eos_token_ids=eos), shared[item.draft], params))
        free_jobs.append(Job(item, prompt, free, shared["none"], params))
    return jobs, free_jobs


def _reference_check(model: Any, jobs: list[Job], reference: list[list[int]],
                     config: ThroughputConfig) -> dict[str, int]:
    """How many of the first jobs a one-row padded reference engine decodes to the B=1 run's tokens."""
    checks = min(config.reference_checks, len(jobs))
    engine = BatchEngine(BatchRunner(model, prefix_cache_bytes=0), max_batch_size=1, kv_budget_bytes=float("inf"),
                         mask_workers=0, adaptive_width=False)
    equal = 0
    try:
        for job, expected in zip(jobs[:checks], reference[:checks], strict=True):
            single = engine.run([Request(tuple(job.prompt), job.compiled, job.params, config.max_tokens,
                                         tuple(job.proposers), config.k)])[0]
            equal += single.tokens == expected
    finally:
        engine.close()
    return {"checked": checks, "equal": equal}


def _machine(loaded: Any) -> dict[str, Any]:
    machine = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "device": str(loaded.device), "dtype": str(next(loaded.model.parameters()).dtype).replace("torch.", "")}
    if loaded.device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(loaded.device)
    return machine


def _overhead(model: Any, pad: int, jobs: list[Job], free_jobs: list[Job], items: list[WorkItem],
              rows: list[dict[str, Any]], constrained: dict[str, Any], reference: list[list[int]],
              config: ThroughputConfig) -> dict[str, Any]:
    """The constraint's cost per token at the largest B: the sweep's constrained run (forced tokens
    and lookup drafting as served) and the same constraints with no proposers at all (masks only),
    each against the same prompts as free text with no proposers."""
    size = constrained["batch"]
    plain = _summarise(_engine_run(model, pad, free_jobs, size, config), items, rows, "unconstrained", None,
                       check=False)
    bare_jobs = [Job(j.item, j.prompt, j.compiled, [], j.params) for j in jobs]
    bare = _summarise(_engine_run(model, pad, bare_jobs, size, config), items, rows, "constrained_no_drafts",
                      reference)
    per_token = {name: run["wall_s"] / max(run["tokens"], 1) for name, run in
                 (("plain", plain), ("served", constrained), ("bare", bare))}
    return {"batch": size, "tokens_per_s": plain["tokens_per_s"], "tokens": plain["tokens"],
            "wall_s": plain["wall_s"], "passes_per_token": plain["passes_per_token"],
            "constrained_tokens_per_s": constrained["tokens_per_s"],
            "constrained_passes_per_token": constrained["passes_per_token"],
            "overhead_per_token": round(per_token["served"] / per_token["plain"] - 1, 4),
            "no_drafts": {k: bare[k] for k in ("tokens_per_s", "tokens", "wall_s", "passes_per_token", "valid",
                                                "identical_rate")},
            "no_drafts_overhead_per_token": round(per_token["bare"] / per_token["plain"] - 1, 4)}


def _engine_run(model: Any, pad: int, jobs: list[Job], size: int, config: ThroughputConfig,
                max_tokens: int | None = None) -> dict[str, Any]:
    """All ``jobs`` through a fresh engine of ``size`` rows; per-request outcomes and timings."""
    engine = BatchEngine(batch_runner(model, pad_token_id=pad), max_batch_size=size)
    first: dict[int, float] = {}
    requests = [Request(list(job.prompt), job.compiled, params=job.params, max_tokens=max_tokens or config.max_tokens,
                        proposers=job.proposers, k=config.k,
                        on_tokens=lambda _tokens, i=i: first.setdefault(i, time.perf_counter()))
                for i, job in enumerate(jobs)]
    start = time.perf_counter()
    rows = engine.run_rows(requests)
    wall = time.perf_counter() - start
    outcomes = []
    for i, row in enumerate(rows):
        result = row.result
        if result is None:
            outcomes.append({"error": repr(row.error), "tokens": [], "finish_reason": "error", "text": ""})
            continue
        # the engine sets decode_seconds = end - started_at - prefill_seconds: recover the end time
        end = row.started_at + result.stats.prefill_seconds + result.stats.decode_seconds
        outcomes.append({"tokens": list(result.tokens), "finish_reason": result.finish_reason, "text": result.text,
                         "latency_s": end - start, "queue_s": row.started_at - start,
                         "first_token_s": first[i] - start if i in first else None})
    return {"wall_s": wall, "outcomes": outcomes, "tokens": [o["tokens"] for o in outcomes],
            "target_passes": engine.runner.passes, "engine": engine.stats.as_dict()}


def _summarise(outcome: dict[str, Any], items: list[WorkItem], rows: list[dict[str, Any]], key: str,
               reference: list[list[int]] | None, check: bool = True) -> dict[str, Any]:
    """One run's totals; its per-request entries go into ``rows[i]["runs"][key]``."""
    valid = identical = 0
    latencies = []
    for item, row, got, index in zip(items, rows, outcome["outcomes"], range(len(items)), strict=True):
        ok = check and got["finish_reason"] == "stop" and item.valid(got["text"])
        same = reference is not None and got["tokens"] == reference[index]
        valid += ok
        identical += same
        if got.get("latency_s") is not None:
            latencies.append(got["latency_s"])
        row["runs"][key] = {"tokens": len(got["tokens"]), "finish_reason": got["finish_reason"], "valid": ok,
                            "identical_to_b1": same, "text": got["text"], "error": got.get("error"),
                            **{f: round(got[f], 4) for f in ("latency_s", "queue_s", "first_token_s")
                               if got.get(f) is not None}}
    tokens = sum(len(t) for t in outcome["tokens"])
    wall, n = outcome["wall_s"], len(items)
    reasons = Counter(o["finish_reason"] for o in outcome["outcomes"])
    return {"wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
            "requests_per_s": round(n / wall, 3), "latency_p50_s": _percentile(latencies, 50),
            "latency_p99_s": _percentile(latencies, 99), "target_passes": outcome["target_passes"],
            "passes_per_token": round(outcome["target_passes"] / max(tokens, 1), 4),
            "valid": valid, "finish_reasons": dict(reasons),
            "identical_rate": round(identical / n, 4) if reference is not None and n else None,
            "engine": outcome["engine"]}


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (position - low), 4)


def say(progress: bool, line: str) -> None:
    """Print a progress ``line`` to stderr when ``progress``."""
    if progress:
        print(line, file=sys.stderr, flush=True)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_table(report: dict[str, Any]) -> str:
    """A markdown table (one row per batch size; a "vs HF" column where an HF baseline ran) and the
    reference and overhead lines."""
    summary = report["summary"]
    n, work, machine = summary["workload"]["requests"], summary["workload"], summary["machine"]
    with_hf = "hf" in summary
    head = ["B", "wall s", "tokens", "tok/s", "req/s", "p50 s", "p99 s", "vs B=1", "vs HF", "target passes",
            "valid", "identical", "mask hidden", "rows/step", "step ms", "prefill s"]
    if not with_hf:
        head.remove("vs HF")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in summary["batches"]:
        length = b["finish_reasons"].get("length", 0)
        cells = [b["batch"], f"{b['wall_s']:.2f}", b["tokens"], f"{b['tokens_per_s']:.1f}",
                 f"{b['requests_per_s']:.2f}", _seconds(b["latency_p50_s"]), _seconds(b["latency_p99_s"]),
                 f"{b['speedup_vs_b1']:.2f}x",
                 *([f"{b['speedup_vs_hf']:.2f}x" if b.get("speedup_vs_hf") else "-"] if with_hf else []),
                 b["target_passes"],
                 f"{b['valid']}/{n} ({length} length)", f"{b['identical_rate']:.2f}",
                 f"{b['engine']['mask_hidden_share']:.2f}", f"{b['engine']['mean_rows']:.1f}",
                 f"{b['engine']['decode_step_ms']:.0f}", f"{b['engine']['prefill_seconds']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    kinds = ", ".join(f"{k} {v}" for k, v in work["kinds"].items())
    lines += ["", f"workload: {n} requests ({kinds}; {work['lookup']} with prompt lookup, k={work['k']}), "
                  f"max_tokens {work['max_tokens']}, temperature {work['temperature']}; device {machine['device']} "
                  f"{machine['dtype']}, {machine['torch_threads']} torch threads, {machine['cpu_count']} CPUs"]
    ref = summary["b1_equals_decode"]
    lines.append(f"B=1 engine == one-row padded reference: {ref['equal']}/{ref['checked']} requests")
    if "unconstrained" in summary:
        u, bare = summary["unconstrained"], summary["unconstrained"]["no_drafts"]
        lines.append(f"constraint overhead at B={u['batch']} (vs the same prompts as free text, no drafts: "
                     f"{u['tokens_per_s']:.1f} tok/s, {u['passes_per_token']:.2f} passes/token): as served "
                     f"{u['constrained_tokens_per_s']:.1f} tok/s, {u['constrained_passes_per_token']:.2f} "
                     f"passes/token, {u['overhead_per_token'] * 100:+.1f}% per token; no drafts (masks only) "
                     f"{bare['tokens_per_s']:.1f} tok/s, {bare['passes_per_token']:.2f} passes/token, "
                     f"{u['no_drafts_overhead_per_token'] * 100:+.1f}% per token, identical to B=1 "
                     f"{bare['identical_rate']:.2f}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``cdsl-struct bench throughput``'s options."""
    parser.add_argument("--batch", default="1,4,8,16", help="comma-separated batch sizes (1 is always run, first)")
    parser.add_argument("--requests", type=int, default=32, help="requests in the mixed workload (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=6, help="tokens proposed per step by the prompt-lookup rows")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--model", default="smollm2", help="target model (default: the embedded SmolLM2)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-unconstrained", action="store_true", help="skip the unconstrained run")
    parser.add_argument("--json", dest="json_out", help="write config, per-request rows and summary here")
    parser.add_argument("--no-progress", action="store_true")


def config_from(args: argparse.Namespace) -> ThroughputConfig:
    """The config ``args`` describe."""
    return ThroughputConfig(batch_sizes=tuple(int(b) for b in args.batch.split(",") if b.strip()),
                            requests=args.requests, max_tokens=args.max_tokens, k=args.k, temperature=args.temperature,
                            model=args.model, device=args.device, threads=args.threads,
                            with_unconstrained=not args.no_unconstrained)


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    report = run_throughput_bench(config_from(args), progress=not args.no_progress)
    return write_report(report, format_table(report), args)
