"""``cdsl-struct bench serve``: its options, and one run against one server: the same json_schema requests
at each concurrency level (``serving``), or with ``--mix`` a mixed load one at a time too (``serving_mix``)."""

from __future__ import annotations

import argparse
from typing import Any

from . import write_report
from .serving import ServeBenchConfig, format_table, run_serve_bench
from .serving_mix import MixConfig, format_mix_table, run_mix_bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``cdsl-struct bench serve``'s options."""
    parser.add_argument("--url", "--base-url", default="http://127.0.0.1:8000/v1", help="the server's base URL")
    parser.add_argument("--mix", action="store_true",
                        help="a mixed load (json_schema, tools, plain, streaming, disconnecting clients, malformed "
                             "requests) from --clients threads, against the same requests one at a time")
    parser.add_argument("--clients", type=int, default=32, help="--mix: concurrent clients (default 32)")
    parser.add_argument("--serial-requests", type=int, default=40,
                        help="--mix: well-formed requests sent one at a time for the baseline (default 40)")
    parser.add_argument("--model", default="smollm2", help="model name the server serves (default smollm2)")
    parser.add_argument("--requests", type=int, default=16,
                        help="requests per concurrency level, or of the --mix load (default 16)")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated levels (default 1,16)")
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--tokenizer", default="smollm2", help="re-tokenises the answers for a fair token count")
    parser.add_argument("--label", default="", help="name of the server in the table")
    parser.add_argument("--json", dest="json_out", help="write rows and summary here")


def run_once(args: argparse.Namespace, url: str, model: str, label: str) -> dict[str, Any]:
    """The bench ``args`` describe against the server at ``url`` serving ``model``; its report."""
    if args.mix:
        return run_mix_bench(MixConfig(base_url=url, model=model, requests=args.requests, clients=args.clients,
                                       serial_requests=args.serial_requests, max_tokens=args.max_tokens,
                                       label=label))
    return run_serve_bench(ServeBenchConfig(
        base_url=url, model=model, requests=args.requests, max_tokens=args.max_tokens, tokenizer=args.tokenizer,
        concurrency=tuple(int(c) for c in args.concurrency.split(",") if c.strip()), label=label))


def run(args: argparse.Namespace) -> int:
    """Run the bench against ``--url``; print the table, write the report."""
    report = run_once(args, args.url, args.model, args.label)
    return write_report(report, format_mix_table(report) if args.mix else format_table(report), args)
