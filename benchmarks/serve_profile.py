"""``python -m benchmarks profile``: where a serve-bench case spends its time, as a torch.profiler table.

The serve bench's json_schema requests (``bench serve``'s prompts and schema, greedy) run
in-process through a ``Generator``, one at a time or all at once, with the engine stepped on the
profiling thread (torch.profiler records the ops of the thread it runs on), after one warm-up
request. Printed: wall time, tokens, the engine's counters (steps, rows per step, forward and
prefill seconds, mask time) and the ops that took the most self CPU time. The profiler's own
overhead inflates wall time; read the shares, not the seconds.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cdsl_struct.bench import write_report
from cdsl_struct.bench.serving import PERSON_SCHEMA, prompts


@dataclass
class ProfileConfig:
    """Which case to profile and how."""

    mode: str = "concurrent"
    requests: int = 16
    max_tokens: int = 60
    model: str = "smollm2"
    dtype: str = "auto"
    rows: int = 25


def run_profile(config: ProfileConfig) -> dict[str, Any]:
    """Profile one case; the summary and the op table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cdsl_struct.api import Generator

    if config.mode not in ("serial", "concurrent"):
        raise ValueError(f"mode must be serial or concurrent, got {config.mode!r}")
    generator = Generator(config.model, dtype=config.dtype)
    messages = [[{"role": "user", "content": p}] for p in prompts(config.requests)]

    def answer(message: list[dict[str, str]]) -> Any:
        return generator.generate(message, schema=PERSON_SCHEMA, max_tokens=config.max_tokens)

    try:
        answer(messages[0])
        engine = generator.engine
        engine.stop()  # step on this thread, where the profiler records
        started = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof, ThreadPoolExecutor(len(messages)) as pool:
            if config.mode == "concurrent":
                futures = [pool.submit(answer, m) for m in messages]
                while len(engine.scheduler.waiting) < len(messages):
                    time.sleep(0.001)
            else:
                futures = []
                for message in messages:
                    futures.append(pool.submit(answer, message))
                    while not futures[-1].done():
                        engine.step() if engine.busy else time.sleep(0.0005)
            while engine.busy:
                engine.step()
            results = [f.result() for f in futures]
        wall = time.perf_counter() - started
    finally:
        generator.close()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=config.rows,
                                      max_name_column_width=48)
    return {"mode": config.mode, "dtype": str(next(generator.loaded.model.parameters()).dtype),
            "torch_threads": torch.get_num_threads(), "wall_seconds": round(wall, 3),
            "tokens": sum(len(r.tokens) for r in results), "complete": sum(r.complete for r in results),
            "engine": engine.stats.as_dict(), "table": table}


def format_profile(report: dict[str, Any]) -> str:
    head = (f"bench profile: {report['mode']}, {report['dtype']}, {report['torch_threads']} torch threads; "
            f"wall {report['wall_seconds']} s (profiler overhead included), {report['tokens']} tokens, "
            f"{report['complete']} complete")
    return "\n".join([head, f"engine: {report['engine']}", report["table"]])


def add_arguments(parser: Any) -> None:
    defaults = ProfileConfig()
    parser.add_argument("--mode", default=defaults.mode, choices=["serial", "concurrent"],
                        help="serial: one request at a time; concurrent: all submitted at once")
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--dtype", default=defaults.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--rows", type=int, default=defaults.rows, help="ops listed")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run_from_args(args: Any) -> tuple[dict[str, Any], str]:
    report = run_profile(ProfileConfig(mode=args.mode, requests=args.requests, max_tokens=args.max_tokens,
                                       model=args.model, dtype=args.dtype, rows=args.rows))
    report["summary"] = {key: report[key] for key in ("mode", "dtype", "wall_seconds", "tokens", "engine")}
    return report, format_profile(report)


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    return write_report(*run_from_args(args), args)
