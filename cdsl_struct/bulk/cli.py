"""``cdsl-struct batch IN.jsonl OUT.jsonl``: the bulk job from the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import CdslError
from ..options import BACKENDS, add_output_options, add_torch_compile_option
from ..params import add_param_arguments, params_from_args
from .files import InputError
from .job import ENGINES, BatchJob, load_json_arg, run_job

EXIT_ERROR = 2


def add_batch_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``batch`` to the ``cdsl-struct`` subcommands."""
    batch = commands.add_parser(
        "batch", help="decode every row of a JSON lines file under one constraint (resumable; local or Ray)",
        description="Reads IN (JSON lines: {\"id\", \"prompt\"} or {\"id\", \"messages\"}, other fields carried "
                    "through) and appends to OUT each row plus \"output\" (the parsed value), \"text\" and "
                    "\"finish_reason\", or \"error\". Rows whose id is already in OUT are skipped, so an "
                    "interrupted job is resumed by running it again.")
    batch.add_argument("input", metavar="IN.jsonl")
    batch.add_argument("output", metavar="OUT.jsonl")
    constraint = batch.add_mutually_exclusive_group()
    constraint.add_argument("--schema", metavar="FILE", help="JSON Schema file: each output is JSON valid under it")
    constraint.add_argument("--tools", metavar="FILE", help="JSON file with a list of OpenAI tools: outputs are calls")
    constraint.add_argument("--regex", help="each output fully matches this regular expression")
    constraint.add_argument("--choices", metavar="A,B,C", help="each output is one of these comma-separated strings")
    constraint.add_argument("--grammar", metavar="FILE_OR_NAME", help="Lark grammar file or shipped name")
    batch.add_argument("--tool-choice", default="required",
                       help="with --tools: required (default), auto, none or a tool's name")
    batch.add_argument("--engine", default="local", choices=ENGINES, help="local (default) or ray (extra 'ray')")
    batch.add_argument("--batch-size", type=int, default=16,
                       help="rows per generate call (local) or per Ray batch (default 16)")
    batch.add_argument("--actors", type=int, default=2, help="--engine ray: model replicas (default 2)")
    batch.add_argument("--ray-address", default=None, help="--engine ray: cluster address (default: start one)")
    batch.add_argument("--model", default="smollm2", help="model (default: the embedded SmolLM2)")
    batch.add_argument("--draft", default="auto", help="draft: auto (prompt lookup), none, bf16, layers:N ...")
    batch.add_argument("--backend", default="auto", choices=BACKENDS)
    add_output_options(batch)
    batch.add_argument("--device", default="auto")
    batch.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    add_torch_compile_option(batch, "off")
    add_param_arguments(batch)
    batch.add_argument("--no-chat", action="store_true",
                       help="send each prompt as it is, without the chat template (base models; no messages rows)")
    batch.add_argument("--fsync", action="store_true", help="fsync after every row (survives power loss)")
    batch.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return batch


def job_from_args(args: argparse.Namespace) -> BatchJob:
    """The ``BatchJob`` the parsed arguments describe (files read here)."""
    job = BatchJob(model=args.model, draft=None if args.draft == "none" else args.draft, backend=args.backend,
                   whitespace=args.whitespace, loop_guard=args.loop_guard, string_guard=args.string_guard,
                   device=args.device, dtype=args.dtype,
                   params=params_from_args(args), max_batch_size=max(args.batch_size, 1), chat=not args.no_chat,
                   torch_compile=args.torch_compile)
    if args.schema:
        with open(args.schema, encoding="utf-8") as handle:
            job.schema = handle.read()
    if args.tools:
        job.tools = load_json_arg(args.tools)
        job.tool_choice = args.tool_choice
    if args.regex is not None:
        job.regex = args.regex
    if args.choices:
        job.choices = [c.strip() for c in args.choices.split(",") if c.strip()]
    if args.grammar:
        job.grammar = args.grammar
    return job


def run_batch(args: argparse.Namespace) -> int:
    """Run the job; the summary goes to stderr. Exit 2 on bad input or settings (one line on stderr)."""
    try:
        job = job_from_args(args)
        summary = run_job(job, args.input, args.output, engine=args.engine, chunk_size=args.batch_size,
                          progress=not args.no_progress, actors=args.actors, ray_address=args.ray_address,
                          durable=args.fsync)
    except (CdslError, InputError, ValueError, OSError, ImportError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"cdsl-struct batch: error: {first_line}", file=sys.stderr)
        return EXIT_ERROR
    print(f"cdsl-struct batch: {summary.line()}", file=sys.stderr)
    return 0
