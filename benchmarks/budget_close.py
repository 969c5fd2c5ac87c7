"""Answers at a budget below their natural length: cut against closed (issue 40).

For each extraction task of ``python -m benchmarks quality``'s families (one split), the answer is first decoded
with room to finish (its natural length n, ``on_budget="cut"``), then again at ``max_tokens`` =
50% and 75% of n, once cut and once closed (``on_budget="close"``). Reported per budget: answers
valid under their schema, field accuracy over the fields the answer kept (against the natural
answers' accuracy over all fields), fields kept, tokens over the budget, and wall time. Every
answer is streamed, its typed partial values read as they change (``TextStream.partials``): the
share of answers whose every partial value is consistent with (a prefix of) the final one.

    .venv/bin/python -m benchmarks.budget_close --split report --cases 40 --json benchmarks/results/budget_close.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import jsonschema

from cdsl_struct.api import Generator
from cdsl_struct.partial import consistent_with

from .answer_quality import _lookup, same_value
from .extraction_tasks import family_tasks


def judge(task: Any, result: Any) -> dict[str, Any]:
    """Valid under the schema, and per gold field: kept (present) and correct."""
    value = result.value if result.complete else None
    valid = value is not None
    if valid:
        try:
            jsonschema.validate(value, task.constraint)
        except jsonschema.ValidationError:
            valid = False
    kept = {p: valid and _lookup(value, p) is not None for p in task.fields}
    correct = {p: kept[p] and same_value(_lookup(value, p), gold) for p, gold in task.fields.items()}
    return {"valid": valid, "kept": sum(kept.values()), "correct": sum(correct.values()), "fields": len(task.fields),
            "tokens": len(result.tokens), "closed": result.closed_by_budget}


def decode(gen: Generator, task: Any, max_tokens: int, on_budget: str) -> tuple[Any, dict[str, int]]:
    """One answer, streamed: its Result and how many partial values it gave, and how many of
    those are consistent with the final value (all of them, for a complete answer, or none)."""
    stream = gen.stream(task.prompt, schema=task.constraint, max_tokens=max_tokens, on_budget=on_budget)
    partials = list(stream.partials())
    result = stream.result
    consistent = sum(consistent_with(p, result.value) for p in partials) if result.complete else 0
    return result, {"partials": len(partials), "consistent": consistent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="report", choices=["tune", "report"])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--fractions", default="0.5,0.75")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    tasks = [t for t in family_tasks(args.split, args.cases) if t.kind == "extract"]
    gen = Generator("smollm2", draft="auto", max_batch_size=1, device=args.device)
    rows = []
    seconds: dict[str, float] = {}
    for task in tasks:
        natural, partials = decode(gen, task, 256, "cut")
        row: dict[str, Any] = {"id": task.id, "natural": {**judge(task, natural), **partials}}
        n = len(natural.tokens)
        for fraction in fractions:
            budget = max(1, math.floor(fraction * n))
            for mode in ("cut", "close"):
                started = time.perf_counter()
                result, partials = decode(gen, task, budget, mode)
                key = f"{fraction:g}/{mode}"
                seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - started
                row[key] = {**judge(task, result), **partials, "budget": budget,
                            "over": max(0, len(result.tokens) - budget)}
        rows.append(row)
        print(json.dumps({k: (v if k == "id" else {x: v[x] for x in ("valid", "kept", "correct", "tokens")})
                          for k, v in row.items()}), flush=True)
    gen.close()
    natural_acc = sum(r["natural"]["correct"] for r in rows) / max(sum(r["natural"]["fields"] for r in rows), 1)
    summary: dict[str, Any] = {"tasks": len(rows), "natural": {
        "valid": sum(r["natural"]["valid"] for r in rows), "field_accuracy": round(natural_acc, 4)}}
    complete = [r[k] for r in rows for k in r if k != "id" and r[k]["valid"]]
    summary["partial_values"] = {"answers": len(complete), "values": sum(x["partials"] for x in complete),
                                 "consistent": sum(x["consistent"] for x in complete)}
    for fraction in fractions:
        for mode in ("cut", "close"):
            key = f"{fraction:g}/{mode}"
            runs = [r[key] for r in rows]
            kept = sum(x["kept"] for x in runs)
            summary[key] = {"valid": sum(x["valid"] for x in runs), "closed": sum(x["closed"] for x in runs),
                            "fields_kept": kept, "fields": sum(x["fields"] for x in runs),
                            "accuracy_of_kept": round(sum(x["correct"] for x in runs) / kept, 4) if kept else None,
                            "tokens_over_budget": sum(x["over"] for x in runs), "wall_s": round(seconds[key], 2)}
    print(json.dumps(summary, indent=1))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump({"summary": summary, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
