"""JSON value types as JSON Schema sees them (``integer`` is a subset of ``number``)."""

from __future__ import annotations

from typing import Any

ALL_TYPES = ("null", "boolean", "object", "array", "number", "string")


def type_of(value: Any) -> str:
    """The JSON Schema type of a JSON value (integral floats count as ``integer``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def declared_types(schema: Any) -> set[str] | None:
    """The types ``schema``'s own ``type``/``const``/``enum`` allow (``None``: any).

    ``integer`` stays distinct from ``number`` here; use ``overlap`` to compare sets.
    """
    if schema is False:
        return set()
    if not isinstance(schema, dict):
        return None
    allowed: set[str] | None = None
    if "type" in schema:
        t = schema["type"]
        allowed = {t} if isinstance(t, str) else set(t)
    for key in ("const", "enum"):
        if key in schema:
            values = [schema[key]] if key == "const" else list(schema[key])
            found = {type_of(v) for v in values}
            allowed = found if allowed is None else _meet(allowed, found)
    return allowed


def _meet(a: set[str], b: set[str]) -> set[str]:
    out = a & b
    if "integer" in a and "number" in b or "integer" in b and "number" in a:
        out.add("integer")
    return out


def overlap(a: set[str] | None, b: set[str] | None) -> set[str]:
    """The types two declared type sets share (``None`` is every type)."""
    if a is None and b is None:
        return set(ALL_TYPES) | {"integer"}
    if a is None:
        return set(b or ())
    if b is None:
        return set(a)
    return _meet(a, b)


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values as JSON Schema defines it (``1 == 1.0``, ``true != 1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b
