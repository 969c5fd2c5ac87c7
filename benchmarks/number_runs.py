"""``python -m benchmarks number-runs``: do JSON answers with numbers end, or run on in digits?

Facts asked for as JSON whose schemas leave the numbers unbounded, as most do (a city's
population, a planet's mass, a company's revenue, a product's weight): a small model may write a
number as a run of digits to ``max_tokens`` (SmolLM2: ``"population": 1111111100000000111...``).
The string guard (``decoding.strings``) ends a number past ``MAX_NUMBER_DIGITS`` digits; it runs on
and off over the same requests, side by side in one process. Reported per setting: answers finished,
cut by ``max_tokens``, holding a number of more digits than the guard allows, and their tokens. No
value is judged right or wrong: the model does not know these facts.

The tasks split by a hash of their text into ``tune`` and ``report`` (DESIGN.md, "Evaluation
protocol").
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Any

from cdsl_struct.bench import write_report


def _object(**fields: str) -> dict[str, Any]:
    return {"type": "object", "properties": {name: {"type": kind} for name, kind in fields.items()},
            "required": list(fields), "additionalProperties": False}


FAMILIES = {
    "city": ("Tell me about {} as JSON.", _object(name="string", country="string", population="integer",
                                                   area_km2="number"),
             ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Mumbai", "Toronto", "Nairobi", "Hanoi", "Quito",
              "Perth", "Dublin", "Seoul", "Denver", "Athens", "Warsaw", "Zurich", "Osaka", "Madrid"]),
    "planet": ("Give the facts about {} as JSON.", _object(name="string", distance_km="integer", mass_kg="number",
                                                            moons="integer"),
               ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune", "Pluto", "the Moon",
                "Ceres", "Titan", "Europa", "Io", "Ganymede", "Callisto", "Eris", "Phobos", "Deimos", "Triton"]),
    "company": ("Describe the company {} as JSON.", _object(name="string", founded="integer", employees="integer",
                                                             revenue_usd="number"),
                ["Apple", "Toyota", "Siemens", "Nestle", "Samsung", "Shell", "Unilever", "Intel", "Nike", "Sony",
                 "Boeing", "Pfizer", "Ikea", "Lego", "Nokia", "Honda", "Adidas", "Spotify", "Airbus", "Visa"]),
    "product": ("Give the product data of a {} as JSON.", _object(product="string", price="number",
                                                                   weight_g="integer", stock="integer"),
                ["laptop", "bicycle", "kettle", "phone", "desk lamp", "guitar", "camera", "sofa", "toaster", "drone",
                 "backpack", "printer", "blender", "tent", "monitor", "watch", "scooter", "microwave", "piano",
                 "headset"]),
}
#: more digits than the guard lets a number have (``decoding.strings.MAX_NUMBER_DIGITS``)
RUN_DIGITS = 19


@dataclass(frozen=True)
class Task:
    family: str
    prompt: str
    schema: dict[str, Any]


def tasks(split: str, count: int) -> list[Task]:
    """The first ``count`` tasks of ``split``: every family's subjects, split by a hash of the prompt."""
    chosen = []
    for family, (template, schema, subjects) in FAMILIES.items():
        for subject in subjects:
            prompt = template.format(subject)
            if (zlib.crc32(prompt.encode()) % 2 == 0) == (split == "tune"):
                chosen.append(Task(family, prompt, schema))
    return chosen[:count]


def longest_number(text: str) -> int:
    """The most digits of any number in a JSON text (its numbers, not its strings' digits); 0 for none."""
    def digits(value: Any) -> int:
        if isinstance(value, bool):
            return 0
        if isinstance(value, (int, float)):
            return sum(ch.isdigit() for ch in repr(value))
        if isinstance(value, dict):
            return max(map(digits, value.values()), default=0)
        if isinstance(value, list):
            return max(map(digits, value), default=0)
        return 0
    try:
        return digits(json.loads(text, parse_float=lambda raw: _Raw(raw)))
    except ValueError:
        return 0


class _Raw(float):
    """A JSON float that keeps its text, so that its digits are counted as written."""

    def __new__(cls, raw: str) -> _Raw:
        number = super().__new__(cls, float(raw))
        number.raw = raw
        return number

    def __repr__(self) -> str:
        return self.raw


@dataclass(frozen=True)
class NumberRunsConfig:
    model: str = "smollm2"
    split: str = "tune"
    tasks: int = 40
    max_tokens: int = 80
    settings: tuple[str, ...] = ("guard", "noguard")


def run_number_runs(config: NumberRunsConfig, loaded: Any = None) -> dict[str, Any]:
    """Each setting over the same tasks, one request at a time (no batch, so the two differ by the guard
    alone); the report."""
    rows, summary, chosen = [], {}, tasks(config.split, config.tasks)
    for setting, results, wall in decode_settings(config, chosen, loaded):
        mine = [{"setting": setting, "family": task.family, "prompt": task.prompt, "text": result.text,
                 "finish_reason": result.finish_reason, "tokens": len(result.tokens),
                 "digits": longest_number(result.text)} for task, result in zip(chosen, results, strict=True)]
        rows += mine
        summary[setting] = {**finished_and_cut(mine), "runs": sum(r["digits"] >= RUN_DIGITS for r in mine),
                            "mean_tokens": round(sum(r["tokens"] for r in mine) / max(len(mine), 1), 1),
                            "wall_s": round(wall, 2)}
    return {"config": asdict(config), "summary": summary, "rows": rows}


def decode_settings(config: Any, chosen: list[Any], loaded: Any = None) -> list[tuple[str, list[Any], float]]:
    """``(setting, results, wall)`` for each of ``config.settings`` (``guard``: the string guard on),
    every task (``prompt``, ``schema``) one request at a time."""
    from cdsl_struct.api import Generator
    from cdsl_struct.models import load_model

    loaded = loaded or load_model(config.model)
    runs = []
    for setting in config.settings:
        generator = Generator(loaded, draft=None, string_guard=setting == "guard")
        try:
            started = time.perf_counter()
            results = [generator.generate(task.prompt, schema=task.schema, max_tokens=config.max_tokens)
                       for task in chosen]
            runs.append((setting, results, time.perf_counter() - started))
        finally:
            generator.close()
    return runs


def finished_and_cut(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Tasks, answers finished and answers cut by ``max_tokens`` among ``rows``."""
    return {"tasks": len(rows), "finished": sum(r["finish_reason"] == "stop" for r in rows),
            "cut": sum(r["finish_reason"] == "length" for r in rows)}


def format_table(report: dict[str, Any]) -> str:
    """The settings as a markdown table."""
    lines = [f"| setting | tasks | finished | cut | numbers of {RUN_DIGITS}+ digits | mean tokens | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in report["summary"].items():
        lines.append(f"| {name} | {s['tasks']} | {s['finished']} | {s['cut']} | {s['runs']} | {s['mean_tokens']} | "
                     f"{s['wall_s']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks number-runs``'s options."""
    add_guard_arguments(parser, tasks=40, max_tokens=80)


def add_guard_arguments(parser: argparse.ArgumentParser, tasks: int, max_tokens: int) -> None:
    """The options of a bench that runs the string guard on and off over a split's tasks."""
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--split", choices=("tune", "report"), default="tune")
    parser.add_argument("--tasks", type=int, default=tasks)
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    parser.add_argument("--settings", default="guard,noguard", help="comma-separated: guard, noguard")
    parser.add_argument("--json", dest="json_out", help="write rows and summary here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    return run_guard_bench(args, NumberRunsConfig, run_number_runs, format_table)


def run_guard_bench(args: argparse.Namespace, config_type: Any, run_bench: Any, table: Any) -> int:
    """Build ``config_type`` from ``add_guard_arguments``' options, run ``run_bench`` with it, print ``table``
    of the report and write it."""
    config = config_type(model=args.model, split=args.split, tasks=args.tasks, max_tokens=args.max_tokens,
                         settings=tuple(args.settings.split(",")))
    report = run_bench(config)
    return write_report(report, table(report), args)
