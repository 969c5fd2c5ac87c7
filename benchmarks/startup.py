"""``python -m benchmarks startup``: how soon ``cdsl-struct serve`` answers, and how fast it answers later.

Starts the server in a child process, once per ``--start`` (``auto`` for its defaults, or any
``--torch-compile`` value; a start named twice runs twice, the second finding what the first left in
the caches), and times: ``/v1/models`` answering, the first strict ``json_schema`` request (invent a
person: name, age, city; 60 tokens, greedy), then one such request at a time, a second apart, for
``--minutes`` or until ``--after-compiled`` requests were answered by the compiled forward (an ``off``
start: ``OFF_REQUESTS`` requests). Each
request is labelled by the forward that answered it (``/health``'s ``forward.answers`` before and
after it; a request during the switch counts as eager). Reported per start: those times, when the
compiled forward took over, the median and slowest eager request, the median compiled one, and the
slowest eager request over the median of an ``off`` start of the same run (the compile's cost to a
request; the issue's bound is 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from cdsl_struct.bench import write_report

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}


OFF_REQUESTS = 20
"""Requests an ``off`` start is timed for (it never compiles, so it has no handoff to wait for)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ask(client: Any, index: int) -> tuple[float, bool]:
    """One strict json_schema request: (seconds, whether its answer parsed)."""
    body = {"model": "smollm2", "max_tokens": 60, "temperature": 0,
            "messages": [{"role": "user", "content": f"Invent a person number {index} (name, age, city) as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                                       "strict": True}}}
    started = time.monotonic()
    response = client.post("/v1/chat/completions", json=body)
    seconds = time.monotonic() - started
    try:
        json.loads(response.json()["choices"][0]["message"]["content"])
        return seconds, response.status_code == 200
    except (ValueError, KeyError, IndexError, TypeError):
        return seconds, False


def _answers(client: Any) -> str:
    return client.get("/health").json().get("forward", {}).get("answers", "eager")


def time_start(mode: str, minutes: float, after_compiled: int, log_dir: str | None = None) -> dict[str, Any]:
    """Start one server with ``--torch-compile mode`` and time it (see the module docstring)."""
    import httpx

    port = _free_port()
    command = [os.path.join(os.path.dirname(sys.executable), "cdsl-struct"), "serve", "--port", str(port),
               "--log-level", "warning"] + ([] if mode == "auto" else ["--torch-compile", mode])
    log = open(os.path.join(log_dir, f"serve-{mode}-{port}.log"), "w") if log_dir else subprocess.DEVNULL  # noqa: SIM115
    started = time.monotonic()
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    rows: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the server exited with code {server.returncode}")
                try:
                    if client.get("/v1/models").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            models_s = time.monotonic() - started
            index = 0
            while time.monotonic() - started < minutes * 60:
                before = _answers(client)
                at = time.monotonic() - started
                seconds, valid = _ask(client, index)
                answered = "compiled" if before == "compiled" and _answers(client) == "compiled" else "eager"
                rows.append({"at": round(at, 1), "seconds": round(seconds, 3), "valid": valid, "answered": answered})
                index += 1
                if sum(r["answered"] == "compiled" for r in rows) >= after_compiled or \
                        (mode == "off" and len(rows) >= OFF_REQUESTS):
                    break
                time.sleep(1.0)
            health = client.get("/health").json()
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return summarise_start(mode, models_s, rows, health)


def summarise_start(mode: str, models_s: float, rows: list[dict[str, Any]], health: dict[str, Any]) -> dict[str, Any]:
    """One start's figures from its requests (``rows``: ``at``, ``seconds``, ``valid``, ``answered``)."""
    eager = [r["seconds"] for r in rows if r["answered"] == "eager"]
    compiled = [r["seconds"] for r in rows if r["answered"] == "compiled"]
    took_over = next((r["at"] for r in rows if r["answered"] == "compiled"), None)
    return {"mode": mode, "models_s": round(models_s, 1), "first_request_s": rows[0]["seconds"] if rows else None,
            "first_answer_at_s": round(models_s + rows[0]["seconds"], 1) if rows else None,
            "requests": len(rows), "valid": sum(r["valid"] for r in rows), "compiled_from_s": took_over,
            "compile_seconds": health.get("forward", {}).get("compile_seconds"),
            "eager_median_s": round(statistics.median(eager), 3) if eager else None,
            "eager_max_s": max(eager) if eager else None,
            "compiled_median_s": round(statistics.median(compiled), 3) if compiled else None, "rows": rows}


def compare(starts: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's summary: each start's slowest eager request over the median of the ``off`` start."""
    off = next((s for s in starts if s["mode"].startswith("off") and s["eager_median_s"]), None)
    for start in starts:
        start["eager_max_over_off_median"] = round(start["eager_max_s"] / off["eager_median_s"], 2) \
            if off and start["eager_max_s"] else None
        start["compiled_median_over_off_median"] = round(start["compiled_median_s"] / off["eager_median_s"], 2) \
            if off and start["compiled_median_s"] else None
    return {"summary": {"starts": [{k: v for k, v in s.items() if k != "rows"} for s in starts]}, "starts": starts}


def format_startup_table(report: dict[str, Any]) -> str:
    lines = ["| start | /v1/models | first answer | compiled answers from | eager median / max | compiled median | "
             "eager max / off median | valid |", "|---|---|---|---|---|---|---|---|"]
    for s in report["summary"]["starts"]:
        def sec(value: Any) -> str:
            return "-" if value is None else f"{value:.1f} s" if value >= 10 else f"{value:.2f} s"
        lines.append(f"| {s['mode']} | {sec(s['models_s'])} | {sec(s['first_answer_at_s'])} | "
                     f"{sec(s['compiled_from_s'])} | {sec(s['eager_median_s'])} / {sec(s['eager_max_s'])} | "
                     f"{sec(s['compiled_median_s'])} | {s['eager_max_over_off_median'] or '-'} | "
                     f"{s['valid']}/{s['requests']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start", action="append", default=None,
                        help="a start: auto (serve's default), on or off, or MODE*N for N servers started "
                             "at once; repeat for several, in order (default: auto, auto, off)")
    parser.add_argument("--minutes", type=float, default=10.0, help="longest a start is timed (default 10)")
    parser.add_argument("--after-compiled", type=int, default=5,
                        help="stop a start once this many requests were answered compiled (default 5)")
    parser.add_argument("--log-dir", default=None, help="keep each server's stderr here")
    parser.add_argument("--json", dest="json_out", default=None, help="write the report as JSON here")


def time_starts(spec: str, minutes: float, after_compiled: int, log_dir: str | None = None) -> list[dict[str, Any]]:
    """One ``--start``: ``mode``, or ``mode*N`` for N servers started at once (sharing the caches: each
    is timed as a start of its own, labelled ``mode (i of N together)``)."""
    from concurrent.futures import ThreadPoolExecutor

    mode, _, count = spec.partition("*")
    servers = int(count or 1)
    if servers == 1:
        return [time_start(mode, minutes, after_compiled, log_dir)]
    with ThreadPoolExecutor(servers) as pool:
        starts = list(pool.map(lambda _: time_start(mode, minutes, after_compiled, log_dir), range(servers)))
    for index, start in enumerate(starts, 1):
        start["mode"] = f"{mode} ({index} of {servers} together)"
    return starts


def run(args: argparse.Namespace) -> int:
    starts = [start for spec in (args.start or ["auto", "auto", "off"])
              for start in time_starts(spec, args.minutes, args.after_compiled, args.log_dir)]
    report = compare(starts)
    return write_report(report, format_startup_table(report), args)
