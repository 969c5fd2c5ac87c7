"""The bulk job on Ray Data: ``read_text`` -> ``map_batches`` with a pool of model actors -> the driver.

Each actor (``DecodeActor``) loads the model once into a ``Generator`` (whose compiled-constraint
cache is per process, so each actor compiles the job's constraint once) and decodes a batch of
rows with the same code as the local engine (``rows.decode_chunk``). Input lines are read as text
(``read_text``), so each row travels exactly as written (``read_json`` would give every row the
union of all rows' columns, nulls included); the driver streams the output rows into the one
resumable output file as batches finish.

Needs the extra ``ray`` (``pip install 'cdsl_struct[ray]'``). ``address``: an existing cluster
(``"auto"`` or ``ray://...``); default: a local cluster started for the job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..heap import freeze_loaded_objects
from .files import id_key, parse_row
from .settings import BatchJob


class DecodeActor:
    """One model replica: decodes batches of input lines into output rows (as JSON text)."""

    def __init__(self, job: dict[str, Any], threads: int | None = None) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.job = BatchJob.from_dict(job)
        self.generator = self.job.generator()
        freeze_loaded_objects()

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        from .rows import decode_chunk

        rows = [parse_row(line) for line in batch["text"]]
        out = decode_chunk(self.generator, self.job, rows)
        return {"row": [json.dumps(row, ensure_ascii=False) for row in out]}


def ray_rows(job: BatchJob, in_path: str | Path, pending: set[str], *, chunk_size: int, actors: int,
             address: str | None = None, threads_per_actor: int = 1) -> Iterator[dict[str, Any]]:
    """Output rows of the input lines whose id key is in ``pending``, decoded on ``actors`` replicas."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("--engine ray needs the extra: pip install 'cdsl_struct[ray]'") from exc
    if actors < 1:
        raise ValueError("actors must be at least 1")
    if not pending:
        return
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(os.cpu_count() or 1, actors * threads_per_actor + 1), include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    try:
        wanted = set(pending)
        dataset = (
            ray.data.read_text(str(in_path))
            .filter(lambda item: _row_key(item["text"]) in wanted)
            .map_batches(DecodeActor, batch_size=chunk_size, batch_format="numpy",
                         compute=ray.data.ActorPoolStrategy(size=actors),
                         fn_constructor_kwargs={"job": job.to_dict(), "threads": threads_per_actor},
                         num_cpus=threads_per_actor)
        )
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            for text in batch["row"]:
                yield json.loads(text)
    finally:
        if started_here:
            ray.shutdown()


def _row_key(line: str) -> str | None:
    try:
        return id_key(json.loads(line).get("id"))
    except (json.JSONDecodeError, AttributeError):
        return None
