"""``python -m benchmarks request-latency``: what one request at a time takes on a ``Generator`` at its defaults.

README's keyword example, a three-field JSON object and free text, each called once to warm up and then
``--repeats`` times; per case the median seconds and the tokens written. Made for A/B runs of two trees
(the same command in each, alternating): every request goes through the public ``Generator``, so what
the library does on the caller's thread, at load and per request, is in the figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from cdsl_struct.api import Generator
from cdsl_struct.bench import write_report

PERSON = {"type": "object", "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}


def run_request_latency(model: str, repeats: int) -> dict[str, Any]:
    """The report: per case, the median seconds a request and the tokens of the last answer."""
    gen = Generator(model)
    cases = {
        "keywords": lambda: gen.generate("Write a sentence.", keywords=["dog", "ride", "walk"], max_tokens=32),
        "json": lambda: gen.generate("Describe a person.", schema=PERSON, max_tokens=48),
        "text": lambda: gen.generate("Tell me about the sea.", max_tokens=48),
    }
    rows = {}
    try:
        for name, call in cases.items():
            call()
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                result = call()
                seconds.append(time.perf_counter() - started)
            rows[name] = {"median_s": round(statistics.median(seconds), 4), "tokens": len(result.tokens)}
    finally:
        gen.close()
    return {"config": {"model": model, "repeats": repeats}, "cases": rows, "summary": {}}


def format_latency_table(report: dict[str, Any]) -> str:
    lines = ["| case | median s | tokens |", "|---|---:|---:|"]
    lines += [f"| {name} | {row['median_s']} | {row['tokens']} |" for name, row in report["cases"].items()]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks request-latency``'s options."""
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case, after one warm-up call")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    report = run_request_latency(args.model, args.repeats)
    return write_report(report, format_latency_table(report), args)
