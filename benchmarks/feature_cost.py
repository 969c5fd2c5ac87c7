"""What a feature costs per token at 16 rows, side by side with plain JSON (issues 39 and 40).

Sixteen extraction tasks of ``python -m benchmarks quality``'s families are answered together (16
rows of one batched engine) in each setting, the settings interleaved round by round (the order
rotating) so a noisy machine slows them alike; the figure is wall time per generated token, as a
ratio to plain JSON in the same round (median and range over rounds). With ``--requests 48`` the
16 clients send three tasks each, one after another, so the batch stays full where the answers of
a setting differ in length (with 16 tasks, a setting whose rows end at very different lengths runs
half its steps at a few rows, and its time per token measures the emptier batch, not the feature):

- ``json``: the schema, ``on_budget="cut"`` (no budget check);
- ``json+close``: ``on_budget="close"`` (the budget check: each step asks whether the end is near);
- ``stream`` / ``stream+partials``: 16 streams, reading only the deltas / also the typed partial
  value after each delta (``TextStream.partial``);
- ``tag``: a structural tag around the same schema: free text in which a code fence ("```", which
  SmolLM2 writes unasked in about half of these answers) must open a JSON block under the schema
  (``` ```json\n`` … ``\n``` ``), at least one, ending at the first; ``tag+close``: the same with
  ``on_budget="close"`` (the default for a grammar: rows that never wrote the fence close by
  writing one, each closing step searching for endings);
- ``text``: the same prompts with no constraint (the control for ``tag``: rows that never write
  the fence run free text to ``max_tokens``, so they hold more and later tokens than a JSON answer,
  and their forwards cost more per token whatever the constraint);
- ``think16``: the same schema after a forced thought of 16 tokens (``reasoning=``).

Beside wall time, each round records the engine's forwards and their time, so the table also gives
the host work per row and step (wall less forward time, over the rows stepped): what the feature's
constraint work adds to a step, apart from how long the answers run.

    .venv/bin/python -m benchmarks feature-cost --rounds 5 --json benchmarks/results/feature_cost.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cdsl_struct import Reasoning, StructuralTag, Tag
from cdsl_struct.api import Generator
from cdsl_struct.bench import write_report
from cdsl_struct.bench.overhead import machine_info

from .extraction_tasks import family_tasks

SETTINGS = ("json", "json+close", "stream", "stream+partials", "tag", "tag+close", "text", "think16")

#: the structural tag of the ``tag`` setting, around a task's schema
FENCE = "```"


def fenced_json(schema: Any) -> StructuralTag:
    """A code fence that must hold JSON under ``schema`` (trigger "```"), at least one, ending there."""
    return StructuralTag([Tag(FENCE + "json\n", schema, "\n" + FENCE)], triggers=[FENCE], at_least_one=True,
                         stop_after_first=True)


def _one(gen: Generator, task: Any, setting: str, max_tokens: int) -> int:
    """Answer ``task`` in ``setting``; the tokens generated."""
    asked: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0}
    if setting.startswith("tag"):
        on_budget = "close" if setting == "tag+close" else "cut"
        return len(gen.generate(task.prompt, grammar=fenced_json(task.constraint), on_budget=on_budget, **asked).tokens)
    if setting == "text":
        return len(gen.generate(task.prompt, **asked).tokens)
    asked["schema"] = task.constraint
    if setting == "think16":
        asked["reasoning"] = Reasoning(budget=16, required=True)
        asked["max_tokens"] += 16 + 8
    if setting.startswith("stream"):
        with gen.stream(task.prompt, on_budget="cut", **asked) as stream:
            for _ in stream:
                if setting == "stream+partials":
                    _ = stream.partial
            return len(stream.result.tokens)
    return len(gen.generate(task.prompt, on_budget="close" if setting == "json+close" else "cut", **asked).tokens)


def run_feature_cost(rounds: int, rows: int, max_tokens: int, settings: tuple[str, ...],
                      requests: int | None = None, device: str = "auto", warm_rounds: int = 0) -> dict[str, Any]:
    """Per round and setting: wall seconds, tokens, and the engine's forward seconds, steps and rows
    stepped, of ``requests`` answers (default: ``rows``) sent by ``rows`` clients, each sending its
    next request when its answer arrives (one setting runs at a time, so the engine's counters over
    a round are that setting's). ``warm_rounds``: whole rounds run first and not measured (on a GPU
    the first batches of each shape pay for kernel selection)."""
    gen = Generator("smollm2", max_batch_size=rows, device=device)
    tasks = family_tasks("tune", requests or rows)
    try:
        for setting in settings:  # warm: compiles, first-use mask tables
            _one(gen, tasks[0], setting, max_tokens)
        measured: dict[str, list[dict[str, float]]] = {s: [] for s in settings}
        stats = gen.engine.stats
        with ThreadPoolExecutor(rows) as pool:
            for number in range(-warm_rounds, rounds):
                order = list(settings[number % len(settings):] + settings[:number % len(settings)])
                for setting in order:
                    before = (stats.forward_seconds, stats.steps, stats.rows_stepped)
                    start = time.perf_counter()
                    tokens = sum(pool.map(lambda t, s=setting: _one(gen, t, s, max_tokens), tasks))
                    wall = time.perf_counter() - start
                    if number < 0:
                        continue
                    measured[setting].append({"wall": wall, "tokens": tokens,
                                              "forward": stats.forward_seconds - before[0],
                                              "steps": stats.steps - before[1],
                                              "rows_stepped": stats.rows_stepped - before[2]})
    finally:
        gen.close()
    return measured


def summarize(measured: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per setting: ms per token and its ratio to ``json`` in the same round (median, min, max);
    host ms per row and step (wall less forward time, over the rows stepped; median) and row
    forwards per generated token (below 1 where forced tokens ride along)."""
    base = [run["wall"] / max(run["tokens"], 1) for run in measured["json"]]
    table = {}
    for setting, runs in measured.items():
        per_token = [run["wall"] / max(run["tokens"], 1) for run in runs]
        ratios = [p / b for p, b in zip(per_token, base, strict=True)]
        host = [(run["wall"] - run["forward"]) / run["rows_stepped"] for run in runs if run.get("rows_stepped")]
        table[setting] = {"ms_per_token": round(1000 * statistics.median(per_token), 3),
                          "tokens_per_round": round(statistics.mean(run["tokens"] for run in runs), 1),
                          "ratio_to_json": round(statistics.median(ratios), 3),
                          "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                          "host_ms_per_row_step": round(1000 * statistics.median(host), 3) if host else None,
                          "row_forwards_per_token": round(sum(run.get("rows_stepped", 0) for run in runs)
                                                          / max(1, sum(run["tokens"] for run in runs)), 3)}
    return table


def format_table(table: dict[str, Any]) -> str:
    lines = ["| setting | ms / token | tokens / round | vs json (median) | range | host ms / row-step "
             "| row forwards / token |", "|---|---:|---:|---:|---|---:|---:|"]
    for name, row in table.items():
        low, high = row["ratio_range"]
        lines.append(f"| {name} | {row['ms_per_token']} | {row['tokens_per_round']} | {row['ratio_to_json']}x "
                     f"| {low}-{high} | {row['host_ms_per_row_step']} | {row['row_forwards_per_token']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The harness's options."""
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every setting")
    parser.add_argument("--rows", type=int, default=16, help="answers decoded together")
    parser.add_argument("--requests", type=int, default=None,
                        help="answers per setting and round, sent by --rows clients one after another (default "
                             "--rows: every answer at once; more keeps the batch full where answers differ in length)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}"
                                                                        " (json is always run)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--warm-rounds", type=int, default=0, help="rounds run first and not measured")
    parser.add_argument("--json", dest="json_out", help="write the measurements and the table here")


def run(args: argparse.Namespace) -> int:
    """Run from parsed arguments; print the table."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    chosen = tuple(s for s in args.settings.split(",") if s)
    unknown = set(chosen) - set(SETTINGS)
    if unknown:
        raise SystemExit(f"unknown settings {sorted(unknown)}; known: {', '.join(SETTINGS)}")
    settings = ("json", *[s for s in chosen if s != "json"])
    measured = run_feature_cost(args.rounds, args.rows, args.max_tokens, settings, args.requests, args.device,
                                args.warm_rounds)
    table = summarize(measured)
    config = {k: v for k, v in vars(args).items() if k not in ("run", "json_out")}
    return write_report({"config": config, "machine": machine_info(), "rounds": measured, "summary": table},
                        format_table(table), args)
