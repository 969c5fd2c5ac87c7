"""Which JSON Schemas outlines-core's schema-to-regex enforces without loosening them.

``build_regex_from_schema`` (outlines-core 0.2.14) reads one *dispatch* keyword per schema
object, in the order ``properties, allOf, anyOf, oneOf, prefixItems, enum, const, $ref, type``,
and silently drops the rest of that object; it ignores numeric bounds, ``uniqueItems``,
``patternProperties`` and more; it treats ``oneOf`` as ``anyOf``; and a few constructs (a ``{}``
property schema, ``pattern`` text, ``uri``/``email`` formats, deep ``$ref`` chains) can even
yield invalid JSON. Any of these would accept output the schema forbids, so this module finds
them first and the backend refuses the schema by name. What passes is enforced either exactly
or more strictly (outlines-core fixes property order and closes objects without
``additionalProperties``); stricter costs validity of some outputs, never correctness.

The rules come from probe schemas compiled with outlines-core 0.2.14, checking whether
instances that break each keyword still match the regex.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from ...errors import UnsupportedFeature

DISPATCH_ORDER = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")
# Keywords that describe without constraining; unknown keywords are annotations too.
ANNOTATIONS = frozenset({
    "$schema", "$id", "id", "$anchor", "$comment", "$defs", "definitions", "title", "description",
    "default", "examples", "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType",
    "$vocabulary", "nullable",
})
VALIDATION_KEYWORDS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "contains", "items", "prefixItems", "additionalItems", "unevaluatedItems",
    "maxProperties", "minProperties", "required", "dependentRequired", "dependencies", "dependentSchemas",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "unevaluatedProperties",
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
})
# Keywords honoured beside ``type``, per declared type.
WITH_TYPE: dict[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength", "format"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "object": frozenset({"additionalProperties", "minProperties"}),
}
SAFE_FORMATS = frozenset({"uuid"})  # "date" has no calendar check: 2024-02-30 passes
MAX_REF_DEPTH = 3  # outlines-core's default max_recursion_depth
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def check_schema_supported(schema: Any) -> None:
    """Raise ``UnsupportedFeature`` naming the first construct outlines-core would not enforce."""
    problem = _Checker(schema).first_problem(schema, "#", ())
    if problem is not None:
        feature, where, why = problem
        raise UnsupportedFeature(
            f"outlines-core does not enforce {feature} (at {where}: {why}); use backend='llguidance' or 'auto'",
            feature=feature, backend="outlines-core",
        )


class _Checker:
    def __init__(self, root: Any) -> None:
        self.root = root

    def first_problem(self, schema: Any, where: str, refs: tuple[str, ...]) -> tuple[str, str, str] | None:
        if schema is True or schema is False or not isinstance(schema, dict):
            return None if where == "#" else ("boolean subschema", where, "true/false schemas are not compiled")
        validation = [k for k in schema if k in VALIDATION_KEYWORDS]
        if not validation:
            return None if where == "#" else ("empty subschema {}", where, "an any-value schema breaks the regex")
        dispatch = next((k for k in DISPATCH_ORDER if k in schema), None)
        if dispatch is None:
            return ("constraints without a type", where, f"{validation[0]} needs a type or a combinator")
        problem = self._siblings(schema, dispatch, validation, where) or self._local(schema, dispatch, where)
        if problem:
            return problem
        return self._children(schema, dispatch, where, refs)

    def _siblings(self, schema: dict, dispatch: str, validation: list[str], where: str):
        others = [k for k in validation if k != dispatch]
        if dispatch in ("enum", "const"):
            values = schema["enum"] if dispatch == "enum" else [schema["const"]]
            siblings = {k: schema[k] for k in others}
            if siblings and not all(_valid(value, siblings) for value in values):
                return (f"{dispatch} beside {others[0]}", where, "the sibling keyword would be dropped")
            return None
        if dispatch == "properties":
            allowed = {"type", "required", "additionalProperties"}
            if schema.get("minProperties", 0) <= len(schema.get("required", [])):
                allowed.add("minProperties")  # implied by the required names
        elif dispatch == "type":
            declared = schema["type"]
            allowed = set(WITH_TYPE.get(declared, ())) if isinstance(declared, str) else set()
        elif dispatch == "prefixItems":
            allowed = {"type"} | ({"items"} if schema.get("items") is False else set())
        else:
            allowed = set()
        for keyword in others:
            if keyword not in allowed:
                return (keyword, where, f"dropped beside {dispatch}")
        return None

    def _local(self, schema: dict, dispatch: str, where: str):
        if dispatch == "properties":
            properties = schema["properties"]
            for name in properties:
                if _NEEDS_ESCAPE.search(name):
                    return ("property names needing JSON escapes", where, repr(name))
            missing = [n for n in schema.get("required", []) if n not in properties]
            if missing:
                return ("required names outside properties", where, ", ".join(missing))
            if schema.get("type", "object") != "object":
                return ("properties beside a non-object type", where, "the type would be dropped")
        if schema.get("minProperties", 0) > 1 or "maxProperties" in schema:
            return ("minProperties/maxProperties", where, "only minProperties <= 1 is enforced")
        if dispatch == "allOf" and len(schema["allOf"]) != 1:
            return ("allOf", where, "several allOf branches are concatenated")
        if dispatch == "oneOf" and not _disjoint_by_type(schema["oneOf"]):
            return ("oneOf", where, "branches that may overlap are treated as anyOf")
        if dispatch == "type" and schema["type"] == "string":
            kinds = ("minLength" in schema or "maxLength" in schema) + ("format" in schema) + ("pattern" in schema)
            if "pattern" in schema:
                return ("pattern", where, "the pattern is pasted into the string regex unchecked")
            if kinds > 1:
                return ("format with length bounds", where, "only one of them is kept")
            if "format" in schema and schema["format"] not in SAFE_FORMATS:
                return (f"format {schema['format']}", where, "not enforced exactly")
            for bound in ("minLength", "maxLength"):
                if bound in schema and not isinstance(schema[bound], int):
                    return (bound, where, "must be an integer")
        if dispatch == "$ref" and not str(schema["$ref"]).startswith("#"):
            return ("external $ref", where, schema["$ref"])
        return None

    def _children(self, schema: dict, dispatch: str, where: str, refs: tuple[str, ...]):
        children: list[tuple[Any, str, tuple[str, ...]]] = []
        if dispatch == "properties":
            children += [(s, f"{where}/properties/{n}", refs) for n, s in schema["properties"].items()]
        if dispatch in ("allOf", "anyOf", "oneOf", "prefixItems"):
            children += [(s, f"{where}/{dispatch}/{i}", refs) for i, s in enumerate(schema[dispatch])]
        if dispatch == "type":
            if isinstance(schema.get("items"), dict):
                children.append((schema["items"], f"{where}/items", refs))
            elif "items" in schema:
                return ("items that is not a schema object", where, "tuple or boolean items")
            if isinstance(schema.get("additionalProperties"), dict):
                children.append((schema["additionalProperties"], f"{where}/additionalProperties", refs))
        if dispatch == "$ref":
            pointer = schema["$ref"]
            if pointer in refs:
                return ("recursive $ref", where, pointer)
            if len(refs) >= MAX_REF_DEPTH:
                return ("$ref chains deeper than 3", where, " -> ".join((*refs, pointer)))
            target = _resolve(self.root, pointer)
            if target is None:
                return ("unresolvable $ref", where, pointer)
            children.append((target, pointer, (*refs, pointer)))
        for child, child_where, child_refs in children:
            found = self.first_problem(child, child_where, child_refs)
            if found:
                return found
        return None


def _resolve(root: Any, pointer: str) -> Any:
    node = root
    for part in [p for p in pointer.lstrip("#").split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    except jsonschema.SchemaError:
        return False
    return True


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
