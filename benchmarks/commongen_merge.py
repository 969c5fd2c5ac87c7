"""``python -m benchmarks commongen-merge``: one CommonGen report from the JSON reports of its shards
(``commongen --shard I/N``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cdsl_struct.bench import write_report

from .commongen import format_table, merge_reports


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The shards' JSON reports, and where to write the merged one."""
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--json", dest="json_out")


def run(args: argparse.Namespace) -> int:
    """One report from the shards' reports; print its table, write it."""
    merged = merge_reports([json.loads(Path(p).read_text(encoding="utf-8")) for p in args.reports])
    merged["summary"] = {}
    return write_report(merged, format_table(merged), args)
