"""``python -m benchmarks keyword-load``: keyword-constrained requests one at a time against all at once.

The same ``--requests`` CommonGen concept sets (``--split``, default ``report``) become
``Generator.generate(prompt, keywords=..., method=...)`` calls through the public API: first one
after another, then all at once from as many threads. Before the engine stepped CDLH and CDSL
rows, these requests ran one at a time under a lock, so both took the same wall time. Reported
per run: wall time, requests per second, generated tokens, the engine's target forwards (steps),
and how many of the concurrent outputs equal the one-at-a-time ones (greedy decoding; a padded
batch may round differently). The ratio of the two wall times is the throughput gain.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cdsl_struct.api import Generator
from cdsl_struct.bench import write_report

from .commongen import PROMPT, load_cases


@dataclass(frozen=True)
class KeywordLoadConfig:
    data: str
    model: str = "smollm2"
    draft: str | None = "auto"
    method: str = "cdlh"
    requests: int = 16
    max_tokens: int = 32
    split: str = "report"
    seed: int = 0


def run_keyword_load(config: KeywordLoadConfig, progress: bool = True) -> dict[str, Any]:
    """Both runs over the same requests on one Generator; the report (rows and summary)."""
    cases = load_cases(Path(config.data), config.requests, config.seed, config.split)
    prompts = [(PROMPT.format(words=", ".join(c.split("_")[0] for c in case["concepts"])),
                [c.split("_")[0] for c in case["concepts"]]) for case in cases]
    gen = Generator(config.model, draft=config.draft)
    try:
        call = lambda pair: gen.generate(pair[0], keywords=pair[1], method=config.method,  # noqa: E731
                                         max_tokens=config.max_tokens)
        call(prompts[0])  # warm-up: compile the constraint, make the draft
        runs = {}
        for name, workers in (("one_at_a_time", 1), ("concurrent", len(prompts))):
            steps = gen.load().steps
            started = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(call, prompts))
            wall = time.perf_counter() - started
            runs[name] = {"wall_s": round(wall, 3), "requests_per_s": round(len(results) / wall, 3),
                          "tokens": sum(len(r.tokens) for r in results), "steps": gen.load().steps - steps,
                          "complete": sum(r.complete for r in results), "results": results}
            if progress:
                print(f"{name}: {wall:.1f} s, {runs[name]['steps']} target forwards", flush=True)
    finally:
        gen.close()
    alone, together = runs["one_at_a_time"], runs["concurrent"]
    same = sum(a.tokens == b.tokens for a, b in zip(alone.pop("results"), together.pop("results"), strict=True))
    summary = {"requests": len(prompts), "speedup": round(alone["wall_s"] / together["wall_s"], 3),
               "identical_outputs": same, **{f"{name}_{key}": value for name, run in runs.items()
                                            for key, value in run.items()}}
    return {"config": asdict(config), "summary": summary}


def format_keyword_table(report: dict[str, Any]) -> str:
    s, c = report["summary"], report["config"]
    lines = [f"{s['requests']} keyword requests, method {c['method']}, max_tokens {c['max_tokens']}, "
             f"split {c['split']}, model {c['model']}",
             "| run | wall s | req/s | tokens | target forwards | complete |", "|---|---:|---:|---:|---:|---:|"]
    for name in ("one_at_a_time", "concurrent"):
        lines.append(f"| {name.replace('_', ' ')} | {s[name + '_wall_s']} | {s[name + '_requests_per_s']} | "
                     f"{s[name + '_tokens']} | {s[name + '_steps']} | {s[name + '_complete']} |")
    lines.append(f"speedup {s['speedup']}x; identical outputs {s['identical_outputs']}/{s['requests']}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks keyword-load``'s options."""
    parser.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--draft", default="auto", help="the Generator's draft (default auto)")
    parser.add_argument("--method", default="cdlh", choices=["cdlh", "cdsl"])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--split", default="report", choices=["tune", "report", "all"])
    parser.add_argument("--seed", type=int, default=0, help="which concept sets of the split (a seeded sample)")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    config = KeywordLoadConfig(data=args.data, model=args.model, draft=None if args.draft == "none" else args.draft,
                               method=args.method, requests=args.requests, max_tokens=args.max_tokens,
                               split=args.split, seed=args.seed)
    report = run_keyword_load(config)
    return write_report(report, format_keyword_table(report), args)
