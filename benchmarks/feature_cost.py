"""What a feature costs per token at 16 rows, side by side with plain JSON (issues 39 and 40).

Sixteen extraction tasks of ``python -m benchmarks quality``'s families are answered together (16
rows of one batched engine) in each setting, the settings interleaved round by round (the order
rotating) so a noisy machine slows them alike; the figure is wall time per generated token, as a
ratio to plain JSON in the same round (median and range over rounds):

- ``json``: the schema, ``on_budget="cut"`` (no budget check);
- ``json+close``: ``on_budget="close"`` (the budget check: each step asks whether the end is near);
- ``stream`` / ``stream+partials``: 16 streams, reading only the deltas / also the typed partial
  value after each delta (``TextStream.partial``);
- ``tag``: a structural tag around the same schema (``<answer>`` … ``</answer>`` after free text,
  at least one, ending at the first);
- ``think16``: the same schema after a forced thought of 16 tokens (``reasoning=``).

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

SETTINGS = ("json", "json+close", "stream", "stream+partials", "tag", "think16")


def _one(gen: Generator, task: Any, setting: str, max_tokens: int) -> int:
    """Answer ``task`` in ``setting``; the tokens generated."""
    asked: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0}
    if setting == "tag":
        tag = StructuralTag([Tag("<answer>", task.constraint, "</answer>")], at_least_one=True, stop_after_first=True)
        return len(gen.generate(task.prompt + " Answer inside <answer></answer>.", grammar=tag, **asked).tokens)
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


def run_feature_cost(rounds: int, rows: int, max_tokens: int, settings: tuple[str, ...]) -> dict[str, Any]:
    """Per round and setting: wall seconds and tokens of ``rows`` concurrent answers."""
    gen = Generator("smollm2", max_batch_size=rows)
    tasks = family_tasks("tune", rows)
    try:
        for setting in settings:  # warm: compiles, first-use mask tables
            _one(gen, tasks[0], setting, max_tokens)
        measured: dict[str, list[tuple[float, int]]] = {s: [] for s in settings}
        with ThreadPoolExecutor(rows) as pool:
            for number in range(rounds):
                order = list(settings[number % len(settings):] + settings[:number % len(settings)])
                for setting in order:
                    start = time.perf_counter()
                    tokens = sum(pool.map(lambda t, s=setting: _one(gen, t, s, max_tokens), tasks))
                    measured[setting].append((time.perf_counter() - start, tokens))
    finally:
        gen.close()
    return measured


def summarize(measured: dict[str, list[tuple[float, int]]]) -> dict[str, Any]:
    """ms per token per setting, and its ratio to ``json`` in the same round (median, min, max)."""
    base = [wall / max(tokens, 1) for wall, tokens in measured["json"]]
    table = {}
    for setting, runs in measured.items():
        per_token = [wall / max(tokens, 1) for wall, tokens in runs]
        ratios = [p / b for p, b in zip(per_token, base, strict=True)]
        table[setting] = {"ms_per_token": round(1000 * statistics.median(per_token), 3),
                          "tokens_per_round": round(statistics.mean(t for _, t in runs), 1),
                          "ratio_to_json": round(statistics.median(ratios), 3),
                          "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)]}
    return table


def format_table(table: dict[str, Any]) -> str:
    lines = ["| setting | ms / token | tokens / round | vs json (median) | range |", "|---|---:|---:|---:|---|"]
    for name, row in table.items():
        low, high = row["ratio_range"]
        lines.append(f"| {name} | {row['ms_per_token']} | {row['tokens_per_round']} | {row['ratio_to_json']}x "
                     f"| {low}-{high} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The harness's options."""
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every setting")
    parser.add_argument("--rows", type=int, default=16, help="answers decoded together")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}"
                                                                        " (json is always run)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
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
    measured = run_feature_cost(args.rounds, args.rows, args.max_tokens, settings)
    table = summarize(measured)
    config = {k: v for k, v in vars(args).items() if k not in ("run", "json_out")}
    return write_report({"config": config, "machine": machine_info(), "rounds": measured, "summary": table},
                        format_table(table), args)
