"""Objects closed to undeclared properties: the default for JSON answers and tool arguments.

A schema object that lists ``properties`` but says nothing of ``additionalProperties`` admits
any extra key, and small models use that freedom to invent keys until they run out of tokens.
``close_objects`` adds ``"additionalProperties": false`` to such objects. Every output of the
closed schema is valid under the original (it only removes instances), so answers stay valid
for the user's schema; ``Generator(extra_properties=True)`` keeps schemas as given.

An object is left open where closing it could reject what the schema means to allow: one that
already says how to treat other keys (``additionalProperties``, ``patternProperties``,
``unevaluatedProperties``), one combined with ``allOf``/``$ref``/``if``/``dependentSchemas``
(whose properties it cannot see), a direct branch of an ``allOf``, and any definition referenced
from inside an ``allOf``.
"""

from __future__ import annotations

from typing import Any

_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
                  "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_OPEN_SIBLINGS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "$ref", "if",
                  "dependentSchemas", "dependencies")


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` with undeclared properties forbidden where that is safe (see module doc)."""
    if not isinstance(schema, dict):
        return schema
    keep_open = _referenced_from_all_of(schema)
    return _close(schema, keep_open, in_all_of=False, path="#")


def _close(node: Any, keep_open: set[str], *, in_all_of: bool, path: str) -> Any:
    if isinstance(node, list):
        return [_close(item, keep_open, in_all_of=False, path=path) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _close(sub, keep_open, in_all_of=False, path=f"{path}/{key}/{name}")
                        for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_close(sub, keep_open, in_all_of=key == "allOf", path=path) for sub in value]
        elif key in _SCHEMA_VALUES and isinstance(value, dict):
            out[key] = _close(value, keep_open, in_all_of=False, path=path)
        else:
            out[key] = value
    declares = isinstance(node.get("properties"), dict) and node["properties"]
    if declares and not in_all_of and path not in keep_open and not any(k in node for k in _OPEN_SIBLINGS):
        out["additionalProperties"] = False
    return out


def _referenced_from_all_of(schema: dict[str, Any]) -> set[str]:
    """JSON pointers (``#/$defs/x``) of definitions that an ``allOf`` branch refers to, transitively."""
    found: set[str] = set()

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
            return own + [r for value in node.values() for r in refs(value)]
        if isinstance(node, list):
            return [r for item in node for r in refs(item)]
        return []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for branch in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
                found.update(r for r in refs(branch) if r.startswith("#/"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema)
    pending = list(found)
    while pending:  # a definition reached from an allOf branch may refer to others
        target = _resolve(schema, pending.pop())
        for ref in refs(target):
            if ref.startswith("#/") and ref not in found:
                found.add(ref)
                pending.append(ref)
    return found


def _resolve(schema: dict[str, Any], pointer: str) -> Any:
    node: Any = schema
    for part in pointer[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
