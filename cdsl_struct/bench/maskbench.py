"""MaskBench over JSONSchemaBench cases: compile, then check the mask before every token.

Semantics follow MaskBench: each test instance is serialised with ``json.dumps(data,
ensure_ascii=False)`` (separators ``", "`` and ``": "``, so schemas compile with the
``flexible`` whitespace policy), tokenised without special tokens, and for every token the mask
is computed and must allow it. A valid instance must also end in a complete state. A case
passes when it compiles, every valid test is accepted and every invalid test is rejected.

Each case runs in a forked worker process that the parent kills when the case overruns its
time budget or the worker's memory passes its budget, so one pathological schema is counted
(as ``timeout``) instead of taking the run down.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import multiprocessing
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from ..constraints import JsonSchema, TokenVocabulary, allocate_bitmask, compile, is_allowed
from ..errors import CdslError, CompileTimeout
from ..options import BACKENDS
from . import write_report

STATUSES = ("passing", "compile_error", "timeout", "validation_error", "invalidation_error")
SPLITS = ("tune", "report")


def split_of(case_id: str) -> str:
    """The deterministic half a case belongs to: ``tune`` (rules are developed on it) or
    ``report`` (held out), by the SHA-256 of its id."""
    return SPLITS[hashlib.sha256(case_id.encode()).digest()[0] & 1]


@dataclass
class MaskBenchConfig:
    backend: str = "auto"
    compile_timeout_s: float = 30.0
    tests_timeout_s: float = 120.0
    memory_limit_mb: int = 3000
    whitespace: str = "flexible"


def load_cases(data: str | Path, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Cases from a ``.jsonl``/``.jsonl.gz`` file or every such file in a folder; ``limit`` samples
    that many reproducibly (by ``seed``) across all files."""
    path = Path(data)
    files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz"))) if path.is_dir() else [path]
    lines = [line for file in files for line in _lines(file)]
    if limit is not None and limit < len(lines):  # parse only the sample: the full set is ~60 MB of JSON
        lines = [lines[i] for i in sorted(random.Random(seed).sample(range(len(lines)), limit))]
    return [json.loads(line) for line in lines]


def read_jsonl(file: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` or ``.jsonl.gz`` file, one per non-empty line."""
    return (json.loads(line) for line in _lines(file))


def _lines(file: Path) -> Iterator[str]:
    """The non-empty lines of a ``.jsonl`` or ``.jsonl.gz`` file."""
    with (gzip.open if file.name.endswith(".gz") else open)(file, "rt", encoding="utf-8") as handle:
        yield from (line for line in handle if line.strip())


def run_case(case: dict[str, Any], vocabulary: TokenVocabulary, config: MaskBenchConfig,
             report: Any = None) -> dict[str, Any]:
    """Run one case in this process. ``report(msg)`` is told when compiling has finished."""
    result: dict[str, Any] = {"id": case["id"], "status": "passing"}
    start = time.perf_counter()
    try:
        compiled = compile(
            JsonSchema(case["schema"]), vocabulary, backend=config.backend,
            whitespace=config.whitespace, timeout=None, cache=False,
            extra_properties=True,  # the schema exactly as given: its test instances judge it
        )
        state = compiled.new_state()
        row = allocate_bitmask(vocabulary.size, backend="numpy")
        state.fill_mask(row)
        result["ttfm_us"] = (time.perf_counter() - start) * 1e6
        result["compile_us"] = compiled.compile_seconds * 1e6
        result["backend"] = compiled.backend
        if compiled.rewrites:
            result["rewrites"] = list(compiled.rewrites)
    except CdslError as exc:
        result.update(status="compile_error", error=f"{type(exc).__name__}: {exc}"[:500],
                      ttfm_us=(time.perf_counter() - start) * 1e6)
        if isinstance(exc, CompileTimeout):
            result["status"] = "timeout"
        return result
    if report is not None:
        report({"compiled": True})

    mask_us: list[float] = []
    failures: list[dict[str, Any]] = []
    for number, test in enumerate(case["tests"]):
        text = json.dumps(test["data"], ensure_ascii=False)
        tokens = vocabulary.encode(text)
        state = compiled.new_state()
        accepted, stopped_at = True, len(tokens)
        for position, token in enumerate(tokens):
            try:
                tick = time.perf_counter()
                state.fill_mask(row)
                mask_us.append((time.perf_counter() - tick) * 1e6)
                if not is_allowed(row, token):
                    accepted, stopped_at = False, position
                    break
                state.advance(token)
            except CdslError as exc:  # engine gave up mid-way (e.g. a lexer resource limit)
                result["engine_error"] = f"{type(exc).__name__}: {exc}"[:300]
                accepted, stopped_at = False, position
                break
        if accepted:
            accepted = state.is_complete()
        if accepted != test["valid"]:
            failures.append({"test": number, "valid": test["valid"], "position": stopped_at})
    if any(not f["valid"] for f in failures):
        result["status"] = "invalidation_error"
    elif failures:
        result["status"] = "validation_error"
    result["failures"] = failures[:5]
    result["masks"] = len(mask_us)
    result["mask_us"] = mask_us
    return result


def _worker(conn: Connection, vocabulary: TokenVocabulary, config: MaskBenchConfig) -> None:
    while True:
        case = conn.recv()
        if case is None:
            return
        conn.send(run_case(case, vocabulary, config, report=conn.send))


class _WorkerHandle:
    def __init__(self, vocabulary: TokenVocabulary, config: MaskBenchConfig) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, vocabulary, config), daemon=True)
        self.process.start()
        self.peak_rss = 0
        self.baseline = self._resident()

    def rss(self) -> int:
        """Resident bytes the worker added since it was forked: a forked child's RSS also counts
        every page it still shares with the parent, so a parent holding models (a test process)
        would otherwise put every case over the budget."""
        value = max(0, self._resident() - self.baseline)
        self.peak_rss = max(self.peak_rss, value)
        return value

    def _resident(self) -> int:
        import psutil

        try:
            return psutil.Process(self.process.pid).memory_info().rss
        except psutil.Error:
            return 0

    def kill(self) -> None:
        self.process.kill()
        self.process.join()


def _await(handle: _WorkerHandle, deadline: float, memory_bytes: int) -> tuple[Any, str | None]:
    """The worker's next message, or (None, why) once the deadline or memory budget is passed."""
    while True:
        if handle.rss() > memory_bytes:
            return None, "memory budget exceeded"
        wait = min(0.02, deadline - time.perf_counter())
        if wait <= 0:  # the budget is checked before each poll, so a budget of 0 admits no message
            return None, "time budget exceeded"
        if handle.conn.poll(wait):
            try:
                return handle.conn.recv(), None
            except EOFError:
                return None, "worker died"
        if not handle.process.is_alive():
            return None, "worker died"


def run_maskbench(
    cases: list[dict[str, Any]], tokenizer: Any, config: MaskBenchConfig, progress: bool = True
) -> dict[str, Any]:
    """Run every case in a killable worker; return ``{"summary": ..., "cases": [...]}``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    vocabulary = TokenVocabulary.from_tokenizer(tokenizer)
    vocabulary.encode("warm up")
    memory_bytes = config.memory_limit_mb * 1024 * 1024
    results: list[dict[str, Any]] = []
    all_mask_us: list[np.ndarray] = []
    handle = _WorkerHandle(vocabulary, config)
    peak_worker_rss = 0
    bar = _progress_bar(len(cases), progress)
    started = time.perf_counter()
    try:
        for case in cases:
            handle.conn.send(case)
            message, why = _await(handle, time.perf_counter() + config.compile_timeout_s, memory_bytes)
            if message is not None and "compiled" in message:
                message, why = _await(handle, time.perf_counter() + config.tests_timeout_s, memory_bytes)
            if message is None:
                peak_worker_rss = max(peak_worker_rss, handle.peak_rss)
                handle.kill()
                message = {"id": case["id"], "status": "timeout", "error": why}
                handle = _WorkerHandle(vocabulary, config)
            all_mask_us.append(np.asarray(message.pop("mask_us", []), dtype=np.float64))
            results.append(message)
            bar.update(1)
            bar.set_postfix_str(_short_counts(results))
    finally:
        bar.close()
        peak_worker_rss = max(peak_worker_rss, handle.peak_rss)
        handle.conn.send(None)
        handle.process.join(timeout=5)
        if handle.process.is_alive():
            handle.kill()
    summary = summarise(results, np.concatenate(all_mask_us) if all_mask_us else np.zeros(0))
    summary["splits"] = {
        split: summarise([r for r, _ in chosen], np.concatenate([m for _, m in chosen]) if chosen else np.zeros(0))
        for split in SPLITS
        for chosen in [[(r, m) for r, m in zip(results, all_mask_us, strict=True) if split_of(r["id"]) == split]]
    }
    summary["rewrite_rules"] = dict(Counter(rule for r in results for rule in r.get("rewrites", [])))
    summary.update(tokenizer=str(tokenizer) if isinstance(tokenizer, str) else type(tokenizer).__name__,
                   backend=config.backend, wall_s=round(time.perf_counter() - started, 1),
                   peak_rss_mb={"parent": _own_peak_rss_mb(), "worker": round(peak_worker_rss / 2**20, 1)},
                   vocabulary_build_s=round(vocabulary.build_seconds, 3),
                   backends_used=dict(Counter(r.get("backend", "-") for r in results)))
    return {"summary": summary, "cases": results}


def summarise(results: list[dict[str, Any]], mask_us: np.ndarray) -> dict[str, Any]:
    """Counts per status and percentiles of time to first mask and time between masks."""
    counts = Counter(r["status"] for r in results)
    ttfm = np.asarray([r["ttfm_us"] for r in results if r["status"] not in ("compile_error", "timeout")])
    return {
        "cases": len(results),
        **{status: counts.get(status, 0) for status in STATUSES},
        "passing_pct": round(100 * counts.get("passing", 0) / max(len(results), 1), 2),
        "ttfm_us": _percentiles(ttfm, (50, 75, 99)),
        "tbm_us": _percentiles(mask_us, (50, 99)),
        "masks": int(mask_us.size),
    }


def _percentiles(values: np.ndarray, points: tuple[int, ...]) -> dict[str, float | None]:
    if values.size == 0:
        return {f"p{p}": None for p in points}
    return {f"p{p}": round(float(np.percentile(values, p)), 1) for p in points}


def _short_counts(results: list[dict[str, Any]]) -> str:
    counts = Counter(r["status"] for r in results)
    return " ".join(f"{s[:4]}={counts[s]}" for s in STATUSES if counts.get(s))


def _own_peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _progress_bar(total: int, enabled: bool) -> Any:
    import tqdm

    tqdm.tqdm.monitor_interval = 0  # no monitor thread: workers are forked
    return tqdm.tqdm(total=total, disable=not enabled, unit="case", dynamic_ncols=True)


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text table of a summary, for the terminal."""
    rows = [
        ("backend", summary.get("backend")),
        ("cases", summary["cases"]),
        ("passing", f"{summary['passing']} ({summary['passing_pct']}%)"),
        *[(status, summary[status]) for status in STATUSES[1:]],
        ("ttfm p50/p75/p99 us", "/".join(str(v) for v in summary["ttfm_us"].values())),
        ("mask p50/p99 us", "/".join(str(v) for v in summary["tbm_us"].values())),
        ("masks", summary["masks"]),
        ("wall s", summary.get("wall_s")),
        ("peak RSS MB", summary.get("peak_rss_mb")),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``cdsl-struct bench maskbench``'s options."""
    parser.add_argument("--data", required=True, help="a .jsonl(.gz) file or a folder of them")
    parser.add_argument("--tokenizer", default="llama3", help="tokenizer name, path or HF id (default llama3)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--limit", type=int, default=None, help="sample this many cases across all files")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    parser.add_argument("--timeout", type=float, default=30.0, help="compile time budget per case, seconds")
    parser.add_argument("--tests-timeout", type=float, default=120.0, help="time budget for a case's tests")
    parser.add_argument("--memory-mb", type=int, default=3000, help="worker memory budget, MB")
    parser.add_argument("--json", dest="json_out", help="write summary and per-case results here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    cases = load_cases(args.data, limit=args.limit, seed=args.seed)
    config = MaskBenchConfig(backend=args.backend, compile_timeout_s=args.timeout,
                             tests_timeout_s=args.tests_timeout, memory_limit_mb=args.memory_mb)
    report = run_maskbench(cases, args.tokenizer, config, progress=not args.no_progress)
    return write_report(report, format_table(report["summary"]), args)
