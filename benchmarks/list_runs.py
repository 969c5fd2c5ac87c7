"""``python -m benchmarks list-runs``: do JSON lists of records end, or go round to ``max_tokens``?

Lists asked for as JSON, their items objects (the planets and their moons, countries and their
capitals, the Beatles and their instruments): a small model may write the same records again and
again (SmolLM2: ``{"name": "Uranus", ...}, {"name": "Neptune", ...}, {"name": "Pluto", ...},
{"name": "Uranus", ...`` to ``max_tokens``). The string guard (``decoding.strings``) ends an array once
``REPEATED_ITEMS`` of its items repeat earlier ones; it runs on and off over the same requests, side by
side in one process. Reported per setting: answers finished, cut by ``max_tokens`` (and of those, closed
validly by the budget closer), valid, going round (an array with three records or more that repeat
earlier ones), records an answer, and tokens. No record is judged right or wrong.

The tasks split by a hash of their text into ``tune`` and ``report`` (DESIGN.md, "Evaluation
protocol").
"""

from __future__ import annotations

import argparse
import json
import re
import zlib
from dataclasses import asdict, dataclass
from typing import Any

from .number_runs import add_guard_arguments, decode_settings, finished_and_cut, run_guard_bench

TEMPLATES = ("List the {} as JSON.", "Give me the {} as a JSON list.", "What are the {}? Answer in JSON.")
#: (subject, the record's fields after ``name``)
SUBJECTS = [
    ("planets of the solar system and their moons", {"moons": "integer"}),
    ("countries of Europe and their capitals", {"capital": "string"}),
    ("members of the Beatles and their instruments", {"instrument": "string"}),
    ("programming languages and the year each appeared", {"year": "integer"}),
    ("largest cities in Asia and their populations", {"population": "integer"}),
    ("longest rivers of Africa and their lengths in km", {"length_km": "integer"}),
    ("Harry Potter books and their years", {"year": "integer"}),
    ("colors of the rainbow and their hex codes", {"hex": "string"}),
    ("continents and their largest countries", {"largest_country": "string"}),
    ("oceans and their areas", {"area_km2": "number"}),
    ("plays of Shakespeare and their genres", {"genre": "string"}),
    ("dog breeds and their sizes", {"size": "string"}),
    ("famous painters and their best-known works", {"work": "string"}),
    ("musical instruments and their families", {"family": "string"}),
    ("days of the week and one thing to do on each", {"activity": "string"}),
    ("ingredients of a pancake recipe and their amounts", {"amount": "string"}),
    ("US states and their capitals", {"capital": "string"}),
    ("Olympic sports and the number of players on a team", {"players": "integer"}),
    ("elements of the periodic table and their symbols", {"symbol": "string"}),
    ("car makers and their home countries", {"country": "string"}),
]
GOING_ROUND = 3
"""Records of one array that repeat earlier ones, from which an answer counts as going round."""


@dataclass(frozen=True)
class Task:
    prompt: str
    schema: dict[str, Any]


def _schema(fields: dict[str, str]) -> dict[str, Any]:
    record = {"type": "object", "properties": {"name": {"type": "string"},
                                               **{name: {"type": kind} for name, kind in fields.items()}},
              "required": ["name", *fields], "additionalProperties": False}
    return {"type": "object", "properties": {"items": {"type": "array", "items": record}}, "required": ["items"],
            "additionalProperties": False}


def tasks(split: str, count: int) -> list[Task]:
    """The first ``count`` tasks of ``split``: every subject under every template, split by a hash of the
    prompt."""
    chosen = []
    for subject, fields in SUBJECTS:
        for template in TEMPLATES:
            prompt = template.format(subject)
            if (zlib.crc32(prompt.encode()) % 2 == 0) == (split == "tune"):
                chosen.append(Task(prompt, _schema(fields)))
    return chosen[:count]


def records(text: str) -> tuple[int, int]:
    """A JSON answer's records (the objects of its arrays) and, in the array with the most, how many
    repeat an earlier one of it (the same fields and values, the names' case aside). An answer cut short
    is read as one array of the records it finished (objects holding no other)."""
    try:
        arrays = _arrays(json.loads(text))
    except ValueError:
        arrays = [[json.loads(raw) for raw in _FLAT_OBJECT.findall(text) if _is_json(raw)]]
    counts = [[json.dumps(item, sort_keys=True).lower() for item in array if isinstance(item, dict)]
              for array in arrays]
    return sum(map(len, counts)), max((len(keys) - len(set(keys)) for keys in counts), default=0)


_FLAT_OBJECT = re.compile(r"\{[^{}]*\}")


def _is_json(raw: str) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _arrays(node: Any) -> list[list[Any]]:
    """Every array in a JSON value, outer ones first."""
    if isinstance(node, dict):
        return [array for item in node.values() for array in _arrays(item)]
    if isinstance(node, list):
        return [node, *(array for item in node for array in _arrays(item))]
    return []


@dataclass(frozen=True)
class ListRunsConfig:
    model: str = "smollm2"
    split: str = "tune"
    tasks: int = 30
    max_tokens: int = 200
    settings: tuple[str, ...] = ("guard", "noguard")


def run_list_runs(config: ListRunsConfig, loaded: Any = None) -> dict[str, Any]:
    """Each setting over the same tasks, one request at a time; the report."""
    rows, summary, chosen = [], {}, tasks(config.split, config.tasks)
    for setting, results, wall in decode_settings(config, chosen, loaded):
        mine = []
        for task, result in zip(chosen, results, strict=True):
            count, repeated = records(result.text)
            mine.append({"setting": setting, "prompt": task.prompt, "text": result.text,
                         "finish_reason": result.finish_reason, "tokens": len(result.tokens), "records": count,
                         "repeated": repeated, "closed": result.closed_by_budget, "complete": result.complete})
        rows += mine
        size = max(len(mine), 1)
        summary[setting] = {**finished_and_cut(mine), "closed": sum(r["closed"] for r in mine),
                            "complete": sum(r["complete"] for r in mine),
                            "going_round": sum(r["repeated"] >= GOING_ROUND for r in mine),
                            "mean_records": round(sum(r["records"] for r in mine) / size, 1),
                            "mean_tokens": round(sum(r["tokens"] for r in mine) / size, 1), "wall_s": round(wall, 2)}
    return {"config": asdict(config), "summary": summary, "rows": rows}


def format_table(report: dict[str, Any]) -> str:
    """The settings as a markdown table."""
    lines = [f"| setting | tasks | finished | cut | of those closed | valid | going round ({GOING_ROUND}+ repeats) | "
             "records | mean tokens | wall s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in report["summary"].items():
        lines.append(f"| {name} | {s['tasks']} | {s['finished']} | {s['cut']} | {s['closed']} | {s['complete']} | "
                     f"{s['going_round']} | "
                     f"{s['mean_records']} | {s['mean_tokens']} | {s['wall_s']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks list-runs``'s options."""
    add_guard_arguments(parser, tasks=30, max_tokens=200)


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    return run_guard_bench(args, ListRunsConfig, run_list_runs, format_table)
