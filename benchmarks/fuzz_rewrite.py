"""Fuzzing the schema rewriter: do the original and the rewritten schema judge alike?

For a schema and its rewrite, instances come from ``schema_instances`` (drawn near the original
and near the rewrite: objects property by property here, every other schema by
hypothesis-jsonschema's public ``from_schema``), from mutations of those (a key dropped or added, a value or
element replaced by arbitrary JSON) and from arbitrary JSON; ``jsonschema`` judges each under
both schemas, and any instance they disagree on is a counterexample. ``run_fuzz`` does this for
every dev-data case the rewriter changes (``python -m benchmarks fuzz-rewrite``); the tests use
``compare`` on each rule and on a sample of real schemas. Needs the ``dev`` extra (hypothesis).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema

from cdsl_struct.bench import write_report
from cdsl_struct.constraints.schema_rewrite import rewrite_schema
from cdsl_struct.errors import CompileError

JSON_SCALARS = (None, True, False, 0, 1, -1, 2.5, -0.5, 10**6, "", "a", "x y", "0")


#: how the rewriter reads a schema that names no draft: 2020-12 plus draft-07's ``dependencies``
UNDECLARED = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"dependencies": jsonschema.Draft7Validator.VALIDATORS["dependencies"]},
)


#: a draft-04 schema's rewrite is declared draft-07, whose ``integer`` also admits ``1.0``; the
#: rewrite is judged with draft-04's reading of ``integer`` (the engines never write ``1.0`` for
#: an integer, and outputs are validated against the original schema anyway)
DRAFT7_WITH_DRAFT4_TYPES = jsonschema.validators.extend(
    jsonschema.Draft7Validator, type_checker=jsonschema.Draft4Validator.TYPE_CHECKER)


def validator(schema: Any, rewrite_of: Any = None) -> jsonschema.protocols.Validator:
    """The ``jsonschema`` validator ``schema`` declares (see ``UNDECLARED`` when it names none);
    ``rewrite_of``: the original, when ``schema`` is its rewrite."""
    original = rewrite_of if rewrite_of is not None else schema
    if isinstance(original, dict) and "draft-04" in str(original.get("$schema", "")) and rewrite_of is not None:
        return DRAFT7_WITH_DRAFT4_TYPES(schema)
    cls = jsonschema.validators.validator_for(schema, default=UNDECLARED)
    return cls(schema)


def json_values() -> Any:
    """A hypothesis strategy of arbitrary JSON values, small."""
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(
        allow_nan=False, allow_infinity=False, width=32) | st.text(max_size=6)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=8)


def mutated(draw: Any, value: Any, names: list[str], constants: list[Any]) -> Any:
    """``value`` with one random change drawn by ``draw`` (a hypothesis ``data().draw``):
    values come from ``constants`` (those the schemas mention) or arbitrary JSON, new keys
    from ``names``."""
    from hypothesis import strategies as st

    replacement = st.sampled_from(constants) | json_values() if constants else json_values()
    if isinstance(value, dict) and (value or names):
        if not value or draw(st.integers(0, 4)) == 0:
            key = draw(st.sampled_from(names) if names else st.text(max_size=4))
            return {**value, key: draw(replacement)}
        key = draw(st.sampled_from(sorted(value)))
        choice = draw(st.integers(0, 3))
        out = dict(value)
        if choice == 0:
            del out[key]
        elif choice == 1:
            out[key] = draw(replacement)
        elif choice == 2:
            out[key] = mutated(draw, out[key], names, constants)
        else:
            out[draw(st.sampled_from(names) if names else st.text(max_size=4))] = draw(replacement)
        return out
    if isinstance(value, list) and value:
        index = draw(st.integers(0, len(value) - 1))
        choice = draw(st.integers(0, 2))
        out = list(value)
        if choice == 0:
            del out[index]
        elif choice == 1:
            out[index] = mutated(draw, out[index], names, constants)
        else:
            out.append(draw(st.sampled_from(out) | replacement))
        return out
    return draw(st.sampled_from(JSON_SCALARS) | replacement)


def schema_constants(schema: Any, found: list[Any] | None = None) -> list[Any]:
    """Values a schema mentions (``const``, ``enum``, numeric bounds and their neighbours)."""
    found = [] if found is None else found
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "const":
                found.append(value)
            elif key == "enum" and isinstance(value, list):
                found.extend(value)
            elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") and \
                    isinstance(value, (int, float)) and not isinstance(value, bool):
                found.extend([value - 1, value, value + 1, value + 0.5])
            elif key not in ("default", "examples"):
                schema_constants(value, found)
    elif isinstance(schema, list):
        for value in schema:
            schema_constants(value, found)
    unique: list[Any] = []
    for value in found:
        if not any(type(value) is type(seen) and value == seen for seen in unique):
            unique.append(value)
    return unique


def property_names(schema: Any, found: set[str] | None = None) -> list[str]:
    """Every property name a schema mentions (mutations add them to objects)."""
    found = set() if found is None else found
    if isinstance(schema, dict):
        for key in ("properties", "dependentRequired", "dependentSchemas", "dependencies"):
            if isinstance(schema.get(key), dict):
                found.update(schema[key])
        for name in schema.get("required", []) if isinstance(schema.get("required"), list) else []:
            if isinstance(name, str):
                found.add(name)
        for value in schema.values():
            property_names(value, found)
    elif isinstance(schema, list):
        for value in schema:
            property_names(value, found)
    return sorted(found)


_OBJECT_KEYS = ("properties", "required", "patternProperties", "additionalProperties", "minProperties",
                "maxProperties", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames")
_MAX_DEPTH = 6


def _guarded(strategy: Any) -> Any:
    """``strategy``, or arbitrary JSON where drawing from it raises (``from_schema`` defers its
    errors to draw time, and cannot draw some schemas at all)."""
    from hypothesis import strategies as st

    @st.composite
    def draw_guarded(draw: Any) -> Any:
        try:
            return draw(strategy)
        except Exception:  # noqa: BLE001 - what it cannot draw, arbitrary JSON stands in for
            return draw(json_values())

    return draw_guarded()


def _resolve(schema: Any, root: Any) -> Any:
    """A local ``$ref`` (``#/definitions/x``, ``#/$defs/x``, ``#``) of ``root`` resolved; else None."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    target = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


def _is_object_schema(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind is not None:
        return kind == "object" or (isinstance(kind, list) and "object" in kind)
    return any(key in schema for key in _OBJECT_KEYS)


def schema_instances(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A hypothesis strategy of instances drawn near ``schema`` (``root``: the document its local
    ``$ref`` s point into). Objects, arrays of them, local references and ``anyOf`` / ``oneOf`` /
    ``allOf`` are drawn here (property by property, optional ones sometimes left out); every other
    schema by hypothesis-jsonschema's public ``from_schema``. Instances need not be valid: the
    fuzz judges each under both schemas."""
    from hypothesis import strategies as st
    from hypothesis_jsonschema import from_schema

    root = schema if root is None else root
    if schema is False:
        return st.nothing()
    if depth > _MAX_DEPTH or not isinstance(schema, (dict, bool)):
        return json_values()
    if isinstance(schema, dict):
        target = _resolve(schema, root)
        if target is not None:
            return schema_instances(target, root, depth + 1)
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf", "allOf", "$ref")}
        branches = [b for key in ("anyOf", "oneOf") if isinstance(schema.get(key), list) for b in schema[key]]
        if branches:
            return st.one_of([schema_instances({**rest, **b} if isinstance(b, dict) else b, root, depth + 1)
                              for b in branches])
        if isinstance(schema.get("allOf"), list):
            merged = dict(rest)
            for part in schema["allOf"]:
                part = _resolve(part, root) or part
                if isinstance(part, dict):
                    for key, value in part.items():
                        if key == "properties" and isinstance(value, dict):
                            merged["properties"] = {**merged.get("properties", {}), **value}
                        elif key == "required" and isinstance(value, list):
                            merged["required"] = sorted(set(merged.get("required", [])) | set(value))
                        else:
                            merged.setdefault(key, value)
            return schema_instances(merged, root, depth + 1)
        if _is_object_schema(schema):
            return _object_instances(schema, root, depth)
        items = schema.get("items")
        if schema.get("type") == "array" and isinstance(items, dict):
            low = schema.get("minItems", 0) if isinstance(schema.get("minItems"), int) else 0
            high = schema.get("maxItems") if isinstance(schema.get("maxItems"), int) else low + 4
            return st.lists(schema_instances(items, root, depth + 1), min_size=low, max_size=max(low, min(high, 8)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # a copy: hypothesis-jsonschema canonicalises in place (enum [x] -> const x, which a
            # draft-04 reader would then ignore)
            strategy = from_schema(copy.deepcopy(schema), allow_x00=True, codec=None)
    except Exception:  # noqa: BLE001 - a schema it refuses outright: arbitrary JSON instead
        return json_values()
    # an unsatisfiable schema is ``nothing()``: left bare, for ``one_of`` to leave out (guarded, every draw is rejected)
    return strategy if strategy is st.nothing() else _guarded(strategy)


def _object_instances(schema: dict[str, Any], root: Any, depth: int) -> Any:
    """Objects with every required key and each other declared property or not, values drawn near
    their schemas (a key without one: arbitrary JSON)."""
    from hypothesis import strategies as st

    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [k for k in schema.get("required", []) if isinstance(k, str)] \
        if isinstance(schema.get("required"), list) else []
    values = {key: schema_instances(properties[key], root, depth + 1) if key in properties else json_values()
              for key in dict.fromkeys([*required, *properties])}

    @st.composite
    def draw_object(draw: Any) -> dict[str, Any]:
        return {key: draw(value) for key, value in values.items() if key in required or draw(st.booleans())}

    return draw_object()


def instance_strategy(original: Any, rewritten: Any) -> Any:
    """Instances from both schemas, mutated or not, and arbitrary JSON."""
    from hypothesis import strategies as st

    sources = [json_values(), schema_instances(original), schema_instances(rewritten)]
    names = property_names(original)
    constants = schema_constants([original, rewritten])
    if constants:
        sources.append(st.sampled_from(constants))

    @st.composite
    def draw_instance(draw: Any) -> Any:
        value = draw(st.one_of(*sources))
        return mutated(draw, value, names, constants) if draw(st.booleans()) else value

    return draw_instance()


def compare(original: Any, rewritten: Any, examples: int = 100, seed: int = 0) -> dict[str, Any]:
    """Fuzz one pair: ``{"instances", "valid", "mismatches": [instance, ...]}``."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    check_original, check_rewritten = validator(original), validator(rewritten, rewrite_of=original)
    stats: dict[str, Any] = {"instances": 0, "valid": 0, "mismatches": []}

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(instance_strategy(original, rewritten))
    def run(instance: Any) -> None:
        verdict = check_original.is_valid(instance)
        stats["instances"] += 1
        stats["valid"] += verdict
        if verdict != check_rewritten.is_valid(instance) and len(stats["mismatches"]) < 5:
            stats["mismatches"].append(instance)

    run()
    return stats


def run_fuzz(cases: list[dict[str, Any]], examples: int = 100, seed: int = 0) -> dict[str, Any]:
    """Fuzz the rewrite of every case it changes; also replay the case's own test instances."""
    started = time.perf_counter()
    totals: Counter = Counter()
    failures: list[dict[str, Any]] = []
    for case in cases:
        try:
            rewrite = rewrite_schema(case["schema"])
        except CompileError:
            totals["refused"] += 1
            continue
        if not rewrite.rules:
            totals["unchanged"] += 1
            continue
        totals["rewritten"] += 1
        try:
            stats = compare(case["schema"], rewrite.schema, examples=examples, seed=seed)
            shipped = [t["data"] for t in case.get("tests", [])]
            check_original = validator(case["schema"])
            check_rewritten = validator(rewrite.schema, rewrite_of=case["schema"])
            replay = [x for x in shipped if check_original.is_valid(x) != check_rewritten.is_valid(x)]
        except Exception as exc:  # noqa: BLE001 - jsonschema itself fails on some schemas (a draft-04
            # ``id`` that is an object): no verdict to compare, counted and named
            totals["unjudgeable"] += 1
            failures.append({"id": case["id"], "rules": list(rewrite.rules), "unjudgeable": repr(exc)[:200]})
            continue
        totals["instances"] += stats["instances"] + len(shipped)
        totals["valid_instances"] += stats["valid"]
        if stats["mismatches"] or replay:
            failures.append({"id": case["id"], "rules": list(rewrite.rules),
                             "instances": [json.dumps(x)[:200] for x in (stats["mismatches"] + replay)[:3]]})
    mismatching = sum(1 for f in failures if "instances" in f)
    return {"summary": {**totals, "mismatching_cases": mismatching,
                        "wall_s": round(time.perf_counter() - started, 1)}, "failures": failures}


def load_rewrite_cases(data: str | Path, split: str | None, limit: int | None) -> list[dict[str, Any]]:
    """Dev cases (optionally one split) whose schema the first engine refuses or not: all of them;
    the rewriter is judged on every schema it changes."""
    from cdsl_struct.bench.maskbench import load_cases, split_of

    cases = load_cases(data)
    if split:
        cases = [c for c in cases if split_of(c["id"]) == split]
    return cases[:limit] if limit else cases


def add_arguments(parser: Any) -> None:
    """The ``python -m benchmarks fuzz-rewrite`` options."""
    parser.add_argument("--data", required=True, help="a .jsonl(.gz) file or a folder of them (MaskBench cases)")
    parser.add_argument("--split", choices=["tune", "report"], default=None, help="one deterministic half only")
    parser.add_argument("--limit", type=int, default=None, help="the first N cases (of the split)")
    parser.add_argument("--examples", type=int, default=100, help="hypothesis examples per rewritten schema")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run_from_args(args: Any) -> tuple[dict[str, Any], str]:
    """Run the fuzz bench from parsed CLI options; (report, table)."""
    cases = load_rewrite_cases(args.data, args.split, args.limit)
    report = run_fuzz(cases, examples=args.examples, seed=args.seed)
    summary = report["summary"]
    table = "\n".join(f"{key:<20}  {value}" for key, value in summary.items())
    return report, table


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    return write_report(*run_from_args(args), args)
