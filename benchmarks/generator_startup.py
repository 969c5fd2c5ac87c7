"""``python -m benchmarks generator-startup``: how soon ``Generator(torch_compile=...)`` answers, and how fast later.

Each ``--start`` runs in a fresh process, one after another, all sharing one cache folder for the
run (``CDSL_STRUCT_CACHE`` and ``TORCHINDUCTOR_CACHE_DIR``; unless ``--cache`` names one, it is empty
at the first start but for the prepared models): a start named twice finds what the first left.
A start makes the Generator (the model loaded, draft off), then asks one strict json_schema request
at a time (invent a person: name, age, city; 60 tokens, greedy) until ``--after-compiled`` were
answered compiled, or ``--requests`` in all for a start that does not compile. Modes: ``off``
(eager), ``on`` (eager at once, the saved graphs swapped in once a second process compiled them or
a first load read them), ``in-process`` (the forward compiled in this process before the first
request: what ``Generator`` did before the saved graphs). Reported per start: seconds to the
Generator, to the first answer, to the compiled forward, the eager requests' median and slowest,
and the compiled ones' median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from cdsl_struct.bench import write_report

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
MODES = ("off", "on", "in-process")


def one_start(mode: str, model: str, after_compiled: int, requests: int, minutes: float) -> dict[str, Any]:
    """Time one start in this process (see the module's docstring)."""
    started = time.monotonic()
    from cdsl_struct import Generator

    generator = Generator(model, draft=None, torch_compile="on" if mode == "on" else "off")
    made = time.monotonic() - started
    runner = generator.engine.runner
    if mode == "in-process":
        runner.compile()  # compiled and warmed here, as the Generator did before
    rows: list[dict[str, Any]] = []
    try:
        while time.monotonic() - started < minutes * 60:
            compiled_before = runner.compiled is not None and runner.compiled.active
            asked = time.monotonic()
            result = generator.generate(f"Invent a person number {len(rows)} (name, age, city) as JSON.",
                                        schema=SCHEMA, max_tokens=60)
            seconds = time.monotonic() - asked
            compiled = compiled_before and runner.compiled is not None and runner.compiled.active
            try:
                valid = set(json.loads(result.text)) == set(SCHEMA["properties"])
            except ValueError:
                valid = False
            rows.append({"at": round(asked - started, 2), "seconds": round(seconds, 3), "compiled": compiled,
                         "tokens": len(result.tokens), "valid": valid})
            done_compiled = sum(row["compiled"] for row in rows)
            if done_compiled >= after_compiled or (mode == "off" and len(rows) >= requests):
                break
            state = generator.compile_state()
            if mode == "on" and state is not None and state.phase in ("failed", "stopped") and len(rows) >= requests:
                break
        state = generator.compile_state()
    finally:
        generator.close()
    eager = [row["seconds"] for row in rows if not row["compiled"]]
    fast = [row["seconds"] for row in rows if row["compiled"]]
    first_compiled = next((row["at"] for row in rows if row["compiled"]), None)
    return {"mode": mode, "generator_s": round(made, 2), "first_answer_s": round(rows[0]["at"] + rows[0]["seconds"], 2),
            "compiled_from_s": first_compiled, "compile_state": None if state is None else
            {"phase": state.phase, "source": state.source, "seconds": round(state.seconds or 0, 1),
             "reason": state.reason},
            "eager_median_s": statistics.median(eager) if eager else None, "eager_max_s": max(eager, default=None),
            "compiled_median_s": statistics.median(fast) if fast else None,
            "valid": f"{sum(row['valid'] for row in rows)}/{len(rows)}", "requests": rows}


def format_table(report: dict[str, Any]) -> str:
    def sec(value: Any) -> str:
        return "-" if value is None else f"{value:.2f} s"

    lines = ["| start | Generator | first answer | compiled from | how | eager median / max | compiled median "
             "| valid |",
             "|---|---|---|---|---|---|---|---|"]
    for start in report["starts"]:
        state = start["compile_state"] or {}
        how = state.get("source") or state.get("phase") or "-"
        lines.append(f"| {start['mode']} | {sec(start['generator_s'])} | {sec(start['first_answer_s'])} | "
                     f"{sec(start['compiled_from_s'])} | {how} | {sec(start['eager_median_s'])} / "
                     f"{sec(start['eager_max_s'])} | {sec(start['compiled_median_s'])} | {start['valid']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start", action="append", choices=MODES, default=None,
                        help="a start to time, in order (repeatable; default: on, on, in-process, off)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--after-compiled", type=int, default=5, help="compiled answers a compiling start waits for")
    parser.add_argument("--requests", type=int, default=8, help="requests of a start that does not compile")
    parser.add_argument("--minutes", type=float, default=8.0, help="longest a start is timed")
    parser.add_argument("--cache", default=None, help="the cache folder (default: a new empty one)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the report as JSON here")


def _new_cache() -> str:
    """An empty cache folder for a run, but for the prepared models and tokenizers of the user's own
    (linked: preparing a GGUF again would time a download's work, not a start's)."""
    from cdsl_struct.paths import cache_dir

    cache = tempfile.mkdtemp(prefix="cdsl-generator-startup-")
    for name in ("models", "tokenizers"):
        if (cache_dir() / name).exists():
            os.symlink(cache_dir() / name, os.path.join(cache, name))
    return cache


def run(args: argparse.Namespace) -> int:
    cache = args.cache or _new_cache()
    env = {**os.environ, "CDSL_STRUCT_CACHE": cache, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
    starts = []
    for mode in args.start or ["on", "on", "in-process", "off"]:
        spec = json.dumps({"mode": mode, "model": args.model, "after_compiled": args.after_compiled,
                           "requests": args.requests, "minutes": args.minutes})
        done = subprocess.run([sys.executable, "-m", "benchmarks.generator_startup", spec], env=env, text=True,
                              capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the {mode} start failed: {done.stderr[-3000:]}")
        starts.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(format_table({"starts": starts[-1:]}).splitlines()[-1], flush=True)
    report = {"summary": {"cache": cache, "cpu_threads": os.cpu_count()}, "starts": starts}
    return write_report(report, format_table(report), args)


if __name__ == "__main__":
    print(json.dumps(one_start(**json.loads(sys.argv[1]))))
