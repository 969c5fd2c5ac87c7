"""``not`` pushed down to the leaves: a schema equivalent to ``not S`` that uses no ``not``.

``not {k1: v1, k2: v2}`` is ``anyOf [not {k1: v1}, not {k2: v2}]``, one branch per group of
keywords that are read together (``properties`` with ``additionalProperties`` and
``patternProperties``, ``minimum`` with draft-04's boolean ``exclusiveMinimum``...). A keyword
only constrains instances of its own type, so ``not {minimum: 3}`` is "a number below 3":
``{type: number, exclusiveMaximum: 3}``. Keywords whose complement no engine can express
(``multipleOf``, ``uniqueItems``, ``items`` over every element...) are refused by name.
"""

from __future__ import annotations

from typing import Any

from ...errors import UnsupportedFeature
from .context import ASSERTIONS, RewriteContext, Schema, all_of, any_of, refuse
from .jsontypes import ALL_TYPES, type_of
from .regexes import complement_of_strings, literal_alternatives

_TYPE_OF_KEYWORD = {
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number", "exclusiveMaximum": "number",
    "minLength": "string", "maxLength": "string", "pattern": "string",
    "minItems": "array", "maxItems": "array",
    "minProperties": "object", "maxProperties": "object", "required": "object",
}
_OBJECT_GROUP = ("properties", "patternProperties", "additionalProperties")


def negate(schema: Schema, ctx: RewriteContext, keys: frozenset[str] | None = None) -> Schema:
    """A ``not``-free schema admitting exactly what ``schema`` (already normalised) rejects.

    ``keys``: when the instance is known (from its context) to be an object only if its keys are
    among these, "has a key outside ``properties``" is ``anyOf`` over the remaining ones; without
    it that part of ``additionalProperties`` has no positive form.
    """
    ctx.spend("not")
    if schema is True:
        return False
    if schema is False:
        return True
    if not isinstance(schema, dict):
        raise refuse("not", f"cannot negate {schema!r}")
    keywords = [k for k in schema if k in ASSERTIONS and k not in ("then", "else")]
    branches: list[Schema] = []
    done: set[str] = set()
    for key in keywords:
        if key in done:
            continue
        if key in _OBJECT_GROUP:
            done.update(_OBJECT_GROUP)
            branches.append(_negate_object_shape(schema, ctx, keys))
        else:
            done.add(key)
            branches.append(_negate_keyword(key, schema[key], schema, ctx, keys))
    return any_of(branches)


def _negate_keyword(key: str, value: Any, schema: dict, ctx: RewriteContext, keys: frozenset[str] | None) -> Schema:
    if key == "type":
        return _negate_type({value} if isinstance(value, str) else set(value))
    if key == "enum":
        return _negate_values(list(value))
    if key == "const":
        return _negate_values([value])
    if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return _negate_bound(key, value, schema)
    if key in ("minLength", "minItems", "minProperties"):
        kind = _TYPE_OF_KEYWORD[key]
        return False if value <= 0 else {"type": kind, key.replace("min", "max"): value - 1}
    if key in ("maxLength", "maxItems", "maxProperties"):
        return {"type": _TYPE_OF_KEYWORD[key], key.replace("max", "min"): value + 1}
    if key == "required":
        return any_of([{"type": "object", "properties": {name: False}} for name in dict.fromkeys(value)])
    if key == "pattern":
        words = literal_alternatives(value)
        if words is None:
            raise refuse("not", f"needs the complement of the pattern {value!r}, which is not a literal")
        return {"type": "string", "pattern": complement_of_strings(words, "not", python_dollar=True)}
    if key == "allOf":
        return any_of([negate(member, ctx, keys) for member in value])
    if key == "anyOf":
        return all_of([negate(member, ctx, keys) for member in value])
    if key == "$ref":
        if value in ctx.negating:
            raise refuse("not", f"of the recursive reference {value!r} has no finite form")
        ctx.negating.add(value)
        try:
            return negate(ctx.resolve(value, "not"), ctx, keys)
        finally:
            ctx.negating.discard(value)
    if key == "items" and isinstance(value, (dict, bool)):
        if value is True or value == {}:
            return False
        raise refuse("not", "of `items` needs `contains`, which the engine lacks")
    if key == "format":
        raise refuse("not", f"needs the complement of format {value!r}")
    raise refuse("not", f"cannot negate `{key}`")


def _negate_type(types: set[str]) -> Schema:
    if "integer" in types and "number" not in types:
        raise refuse("not", "of `integer` needs the non-integral numbers, which the engine cannot express")
    rest = [t for t in ALL_TYPES if t not in types]
    return {"type": rest} if rest else False


def _negate_values(values: list[Any]) -> Schema:
    """Every JSON value not among ``values``."""
    by_type: dict[str, list[Any]] = {}
    for value in values:
        kind = type_of(value)
        by_type.setdefault("number" if kind == "integer" else kind, []).append(value)
    branches: list[Schema] = []
    untouched = [t for t in ALL_TYPES if t not in by_type]
    if untouched:
        branches.append({"type": untouched})
    if "boolean" in by_type:
        seen = set(by_type["boolean"])
        branches.extend({"const": b} for b in (False, True) if b not in seen)
    if "string" in by_type:
        branches.append({"type": "string", "pattern": complement_of_strings(set(by_type["string"]), "not")})
    if "number" in by_type:
        points = sorted(set(by_type["number"]))
        branches.append({"type": "number", "exclusiveMaximum": points[0]})
        branches.extend({"type": "number", "exclusiveMinimum": a, "exclusiveMaximum": b}
                        for a, b in zip(points, points[1:], strict=False) if a != b)
        branches.append({"type": "number", "exclusiveMinimum": points[-1]})
    for kind in ("object", "array"):
        if kind in by_type:
            raise refuse("not", f"of an {kind} in const/enum has no finite complement")
    return any_of(branches)


def _negate_bound(key: str, value: Any, schema: dict) -> Schema:
    if isinstance(value, bool):  # a draft-04 flag: its bound's branch reads it
        return False
    if key == "minimum" and schema.get("exclusiveMinimum") is True:
        return {"type": "number", "maximum": value}
    if key == "maximum" and schema.get("exclusiveMaximum") is True:
        return {"type": "number", "minimum": value}
    opposite = {"minimum": "exclusiveMaximum", "maximum": "exclusiveMinimum",
                "exclusiveMinimum": "maximum", "exclusiveMaximum": "minimum"}[key]
    return {"type": "number", opposite: value}


def _negate_object_shape(schema: dict, ctx: RewriteContext, keys: frozenset[str] | None) -> Schema:
    """``not`` of ``properties`` (+ ``patternProperties``/``additionalProperties``): some declared
    property violates its schema, or (``keys`` known) some other key violates ``additionalProperties``."""
    extra = schema.get("additionalProperties", True)
    declared = schema.get("properties") or {}
    if schema.get("patternProperties") or extra not in (True, {}) and keys is None:
        raise refuse("not", "of `additionalProperties`/`patternProperties` needs `contains` over keys")
    branches = []
    for name, sub in declared.items():
        negated = negate(sub, ctx)
        if negated is not False:
            branches.append({"type": "object", "required": [name], "properties": {name: negated}})
    if extra not in (True, {}):
        negated_extra = negate(extra, ctx)
        for name in sorted((keys or frozenset()) - set(declared)):
            branches.append({"type": "object", "required": [name], "properties": {name: negated_extra}}
                            if negated_extra is not True else {"type": "object", "required": [name]})
    return any_of(branches)


def key_universe(schema: Schema, ctx: RewriteContext, depth: int = 0) -> frozenset[str] | None:
    """The keys an object valid under ``schema`` can have, when ``schema`` bounds them
    (``additionalProperties: false`` without ``patternProperties``, here or in ``allOf``/``$ref``)."""
    if not isinstance(schema, dict) or depth > 4:
        return None
    found: list[frozenset[str]] = []
    if schema.get("additionalProperties") is False and not schema.get("patternProperties"):
        found.append(frozenset(schema.get("properties") or {}))
    parts = list(schema.get("allOf") or [])
    if "$ref" in schema:
        try:
            parts.append(ctx.resolve(schema["$ref"], "not"))
        except UnsupportedFeature:
            pass  # an unreadable part only leaves the universe wider: still sound
    for part in parts:
        inner = key_universe(part, ctx, depth + 1)
        if inner is not None:
            found.append(inner)
    return frozenset.intersection(*found) if found else None
