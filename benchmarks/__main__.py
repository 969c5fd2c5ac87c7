"""``python -m benchmarks <name> [options]``: run one of the lab's harnesses (``benchmarks.HARNESSES``)."""

from __future__ import annotations

import argparse
import sys

from cdsl_struct.bench import register

from . import HARNESSES


def main(argv: list[str] | None = None) -> int:
    """Run the harness ``argv`` names (default: the process's arguments); the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="The research benchmark harnesses.")
    commands = parser.add_subparsers(dest="bench", required=True)
    register(commands, HARNESSES, argv, prog="python -m benchmarks")
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
