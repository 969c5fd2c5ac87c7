"""Which JSON Schema keywords outlines-core's schema-to-regex honours exactly.

``build_regex_from_schema`` drops keywords it does not implement (``minimum``, ``uniqueItems``,
``patternProperties``...) and treats ``oneOf`` as ``anyOf``, which would accept invalid output.
This module finds such keywords first so the backend can refuse the schema by name instead.
Keywords that only describe (``title``, ``examples``...) and unknown extension keywords are
annotations in JSON Schema and impose nothing, so they are fine to ignore.

The lists were established by compiling probe schemas with outlines-core 0.2.14 and checking
whether instances that break each keyword still match the regex.
"""

from __future__ import annotations

from typing import Any

from ...errors import UnsupportedFeature

# Validation keywords outlines-core ignores, grouped by the instance type they constrain.
_IGNORED_BY_TYPE: dict[str, frozenset[str]] = {
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    "array": frozenset({"uniqueItems", "contains", "minContains", "maxContains", "additionalItems",
                        "unevaluatedItems"}),
    "object": frozenset({"maxProperties", "patternProperties", "propertyNames", "dependentRequired",
                         "dependencies", "dependentSchemas", "unevaluatedProperties"}),
}
# Keywords that constrain any instance and that outlines-core cannot express exactly.
_IGNORED_ALWAYS = frozenset({"not", "if", "then", "else", "$dynamicRef", "$recursiveRef"})

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "contains", "not", "if", "then", "else",
                  "propertyNames", "additionalItems")


def check_schema_supported(schema: Any) -> None:
    """Raise ``UnsupportedFeature`` naming the first keyword outlines-core would not enforce."""
    problem = _first_problem(schema, "#")
    if problem is not None:
        keyword, where = problem
        raise UnsupportedFeature(
            f"outlines-core does not enforce the JSON Schema keyword {keyword!r} (at {where}); "
            "use backend='llguidance' or 'auto'",
            feature=keyword, backend="outlines-core",
        )


def _types_of(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if declared is None:
        return {"number", "array", "object", "string"}
    names = {declared} if isinstance(declared, str) else set(declared)
    if "integer" in names:
        names.add("number")
    return names


def _first_problem(schema: Any, where: str) -> tuple[str, str] | None:
    if not isinstance(schema, dict):
        return None
    types = _types_of(schema)
    for keyword in schema:
        if keyword in _IGNORED_ALWAYS:
            return keyword, where
        for kind, ignored in _IGNORED_BY_TYPE.items():
            if keyword in ignored and kind in types:
                return keyword, where
    if len(schema.get("allOf", [])) > 1:
        return "allOf", where
    if "oneOf" in schema and not _disjoint_by_type(schema["oneOf"]):
        return "oneOf", where
    for key in _SCHEMA_MAPS:
        for name, child in (schema.get(key) or {}).items() if isinstance(schema.get(key), dict) else ():
            found = _first_problem(child, f"{where}/{key}/{name}")
            if found:
                return found
    for key in _SCHEMA_LISTS:
        for number, child in enumerate(schema.get(key) or []):
            found = _first_problem(child, f"{where}/{key}/{number}")
            if found:
                return found
    for key in _SCHEMA_VALUES:
        found = _first_problem(schema.get(key), f"{where}/{key}")
        if found:
            return found
    return None


def _disjoint_by_type(branches: Any) -> bool:
    """``oneOf`` equals ``anyOf`` when no value can match two branches; prove it by ``type``."""
    seen: set[str] = set()
    for branch in branches if isinstance(branches, list) else []:
        declared = branch.get("type") if isinstance(branch, dict) else None
        if not isinstance(declared, str):
            return False
        kinds = {"number", "integer"} if declared in ("number", "integer") else {declared}
        if kinds & seen:
            return False
        seen |= kinds
    return True
