"""``python -m benchmarks tool-args``: are a tool call's arguments the ones the request gave?

Everyday requests to four tools (weather, email, flights, calendar), each built from a phrasing and
values whose right arguments are known (a city, an address, a date, a title), with the string guard
(``decoding.strings``) on and off over the same requests, side by side in one process. Reported per
setting: calls complete, cut by ``max_tokens``, arguments that swallowed the call's own syntax (a
bracket, ``</tool_call>``, a second call's marker inside a string value), the right tool, and the
share of known arguments written exactly.

The tasks split by a hash of their text into ``tune`` and ``report`` (DESIGN.md, "Evaluation
protocol"): look at ``tune`` while changing decoding, quote ``report``.
"""

from __future__ import annotations

import argparse
import random
import re
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Any

from cdsl_struct.bench import write_report

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "send_email", "description": "Send an email.",
                                      "parameters": {"type": "object", "properties": {
                                          "to": {"type": "string", "description": "the recipient's address"},
                                          "subject": {"type": "string"}, "body": {"type": "string"}},
                                          "required": ["to", "subject", "body"]}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Find flights between two cities.",
                                      "parameters": {"type": "object", "properties": {
                                          "origin": {"type": "string"}, "destination": {"type": "string"},
                                          "date": {"type": "string", "description": "YYYY-MM-DD"}},
                                          "required": ["origin", "destination", "date"]}}},
    {"type": "function", "function": {"name": "create_event", "description": "Add an event to the calendar.",
                                      "parameters": {"type": "object", "properties": {
                                          "title": {"type": "string"}, "day": {"type": "string"},
                                          "attendees": {"type": "array", "items": {"type": "string"}}},
                                          "required": ["title", "day"]}}},
]

CITIES = ["Lisbon", "Nairobi", "Oslo", "Lagos", "Osaka", "Denver", "Perth", "Dublin", "Cairo", "Seoul", "Lima",
          "Quito", "Hanoi", "Zurich", "Warsaw", "Athens", "New York", "Buenos Aires", "Cape Town", "Kuala Lumpur",
          "San Francisco", "Mexico City", "Hong Kong", "Rio de Janeiro"]
PEOPLE = [("Ana", "ana.silva@example.com"), ("Raj", "raj@corp.io"), ("Tom", "tom@x.org"),
          ("Mei", "mei.chen@uni.edu"), ("Olu", "olu.ade@mail.ng"), ("Sara", "sara.k@firm.de"),
          ("Liam", "liam@startup.dev"), ("Yuki", "yuki.t@example.jp"), ("Omar", "omar.f@agency.co"),
          ("Eva", "eva@home.net"), ("Ben", "ben.r@school.org"), ("Ines", "ines.m@clinic.pt")]
SUBJECTS = ["budget review", "lunch on Friday", "the quarterly report", "server outage", "holiday plans",
            "new contract", "team offsite", "invoice 4471"]
MESSAGES = ["the meeting moved to 3pm", "the report is late", "I will be out tomorrow", "the demo went well",
            "we need the slides by noon", "thanks for your help"]
TITLES = ["Team lunch", "Dentist", "Project kickoff", "Yoga class", "Budget review", "Piano lesson",
          "Client call", "Book club"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

# (tool, phrasing, the arguments it gives): slots {city} {unit} {a} {b} {date} {name} {email} {subject}
# {message} {title} {day} {n1} {n2}
PHRASINGS = [
    ("get_weather", "What's the weather in {city}?", ("city",)),
    ("get_weather", "Is it raining in {city} right now?", ("city",)),
    ("get_weather", "How warm is it in {city} today, in {unit}?", ("city", "unit")),
    ("get_weather", "Weather for {city}, {unit} please.", ("city", "unit")),
    ("get_weather", "I'm flying to {city} tomorrow. What will the weather be like there?", ("city",)),
    ("send_email", "Email {email} that {message}.", ("to",)),
    ("send_email", "Send {name} ({email}) a note with the subject '{subject}' saying {message}.", ("to", "subject")),
    ("send_email", "Write to {email}, subject '{subject}': {message}.", ("to", "subject")),
    ("send_email", "Let {name} know at {email} that {message}.", ("to",)),
    ("search_flights", "Find flights from {a} to {b} on {date}.", ("origin", "destination", "date")),
    ("search_flights", "I need to fly {a} to {b}, leaving {date}.", ("origin", "destination", "date")),
    ("search_flights", "Any flights {a} -> {b} on {date}?", ("origin", "destination", "date")),
    ("search_flights", "Book me something from {a} to {b} for {date}, economy.", ("origin", "destination", "date")),
    ("create_event", "Add '{title}' to my calendar on {day}.", ("title", "day")),
    ("create_event", "Put {title} on {day} with {n1} and {n2}.", ("title", "day", "attendees")),
    ("create_event", "Schedule {title} for {day}.", ("title", "day")),
]
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)(?:"|$)')


@dataclass(frozen=True)
class ToolTask:
    """One request and the call it asks for."""

    prompt: str
    tool: str
    expected: dict[str, Any]


def tasks(split: str, count: int, seed: int = 0) -> list[ToolTask]:
    """``count`` tasks of ``split`` (``tune`` or ``report``, by a hash of the prompt), the same each run."""
    rng = random.Random(seed)
    found: list[ToolTask] = []
    while len(found) < count:
        tool, phrasing, gives = rng.choice(PHRASINGS)
        (name, email), (n1, _), (n2, _) = rng.sample(PEOPLE, 3)
        a, b = rng.sample(CITIES, 2)
        slots = {"city": rng.choice(CITIES), "unit": rng.choice(["celsius", "fahrenheit"]), "a": a, "b": b,
                 "date": f"2027-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", "name": name, "email": email,
                 "subject": rng.choice(SUBJECTS), "message": rng.choice(MESSAGES), "title": rng.choice(TITLES),
                 "day": rng.choice(DAYS), "n1": n1, "n2": n2}
        prompt = phrasing.format(**slots)
        if ("tune", "report")[zlib.crc32(prompt.encode()) % 2] != split or any(t.prompt == prompt for t in found):
            continue
        values = {"city": slots["city"], "unit": slots["unit"], "to": email, "subject": slots["subject"],
                  "origin": a, "destination": b, "date": slots["date"], "title": slots["title"], "day": slots["day"],
                  "attendees": [n1, n2]}
        found.append(ToolTask(prompt, tool, {key: values[key] for key in gives}))
    return found


def _same(written: Any, expected: Any) -> bool:
    if isinstance(expected, list):
        return isinstance(written, list) and sorted(map(_norm, written)) == sorted(map(_norm, expected))
    return _norm(written) == _norm(expected)


def _norm(value: Any) -> str:
    return str(value).strip().strip(".'\"").casefold()


def leaked(value: str) -> bool:
    """Whether a string value holds the call's own syntax: a closing bracket it did not open, or a call
    format's marker (``</tool_call>``, ``<tool_call>``)."""
    if "</" in value or "<tool" in value:
        return True
    depth = 0
    for char in value:
        depth += (char in "{[") - (char in "}]")
        if depth < 0:
            return True
    return False


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _written_strings(text: str) -> list[str]:
    """The string values (and keys) of a call's text, the last one possibly unfinished."""
    arguments = text.split('"arguments"', 1)[-1]
    return [match.group(1) for match in _STRING.finditer(arguments[1:])]


def judge(task: ToolTask, result: Any) -> dict[str, Any]:
    """One result against its task: complete, cut, leaked, right tool, arguments written right."""
    calls = [call for call in result.tool_calls if call.arguments is not None]
    call = calls[0] if calls else None
    arguments = call.arguments if call is not None else {}
    right = call is not None and call.name == task.tool
    return {"prompt": task.prompt, "finish_reason": result.finish_reason, "text": result.text,
            "complete": result.finish_reason == "stop" and call is not None,
            "cut": result.finish_reason == "length",
            "leaked": any(leaked(s) for c in calls for s in _strings(c.arguments))
            or (call is None and any(leaked(s) for s in _written_strings(result.text))),
            "right_tool": right,
            "fields_right": sum(right and _same(arguments.get(key), value) for key, value in task.expected.items()),
            "fields": len(task.expected), "tokens": len(result.tokens)}


@dataclass
class ToolArgsConfig:
    """Which tasks, how many tokens, how many rows at once."""

    model: str = "smollm2"
    split: str = "tune"
    tasks: int = 96
    max_tokens: int = 96
    rows: int = 16
    settings: tuple[str, ...] = ("guard", "noguard")


def run_tool_args(config: ToolArgsConfig, loaded: Any = None) -> dict[str, Any]:
    """Every setting over the same tasks; rows and a summary per setting."""
    from cdsl_struct import Generator
    from cdsl_struct.models import load_model

    loaded = loaded or load_model(config.model)
    chosen = tasks(config.split, config.tasks)
    prompts = [task.prompt for task in chosen]
    summary, rows = {}, []
    for setting in config.settings:
        generator = Generator(loaded, string_guard=setting == "guard", max_batch_size=config.rows)
        options = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
        try:
            generator.generate(prompts[0], max_tokens=8, **options)  # compile, warm
            started = time.perf_counter()
            results = generator.generate_batch(prompts, max_tokens=config.max_tokens, **options)
            wall = time.perf_counter() - started
        finally:
            generator.close()
        mine = [{"setting": setting, **judge(task, result)} for task, result in zip(chosen, results, strict=True)]
        rows += mine
        summary[setting] = {"tasks": len(mine), **{key: sum(r[key] for r in mine) for key in
                                                   ("complete", "cut", "leaked", "right_tool")},
                            "field_accuracy": round(sum(r["fields_right"] for r in mine)
                                                    / sum(r["fields"] for r in mine), 3),
                            "mean_tokens": round(sum(r["tokens"] for r in mine) / len(mine), 1),
                            "wall_s": round(wall, 2)}
    return {"config": asdict(config), "summary": summary, "rows": rows}


def format_table(report: dict[str, Any]) -> str:
    """The settings as a markdown table."""
    lines = ["| setting | tasks | complete | cut | leaked | right tool | field accuracy | mean tokens | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in report["summary"].items():
        lines.append(f"| {name} | {s['tasks']} | {s['complete']} | {s['cut']} | {s['leaked']} | {s['right_tool']} | "
                     f"{s['field_accuracy']} | {s['mean_tokens']} | {s['wall_s']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks tool-args``'s options."""
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--split", choices=("tune", "report"), default="tune")
    parser.add_argument("--tasks", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rows", type=int, default=16, help="rows decoding at once")
    parser.add_argument("--settings", default="guard,noguard", help="comma-separated: guard, noguard")
    parser.add_argument("--json", dest="json_out", help="write rows and summary here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    config = ToolArgsConfig(model=args.model, split=args.split, tasks=args.tasks, max_tokens=args.max_tokens,
                            rows=args.rows, settings=tuple(args.settings.split(",")))
    report = run_tool_args(config)
    return write_report(report, format_table(report), args)
