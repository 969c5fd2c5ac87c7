"""``python -m benchmarks keyword-captions``: keywords inside a schema's JSON, through ``generate``.

Each CommonGen concept set of ``--split`` is decoded with ``Generator.generate("Write a caption for a
photo as JSON.", schema=CAPTION_SCHEMA, keywords=words, max_tokens=...)`` at the library's defaults
(CDSL with the embedded model): a caption string and a mood from four. Reported: valid JSON, hard
coverage (every word, inflections count), finished (ended before ``max_tokens``), captions that are
lists of the words (``list_shaped``), captions of keywords alone ("Door open slide"), and captions
that are all of: every word, finished, neither a list nor keywords alone (``good``); wall time.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from cdsl_struct.bench import write_report
from cdsl_struct.rewards import KeywordCoverage, list_shaped

from . import quality
from .commongen import load_cases

CAPTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"caption": {"type": "string"}, "mood": {"enum": ["happy", "calm", "busy", "sad"]}},
    "required": ["caption", "mood"],
}
INSTRUCTION = "Write a caption for a photo as JSON."
_WORD = re.compile(r"[^\W\d_]+")


def keywords_alone(caption: str, words: list[str]) -> bool:
    """Whether ``caption`` holds two words or more and every one is a keyword (any inflection)."""
    found = _WORD.findall(caption)
    coverage = KeywordCoverage(words)
    return len(found) >= 2 and all(coverage.covered(word) for word in found)


def run_keyword_captions(args: argparse.Namespace) -> dict[str, Any]:
    """Every concept set on one Generator; the report (rows and summary)."""
    from cdsl_struct import Generator

    cases = load_cases(args.data, args.limit, args.seed, args.split)
    gen = Generator(args.model)
    rows = []
    try:
        for case in cases:
            words = [c.split("_")[0] for c in case["concepts"]]
            started = time.perf_counter()
            result = gen.generate(INSTRUCTION, schema=CAPTION_SCHEMA, keywords=words, max_tokens=args.max_tokens)
            try:
                caption = json.loads(result.text)["caption"]
            except (ValueError, KeyError, TypeError):
                caption = None
            rows.append({"words": words, "text": result.text, "caption": caption,
                         "covered": list(result.keywords.covered), "finished": result.finish_reason == "stop",
                         "listed": caption is not None and list_shaped(caption, final=True),
                         "alone": caption is not None and keywords_alone(caption, words),
                         "wall_s": round(time.perf_counter() - started, 3)})
            if not args.no_progress:
                print(f"{len(rows)}/{len(cases)} {result.text!r}", flush=True)
    finally:
        gen.close()
    hard = [float(len(r["covered"]) == len(r["words"])) for r in rows]
    good = [float(h and r["finished"] and not r["listed"] and not r["alone"]) for h, r in zip(hard, rows, strict=True)]
    count = max(len(rows), 1)
    summary = {"sets": len(rows), "valid_json": sum(r["caption"] is not None for r in rows),
               "hard_coverage": round(sum(hard) / count, 4), "finished": sum(r["finished"] for r in rows),
               "listed": sum(r["listed"] for r in rows), "keywords_alone": sum(r["alone"] for r in rows),
               "good": sum(good), "good_ci95": quality.bootstrap_ci(good),
               "wall_s": round(sum(r["wall_s"] for r in rows), 2)}
    config = {k: v for k, v in vars(args).items() if k not in ("run", "prog")}
    return {"config": config, "summary": summary, "rows": rows}


def format_table(report: dict[str, Any]) -> str:
    s = report["summary"]
    return ("| sets | valid JSON | hard coverage | finished | lists | keywords alone | good | wall s |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
            f"| {s['sets']} | {s['valid_json']} | {s['hard_coverage']:.3f} | {s['finished']} | {s['listed']} | "
            f"{s['keywords_alone']} | {s['good']:.0f} | {s['wall_s']} |")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks keyword-captions``' options."""
    parser.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--split", default="report", choices=["tune", "report", "all"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    report = run_keyword_captions(args)
    return write_report(report, format_table(report), args)
