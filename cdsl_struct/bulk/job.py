"""A bulk job: ``run_job`` over a JSON lines file under one ``BatchJob``'s settings, locally or on Ray.

Local engine: rows go through one ``Generator`` in chunks of ``chunk_size``, each chunk one call
of ``Generator.generate_batch(prompts)`` (rows of one batch on the batched engine). Output rows
are appended and flushed one by one; ids already in the output are skipped (resume).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import RowWriter, id_key, read_rows, repair_and_read_done
from .settings import BatchJob

__all__ = ["ENGINES", "BatchJob", "JobSummary", "load_json_arg", "pending_rows", "run_job"]

ENGINES = ("local", "ray")


@dataclass
class JobSummary:
    """What a run did: rows written this run by outcome, rows skipped as already done, time."""

    written: int = 0
    complete: int = 0
    incomplete: int = 0
    errors: int = 0
    skipped_done: int = 0
    skipped_duplicate: int = 0
    seconds: float = 0.0
    engine: str = "local"
    finish_reasons: dict[str, int] = field(default_factory=dict)

    def count(self, row: dict[str, Any]) -> None:
        self.written += 1
        if "error" in row:
            self.errors += 1
            return
        reason = row.get("finish_reason", "")
        self.finish_reasons[reason] = self.finish_reasons.get(reason, 0) + 1
        if reason == "stop":
            self.complete += 1
        else:
            self.incomplete += 1

    def line(self) -> str:
        rate = self.written / self.seconds if self.seconds else 0.0
        return (f"{self.written} rows written in {self.seconds:.1f} s ({rate:.2f} rows/s, engine {self.engine}): "
                f"{self.complete} complete, {self.incomplete} incomplete, {self.errors} errors; skipped "
                f"{self.skipped_done} already done, {self.skipped_duplicate} duplicate ids")


def pending_rows(in_path: str | Path, done: set[str], summary: JobSummary) -> list[dict[str, Any]]:
    """Input rows not yet in the output, each id once (a repeated id is counted and skipped)."""
    seen = set(done)
    rows = []
    for row in read_rows(in_path):
        key = id_key(row["id"])
        if key in done:
            summary.skipped_done += 1
        elif key in seen:
            summary.skipped_duplicate += 1
        else:
            seen.add(key)
            rows.append(row)
    return rows


def run_job(job: BatchJob, in_path: str | Path, out_path: str | Path, *, engine: str = "local",
            chunk_size: int = 16, progress: bool = True, actors: int = 2, ray_address: str | None = None,
            durable: bool = False) -> JobSummary:
    """Decode every row of ``in_path`` not yet in ``out_path`` and append its output row.

    ``engine``: ``"local"`` (one Generator, chunks of ``chunk_size`` rows) or ``"ray"`` (Ray Data,
    ``actors`` model replicas, batches of ``chunk_size`` rows). Raises ``InputError`` for an
    unreadable input, ``ValueError`` for bad settings; a row that fails gets an ``error``.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose {', '.join(ENGINES)}")
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    job.check()
    summary = JobSummary(engine=engine)
    started = time.perf_counter()
    done = repair_and_read_done(out_path)
    rows = pending_rows(in_path, done, summary)
    if engine == "local":
        produced = _local_rows(job, rows, chunk_size)
    else:
        from .ray_engine import ray_rows

        pending = {id_key(row["id"]) for row in rows}
        produced = ray_rows(job, in_path, pending, chunk_size=chunk_size, actors=actors, address=ray_address)
    written: set[str] = set()
    with RowWriter(out_path, durable=durable) as writer:
        for row in _progress(produced, len(rows), progress):
            key = id_key(row.get("id"))
            if key in written:  # a repeated input id reaching Ray twice: written once
                continue
            written.add(key)
            writer.write(row)
            summary.count(row)
    summary.seconds = time.perf_counter() - started
    return summary


def _local_rows(job: BatchJob, rows: list[dict[str, Any]], chunk_size: int) -> Iterator[dict[str, Any]]:
    from .rows import decode_chunk

    if not rows:
        return
    generator = job.generator()
    try:
        for start in range(0, len(rows), chunk_size):
            yield from decode_chunk(generator, job, rows[start:start + chunk_size])
    finally:
        generator.close()


def _progress(rows: Iterable[dict[str, Any]], total: int, show: bool) -> Iterable[dict[str, Any]]:
    if not show:
        return rows
    from tqdm import tqdm

    return tqdm(rows, total=total, unit="row", file=sys.stderr, dynamic_ncols=True, smoothing=0.1)


def load_json_arg(text_or_path: str) -> Any:
    """A JSON value from a file path (or inline JSON text)."""
    path = Path(text_or_path)
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    return json.loads(text_or_path)
