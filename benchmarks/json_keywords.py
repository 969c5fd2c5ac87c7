"""``python -m benchmarks json-keywords``: hard and soft constraints together.

Every output must be one JSON object valid under ``LISTING_SCHEMA`` (a hard constraint: a title
and a one-sentence description, both bounded), and its strings should name the keywords of a
CommonGen concept set (a soft one: the keyword-coverage reward, repeats beyond two counting
against it). Built from CommonGen concept sets so that it is reproducible; the ``report`` split
by default. Greedy, CDLH and CDSL (the CommonGen defaults) run interleaved per case; reported:
validity (parsed and valid under the schema; the constraint makes it 100% of complete outputs),
keyword coverage of the string values (hard and soft, with bootstrap intervals), wall time and
target passes. Each output is one request alone on the batched engine, on the runner ``Generator``
and ``serve`` use, with no prefix cache (as ``benchmarks/commongen.py``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonschema

from cdsl_struct.bench import write_report
from cdsl_struct.constraints import JsonSchema, compile
from cdsl_struct.decoding import CDSL, CDSL_STATES, BatchEngine, Request
from cdsl_struct.models import ModelRunner, batch_runner, load_model, self_draft
from cdsl_struct.rewards import KeywordCoverage

from . import quality
from .commongen import METHODS, CommonGenConfig, load_cases, make_strategy

LISTING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "pattern": "^[A-Z][a-z]*( [a-z]{1,14}){0,5}$"},
        "description": {"type": "string", "pattern": "^[A-Z][a-z]*( [a-z]{1,14},?){2,16}[.]$"},
    },
    "required": ["title", "description"],
    "additionalProperties": False,
}
PROMPT = ("Write a JSON object for a photo caption with a short \"title\" and a one-sentence \"description\". "
          "Use all of these words: {words}.")


@dataclass
class JsonKeywordsConfig:
    limit: int | None = 20
    seed: int = 0
    split: str = "report"
    methods: tuple[str, ...] = METHODS
    max_tokens: int = 96
    max_repeats: int = 2
    decoding: CommonGenConfig | None = None
    """CDLH / CDSL settings (default: ``CommonGenConfig()``'s)."""


def string_values(value: Any) -> list[str]:
    """Every string inside a JSON value (keys excluded)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in string_values(v)]
    if isinstance(value, list):
        return [s for v in value for s in string_values(v)]
    return []


def run_json_keywords(data: str | Path | None, config: JsonKeywordsConfig, progress: bool = True,
                      schema: dict[str, Any] | None = None,
                      cases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Decode every case with each method under the schema, steered by keyword coverage.
    ``cases`` (``{"concepts": [...]}`` each) replaces reading ``data``."""
    import tqdm

    schema = schema or LISTING_SCHEMA
    decoding = replace(config.decoding or CommonGenConfig(), max_repeats=config.max_repeats)
    loaded = load_model(decoding.model)
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else loaded.eos_token_ids[0]
    engine = BatchEngine(batch_runner(loaded.model, pad_token_id=pad, prefix_cache_bytes=0))
    draft_runner = ModelRunner(self_draft(loaded.model, decoding.draft), name=decoding.draft)
    compiled = compile(JsonSchema(schema), tokenizer, eos_token_ids=loaded.eos_token_ids, backend="llguidance")
    if cases is None:
        if data is None:
            raise ValueError("give a CommonGen file (data) or the cases")
        cases = load_cases(data, config.limit, config.seed, config.split)
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in config.methods}
    states: dict[str, Counter] = {m: Counter() for m in config.methods}
    for case in tqdm.tqdm(cases, disable=not progress, unit="case"):
        concepts = case["concepts"]
        reward = KeywordCoverage(concepts, max_repeats=config.max_repeats)
        words = ", ".join(c.split("_")[0] for c in concepts)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT.format(words=words)}],
                                               add_generation_prompt=True, tokenize=True)["input_ids"]
        for method in config.methods:
            strategy = make_strategy(method, reward, draft_runner, decoding)
            start = time.perf_counter()
            result = engine.run([Request(tuple(prompt), compiled, max_tokens=config.max_tokens,
                                         strategy=strategy)])[0]
            wall = time.perf_counter() - start
            valid, strings = False, ""
            if result.complete:
                try:
                    value = json.loads(result.text)
                    jsonschema.validate(value, schema)
                    valid, strings = True, " ".join(string_values(value))
                except (json.JSONDecodeError, jsonschema.ValidationError):
                    valid = False
            covered = reward.covered(strings)
            rows[method].append({"concepts": concepts, "text": result.text, "complete": result.complete,
                                 "valid": valid, "covered": covered, "counts": reward.counts(strings),
                                 "wall_s": round(wall, 3), "target_passes": result.stats.target_passes,
                                 "draft_passes": result.stats.draft_passes})
            if isinstance(strategy, CDSL):
                states[method].update(strategy.states)
    engine.close()
    return _report(rows, states, config, schema)


def _report(rows: dict[str, list[dict[str, Any]]], states: dict[str, Counter],
            config: JsonKeywordsConfig, schema: dict[str, Any]) -> dict[str, Any]:
    methods = {}
    for method, cases in rows.items():
        n = max(len(cases), 1)
        hard = [float(len(c["covered"]) == len(c["concepts"])) for c in cases]
        soft = [len(c["covered"]) / len(c["concepts"]) for c in cases]
        complete = [c for c in cases if c["complete"]]
        methods[method] = {
            "cases": len(cases),
            "complete": round(len(complete) / n, 4),
            "valid": round(sum(c["valid"] for c in cases) / n, 4),
            "valid_of_complete": round(sum(c["valid"] for c in complete) / max(len(complete), 1), 4),
            "hard_coverage": round(sum(hard) / n, 4), "hard_coverage_ci95": quality.bootstrap_ci(hard),
            "soft_coverage": round(sum(soft) / n, 4), "soft_coverage_ci95": quality.bootstrap_ci(soft),
            "over_max_repeats": round(sum(max(c["counts"], default=0) > config.max_repeats for c in cases) / n, 4),
            "wall_s": round(sum(c["wall_s"] for c in cases), 2),
            "target_passes": sum(c["target_passes"] for c in cases),
            "draft_passes": sum(c["draft_passes"] for c in cases),
            "states": {s: states[method].get(s, 0) for s in CDSL_STATES} if method == "cdsl" else {},
            "outputs": cases,
        }
    report: dict[str, Any] = {"methods": methods, "schema": schema,
                              "config": {k: v for k, v in vars(config).items() if k != "decoding"}}
    if "cdsl" in methods and "cdlh" in methods:
        report["speedup_cdsl_vs_cdlh"] = round(methods["cdlh"]["wall_s"] / max(methods["cdsl"]["wall_s"], 1e-9), 3)
        report["target_pass_ratio_cdlh_vs_cdsl"] = round(
            methods["cdlh"]["target_passes"] / max(methods["cdsl"]["target_passes"], 1), 3)
    return report


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'method':8s} {'complete':>8s} {'valid':>6s} {'hard':>6s} {'hard 95% CI':>14s} {'soft':>6s} "
             f"{'wall s':>8s} {'passes':>7s} {'draft':>6s}  states"]
    for method, row in report["methods"].items():
        low, high = row["hard_coverage_ci95"]
        lines.append(f"{method:8s} {row['complete']:8.3f} {row['valid']:6.3f} {row['hard_coverage']:6.3f} "
                     f"{f'[{low:.3f}, {high:.3f}]':>14s} {row['soft_coverage']:6.3f} {row['wall_s']:8.1f} "
                     f"{row['target_passes']:7d} {row['draft_passes']:6d}  {row['states'] or ''}")
    for key in ("speedup_cdsl_vs_cdlh", "target_pass_ratio_cdlh_vs_cdsl"):
        if key in report:
            lines.append(f"{key}: {report[key]}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The hard + soft JSON bench's options; defaults are ``JsonKeywordsConfig``'s."""
    c = JsonKeywordsConfig()
    parser.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    parser.add_argument("--limit", type=int, default=c.limit)
    parser.add_argument("--seed", type=int, default=c.seed)
    parser.add_argument("--split", default=c.split, choices=["tune", "report", "all"])
    parser.add_argument("--methods", default=",".join(c.methods), help="comma-separated: greedy, cdlh, cdsl")
    parser.add_argument("--max-tokens", type=int, default=c.max_tokens)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    config = JsonKeywordsConfig(limit=args.limit, seed=args.seed, split=args.split,
                                methods=tuple(args.methods.split(",")), max_tokens=args.max_tokens)
    report = run_json_keywords(args.data, config, progress=not args.no_progress)
    report["summary"] = {}
    return write_report(report, format_table(report), args)
