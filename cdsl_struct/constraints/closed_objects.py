"""Objects closed to undeclared properties: the default for JSON answers and tool arguments.

A schema object that lists ``properties`` but says nothing of ``additionalProperties`` admits
any extra key, and small models use that freedom to invent keys until they run out of tokens.
``close_objects`` adds ``"additionalProperties": false`` to such objects. Every output of the
closed schema is valid under the original (it only removes instances), so answers stay valid
for the user's schema.

The rule is applied in one place, ``compile()`` (``closed_spec``), so every path that compiles a
constraint closes objects the same way: ``cs.compile``, ``generate()`` / ``Generator``, the
server, bulk jobs, the transformers processor and the vLLM processor. ``compile(...,
extra_properties=True)``, ``Generator(extra_properties=True)`` and ``serve
--allow-extra-properties`` keep schemas as given. A spec that embeds schemas of its own (the tool
calls grammar) offers ``with_closed_objects()``, which ``closed_spec`` calls.

An object is left open where closing it could reject what the schema means to allow: one that
already says how to treat other keys (``additionalProperties``, ``patternProperties``,
``unevaluatedProperties``), one combined with ``allOf``/``$ref``/``if``/``dependentSchemas``
(whose properties it cannot see), a direct branch of an ``allOf``, and any definition referenced
from inside an ``allOf``.

Subschemas where a narrower schema would admit *more* are left exactly as given, with every
definition they refer to: ``not`` and ``if`` (closing a condition makes it fail for objects with
other keys, so ``then`` no longer applies), ``contains`` (``maxContains`` counts matches), and the
branches of a ``oneOf`` (an object matching two open branches is refused; closed, it may match one),
except where the branches are told apart by one required constant property, as pydantic's
discriminated unions are: those stay disjoint when closed.
"""

from __future__ import annotations

from typing import Any

from .specs import ConstraintSpec, JsonSchema

_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("additionalProperties", "items", "then", "else", "propertyNames",
                  "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_AS_GIVEN = ("not", "if", "contains")
"""Subschemas closing could widen the schema through: kept as given (``oneOf``: see ``_disjoint``)."""
_OPEN_SIBLINGS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "$ref", "if",
                  "dependentSchemas", "dependencies")


def closed_spec(spec: ConstraintSpec) -> ConstraintSpec:
    """``spec`` with its JSON objects closed to undeclared keys: a ``JsonSchema`` through
    ``close_objects`` (its ``model`` kept), a spec with a ``with_closed_objects()`` method through
    that, any other spec as it is. ``spec`` itself comes back when closing changes nothing."""
    if isinstance(spec, JsonSchema):
        closed = close_objects(spec.schema)
        return spec if closed == spec.schema else JsonSchema(closed, model=spec.model)
    close = getattr(spec, "with_closed_objects", None)
    return close() if callable(close) else spec


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` with undeclared properties forbidden where that is safe (see module doc)."""
    if not isinstance(schema, dict):
        return schema
    as_given = _referenced(schema, _as_given_parts(schema, schema))
    if "#" in as_given:  # the whole schema is referred to from where it must stay as given
        return schema
    keep_open = _referenced(schema, [b for node in _nodes(schema) for b in _all_of(node)]) | as_given
    return _close(schema, schema, keep_open, as_given, in_all_of=False, path="#")


def _close(root: dict[str, Any], node: Any, keep_open: set[str], as_given: set[str], *, in_all_of: bool,
           path: str) -> Any:
    if isinstance(node, list):
        return [_close(root, item, keep_open, as_given, in_all_of=False, path=path) for item in node]
    if not isinstance(node, dict) or path in as_given:
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _AS_GIVEN or (key == "oneOf" and not _disjoint(root, value)):
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _close(root, sub, keep_open, as_given, in_all_of=False, path=f"{path}/{key}/{name}")
                        for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_close(root, sub, keep_open, as_given, in_all_of=key == "allOf", path=path) for sub in value]
        elif key in _SCHEMA_VALUES and isinstance(value, dict):
            out[key] = _close(root, value, keep_open, as_given, in_all_of=False, path=path)
        else:
            out[key] = value
    declares = isinstance(node.get("properties"), dict) and node["properties"]
    if declares and not in_all_of and path not in keep_open and not any(k in node for k in _OPEN_SIBLINGS):
        out["additionalProperties"] = False
    return out


def _disjoint(root: dict[str, Any], branches: Any) -> bool:
    """True if every branch of a ``oneOf`` requires one property, the same in all, to be a constant
    of its own (a discriminated union): no object matches two of them, open or closed."""
    if not isinstance(branches, list) or not branches:
        return False
    resolved = [_resolve(root, b["$ref"]) if isinstance(b, dict) and isinstance(b.get("$ref"), str) else b
                for b in branches]
    if not all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in resolved):
        return False
    for name in resolved[0].get("required", []):
        values = [_constant(b["properties"].get(name)) if name in b.get("required", []) else None for b in resolved]
        if all(v is not None for v in values) and len({repr(v) for v in values}) == len(values):
            return True
    return False


def _constant(schema: Any) -> tuple[Any] | None:
    """``(value,)`` when ``schema`` admits exactly one value (``const`` or a one-item ``enum``)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return (schema["const"],)
    enum = schema.get("enum")
    return (enum[0],) if isinstance(enum, list) and len(enum) == 1 else None


def _nodes(node: Any) -> list[dict[str, Any]]:
    """Every dict in ``node``, itself included."""
    if isinstance(node, dict):
        return [node, *(n for value in node.values() for n in _nodes(value))]
    if isinstance(node, list):
        return [n for item in node for n in _nodes(item)]
    return []


def _all_of(node: dict[str, Any]) -> list[Any]:
    return node["allOf"] if isinstance(node.get("allOf"), list) else []


def _as_given_parts(root: dict[str, Any], node: Any) -> list[Any]:
    """The subschemas of ``node`` that ``_close`` keeps as given."""
    return [value for n in _nodes(node) for key, value in n.items()
            if key in _AS_GIVEN or (key == "oneOf" and not _disjoint(root, value))]


def _refs(node: Any) -> list[str]:
    return [n["$ref"] for n in _nodes(node) if isinstance(n.get("$ref"), str)]


def _referenced(schema: dict[str, Any], parts: list[Any]) -> set[str]:
    """JSON pointers (``#/$defs/x``) of the definitions ``parts`` refer to, transitively."""
    found = {ref for part in parts for ref in _refs(part) if ref == "#" or ref.startswith("#/")}
    pending = list(found)
    while pending:  # a definition reached from there may refer to others
        for ref in _refs(_resolve(schema, pending.pop())):
            if (ref == "#" or ref.startswith("#/")) and ref not in found:
                found.add(ref)
                pending.append(ref)
    return found


def _resolve(schema: dict[str, Any], pointer: str) -> Any:
    node: Any = schema
    for part in pointer[2:].split("/") if pointer != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
