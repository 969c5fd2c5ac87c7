"""``cdsl-struct bench ...``: what users run against their own deployment (``serve``, ``throughput``,
``maskbench``, ``overhead``), each module with its ``add_arguments(parser)`` and ``run(args)``. The
research harnesses live in the repository's ``benchmarks/`` (``python -m benchmarks``), not in the wheel.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HARNESSES: dict[str, tuple[str, str]] = {
    "maskbench": (f"{__name__}.maskbench", "JSONSchemaBench/MaskBench: compile + mask correctness and speed"),
    "overhead": (f"{__name__}.overhead", "the engine's host time per step, by phase, with a near-zero-cost model"),
    "throughput": (f"{__name__}.throughput", "batched engine: tokens/s, latency and batch invariance by batch size"),
    "serve": (f"{__name__}.serve", "json_schema chat requests against any OpenAI-compatible server"),
}
"""``cdsl-struct bench <name>``: the module that runs it and its help line."""


def register(commands: Any, harnesses: dict[str, tuple[str, str]], argv: Sequence[str], prog: str) -> None:
    """One sub-parser of ``commands`` per harness; only the one ``argv[0]`` names imports its module, adds
    its arguments and sets ``args.run`` and ``args.prog`` (the command's prefix, for the report)."""
    for name, (module, help) in harnesses.items():
        parser = commands.add_parser(name, help=help, description=help)
        if argv[:1] == [name]:
            harness = importlib.import_module(module)
            harness.add_arguments(parser)
            parser.set_defaults(run=harness.run, prog=prog)


def write_report(report: dict[str, Any], table: str, args: argparse.Namespace) -> int:
    """Print a bench's ``table``; write its ``report`` (with the command that made it) as JSON to
    ``args.json_out`` when given. The exit code, 0."""
    report["summary"]["command"] = f"{getattr(args, 'prog', 'cdsl-struct')} " + " ".join(sys.argv[1:])
    print(table)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0
