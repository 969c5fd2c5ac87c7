"""Proofs that two schemas admit no common instance (so ``oneOf`` over them is ``anyOf``).

Sound, not complete: a ``True`` answer is a proof, ``False`` means "not proven". Dropping some
of a schema's constraints only widens it, so the proofs may read a simplified view of each
schema (its ``allOf`` members and ``$ref`` target merged, first keyword wins).
"""

from __future__ import annotations

from typing import Any

import jsonschema
from referencing.exceptions import Unresolvable

from ...errors import UnsupportedFeature
from .context import RewriteContext, Schema
from .jsontypes import declared_types, overlap

_MAX_DEPTH = 8


def disjoint(a: Schema, b: Schema, ctx: RewriteContext, depth: int = 0) -> bool:
    """Whether no JSON value is valid under both ``a`` and ``b`` (proven)."""
    if a is False or b is False:
        return True
    if a is True or b is True or depth > _MAX_DEPTH:
        return False
    flat_a, flat_b = _flatten(a, ctx), _flatten(b, ctx)
    if flat_a is None or flat_b is None:
        return False
    for one, other in ((flat_a, flat_b), (flat_b, flat_a)):
        branches = one.get("anyOf")
        if isinstance(branches, list) and all(disjoint(br, other, ctx, depth + 1) for br in branches):
            return True
        if _values_fail(one, other, ctx):
            return True
    common = overlap(declared_types(flat_a), declared_types(flat_b))
    if "number" in common:
        common.discard("integer")
    return all(_disjoint_as(kind, flat_a, flat_b, ctx, depth) for kind in common)


def _flatten(schema: Schema, ctx: RewriteContext, seen: int = 0) -> dict | None:
    """``schema`` with its ``allOf`` members and ``$ref`` target merged in (first key wins)."""
    if schema is True:
        return {}
    if schema is False or not isinstance(schema, dict) or seen > _MAX_DEPTH:
        return None if schema is not True else {}
    merged = {k: v for k, v in schema.items() if k not in ("allOf", "$ref")}
    parts: list[Any] = list(schema.get("allOf") or [])
    if "$ref" in schema:
        try:
            parts.append(ctx.resolve(schema["$ref"], "oneOf"))
        except UnsupportedFeature:
            pass  # an unreadable part is a constraint dropped: still sound
    for part in parts:
        if part is False:
            return {"const": None, "type": []}
        flat = _flatten(part, ctx, seen + 1)
        for key, value in (flat or {}).items():
            merged.setdefault(key, value)
    return merged


def _values_fail(one: dict, other: dict, ctx: RewriteContext) -> bool:
    """``one`` admits only listed values (``const``/``enum``) and ``other`` rejects each of them."""
    if "const" in one:
        values = [one["const"]]
    elif isinstance(one.get("enum"), list):
        values = one["enum"]
    else:
        return False
    root = ctx.root if isinstance(ctx.root, dict) else {}
    validator = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)(root)
    try:
        checker = validator.evolve(schema=other)
        return not any(checker.is_valid(v) for v in values)
    except (Unresolvable, jsonschema.SchemaError):  # an unreadable check proves nothing
        return False


def _disjoint_as(kind: str, a: dict, b: dict, ctx: RewriteContext, depth: int) -> bool:
    """Whether no value of JSON type ``kind`` is valid under both."""
    if kind == "object":
        return _objects_disjoint(a, b, ctx, depth)
    if kind == "string":
        return _ranges_disjoint(a, b, "minLength", "maxLength")
    if kind == "array":
        return _ranges_disjoint(a, b, "minItems", "maxItems")
    if kind in ("number", "integer"):
        return _numbers_disjoint(a, b)
    return False


def _objects_disjoint(a: dict, b: dict, ctx: RewriteContext, depth: int) -> bool:
    if _ranges_disjoint(a, b, "minProperties", "maxProperties"):
        return True
    for one, other in ((a, b), (b, a)):
        required = one.get("required") or []
        for name in required:
            if _forbids(other, name):
                return True
            mine, theirs = _property(one, name), _property(other, name)
            if mine is not None and theirs is not None and disjoint(mine, theirs, ctx, depth + 1):
                return True
    return False


def _property(schema: dict, name: str) -> Schema | None:
    props = schema.get("properties")
    return props.get(name) if isinstance(props, dict) else None


def _forbids(schema: dict, name: str) -> bool:
    """``schema`` admits no object that has property ``name``."""
    if _property(schema, name) is False:
        return True
    declared = name in (schema.get("properties") or {})
    return (not declared and schema.get("additionalProperties") is False
            and not schema.get("patternProperties"))


def _ranges_disjoint(a: dict, b: dict, low: str, high: str) -> bool:
    for one, other in ((a, b), (b, a)):
        if isinstance(one.get(low), int) and isinstance(other.get(high), int) and one[low] > other[high]:
            return True
    return False


def _numbers_disjoint(a: dict, b: dict) -> bool:
    for one, other in ((a, b), (b, a)):
        low, low_open = _bound(one, "minimum", "exclusiveMinimum")
        high, high_open = _bound(other, "maximum", "exclusiveMaximum")
        if low is not None and high is not None and (low > high or low == high and (low_open or high_open)):
            return True
    return False


def _bound(schema: dict, inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    value = schema.get(exclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value, True
    value = schema.get(inclusive)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value, False
    return None, False
