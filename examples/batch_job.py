"""A bulk job: JSON lines in, JSON lines out, resumable; the same as ``cdsl-struct batch``.

Writes a few input rows (``{"id", "prompt"}`` and ``{"id", "messages"}``) to a temporary folder,
extracts JSON for a schema from each, prints the output rows and the summary, then runs the job
again to show that finished rows are skipped. ``--engine ray`` runs it on a local Ray cluster
(extra ``ray``). Run: ``.venv/bin/python examples/batch_job.py [--engine ray]``.
Command line equivalent: ``cdsl-struct batch in.jsonl out.jsonl --schema person.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from cdsl_struct import GenerationParams
from cdsl_struct.bulk import BatchJob, run_job

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "city": {"type": "string", "maxLength": 30}},
          "required": ["name", "city"], "additionalProperties": False}
ROWS = [
    {"id": 1, "prompt": "Extract name and city as JSON: Maria Gonzalez lives in Madrid.", "source": "crm"},
    {"id": 2, "messages": [{"role": "system", "content": "You extract facts as JSON."},
                           {"role": "user", "content": "Tom Becker moved to Hamburg last year."}]},
    {"id": 3, "prompt": "Extract name and city as JSON: Aiko Tanaka teaches in Osaka."},
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="local", choices=["local", "ray"])
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="cdsl-batch-"))
    source, target = folder / "in.jsonl", folder / "out.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    job = BatchJob(schema=SCHEMA, params=GenerationParams(max_tokens=40), draft="auto")
    summary = run_job(job, source, target, engine=args.engine, chunk_size=2, progress=False)
    for line in target.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        print(f"{row['id']!s:3} {row.get('finish_reason', 'error'):7s} {row.get('output', row.get('error'))}")
    print(summary.line())
    again = run_job(job, source, target, engine=args.engine, progress=False)
    print(f"second run: {again.line()}")
    return 0 if summary.complete == len(ROWS) and again.written == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
