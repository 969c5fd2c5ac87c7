"""Hard and soft constraints together: JSON that must validate and whose strings should name keywords.

The JSON Schema is hard (every output parses and validates: the constraint masks every token),
keyword coverage is soft (a reward: CDLH and CDSL steer towards outputs whose title and
description name the concepts of a CommonGen concept set). Compares greedy, CDLH and CDSL on
validity, coverage, wall time and target passes: the ``python -m benchmarks json-keywords`` bench
on a few built-in concept sets (or ``--data`` CommonGen's dev file).

Run: ``.venv/bin/python -m benchmarks.json_keywords_example`` (a few minutes on 2 cores);
``CDSL_EXAMPLE_FAST=1`` runs one concept set with greedy and CDSL only (seconds to a minute).
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.json_keywords import JsonKeywordsConfig, format_table, run_json_keywords

CONCEPT_SETS = ["dog_N#frisbee_N#catch_V", "kid_N#dance_V#rain_N", "boat_N#lake_N#sail_V"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="CommonGen dev.jsonl (default: the built-in concept sets)")
    parser.add_argument("--limit", type=int, default=3)
    args = parser.parse_args(argv)
    fast = os.environ.get("CDSL_EXAMPLE_FAST") == "1"
    config = JsonKeywordsConfig(limit=1 if fast else args.limit, methods=("greedy", "cdsl") if fast else
                                ("greedy", "cdlh", "cdsl"), max_tokens=64 if fast else 96, split="all")
    cases = None if args.data else [{"concepts": s.split("#")} for s in CONCEPT_SETS[:config.limit]]
    report = run_json_keywords(args.data, config, progress=False, cases=cases)
    print(format_table(report))
    for method, row in report["methods"].items():
        for output in row["outputs"]:
            print(f"{method:7s} covered {len(output['covered'])}/{len(output['concepts'])}  {output['text']}")
    # the hard constraint: every complete output is valid JSON under the schema
    return 0 if all(row["valid_of_complete"] == 1.0 for row in report["methods"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
