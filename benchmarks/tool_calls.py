"""``python -m benchmarks tools``: tool calls with schemas as clients write them (no
``additionalProperties``), decoded with objects closed to undeclared keys (the default) and
exactly as given (``extra_properties=True``), each with parallel calls allowed (OpenAI's default)
and with one call only, side by side in one run.

Each request asks for one call (``tool_choice="required"``) of one of a few everyday tools whose
parameters schemas look like LangChain ``@tool`` / MCP schemas. Reported per setting: calls
completed, calls lost to ``max_tokens``, calls with keys their schema does not declare, mean
tokens and wall time.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from typing import Any

from cdsl_struct.bench import write_report

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"type": "string"}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Find flights between two cities.",
                                      "parameters": {"type": "object", "properties": {
                                          "origin": {"type": "string"}, "destination": {"type": "string"},
                                          "date": {"type": "string"}}, "required": ["origin", "destination"]}}},
    {"type": "function", "function": {"name": "create_event", "description": "Add an event to the calendar.",
                                      "parameters": {"type": "object", "properties": {
                                          "title": {"type": "string"}, "day": {"type": "string"},
                                          "attendees": {"type": "array", "items": {"type": "string"}}},
                                          "required": ["title", "day"]}}},
]
REQUESTS = [
    "What's the weather like in Lisbon today? Give me all the details you can.",
    "Find me a flight from Berlin to Rome next Friday, window seat, vegetarian meal, cheapest fare.",
    "Put 'Team lunch' in my calendar on Tuesday with Ana and Raj, at noon, in the usual place.",
    "Is it raining in Tokyo? Also tell me the humidity and wind.",
    "Book a flight from Paris to Oslo on March 3rd for two adults, economy, with a checked bag.",
    "Schedule a dentist appointment on Monday morning and remind me the day before.",
    "How cold is it in Montreal right now, in Fahrenheit, and what should I wear?",
    "Flights from Madrid to Lima in June, no more than one stop, under 900 euros.",
]


@dataclass
class ToolBenchConfig:
    """How many requests and tokens."""

    model: str = "smollm2"
    requests: int = 8
    max_tokens: int = 64


def run_tool_bench(config: ToolBenchConfig, loaded: Any = None) -> dict[str, Any]:
    """Both settings over the same requests; rows and a summary per setting."""
    from cdsl_struct.api import Generator
    from cdsl_struct.models import load_model

    loaded = loaded or load_model(config.model)
    prompts = [REQUESTS[i % len(REQUESTS)] for i in range(config.requests)]
    summary, rows = {}, []
    settings = [(f"{objects}, {calls}", extra, parallel)
                for objects, extra in (("closed (default)", False), ("as given", True))
                for calls, parallel in (("parallel calls (default)", True), ("one call", False))]
    for name, extra, parallel in settings:
        generator = Generator(loaded, draft="auto", extra_properties=extra)
        options = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": parallel}
        try:
            generator.generate(prompts[0], max_tokens=8, **options)  # compile, warm
            started = time.perf_counter()
            results = generator.generate_batch(prompts, max_tokens=config.max_tokens, **options)
            wall = time.perf_counter() - started
        finally:
            generator.close()
        for prompt, result in zip(prompts, results, strict=True):
            undeclared = sum(1 for call in result.tool_calls if call.arguments is not None and
                             set(call.arguments) - set(_declared(call.name)))
            rows.append({"setting": name, "prompt": prompt, "finish_reason": result.finish_reason,
                         "calls": [call.to_openai()["function"] for call in result.tool_calls],
                         "undeclared_keys": undeclared, "tokens": len(result.tokens)})
        mine = [r for r in rows if r["setting"] == name]
        summary[name] = {"requests": len(mine), "complete": sum(r["finish_reason"] == "stop" for r in mine),
                         "lost_to_max_tokens": sum(r["finish_reason"] == "length" for r in mine),
                         "calls_with_undeclared_keys": sum(r["undeclared_keys"] > 0 for r in mine),
                         "mean_tokens": round(sum(r["tokens"] for r in mine) / len(mine), 1),
                         "wall_s": round(wall, 2)}
    return {"config": asdict(config), "summary": summary, "rows": rows}


def _declared(name: str) -> list[str]:
    tool = next(t for t in TOOLS if t["function"]["name"] == name)
    return list(tool["function"]["parameters"]["properties"])


def format_tool_table(report: dict[str, Any]) -> str:
    """The settings as a markdown table."""
    lines = ["| objects, calls | requests | complete calls | lost to max_tokens | calls with undeclared keys "
             "| mean tokens | wall s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in report["summary"].items():
        lines.append(f"| {name} | {s['requests']} | {s['complete']} | {s['lost_to_max_tokens']} | "
                     f"{s['calls_with_undeclared_keys']} | {s['mean_tokens']} | {s['wall_s']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks tools``'s options."""
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", dest="json_out", help="write rows and summary here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    report = run_tool_bench(ToolBenchConfig(model=args.model, requests=args.requests, max_tokens=args.max_tokens))
    return write_report(report, format_tool_table(report), args)
