"""An exact JSON Schema rewriter for what the engines refuse.

``rewrite_schema(schema)`` returns an equivalent schema (same valid instances, judged by
``jsonschema``) without the keywords llguidance lacks: ``not`` pushed to the leaves,
``oneOf`` as ``anyOf`` (proven disjoint branches) or with exclusions, ``if``/``then``/``else``
and the dependency keywords as ``anyOf``/``allOf``, unknown ``format`` dropped, draft-04 bounds
updated, ``uniqueItems``/``min/maxProperties`` expanded over finite sets, ``propertyNames`` as
``patternProperties``. A node no rule can rewrite exactly raises ``UnsupportedFeature`` naming
the keyword; nothing is ever loosened. ``Rewrite.rules`` lists the rules that fired.

The compiler runs it only after the first engine refuses a schema (``compiler.py``), so
schemas the engine reads as given never pay for it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from .combinators import rewrite_conditional, rewrite_dependencies, rewrite_not, rewrite_one_of
from .context import RewriteContext, Schema, map_subschemas
from .keywords import draft4_forms, drop_unknown_format, property_counts, property_names, unique_items

#: node rules, in the order they run on each node (its subschemas already rewritten)
NODE_RULES = (
    draft4_forms,
    drop_unknown_format,
    unique_items,
    property_names,
    property_counts,
    rewrite_dependencies,
    rewrite_conditional,
    rewrite_not,
    rewrite_one_of,
)
_DRAFT7 = "http://json-schema.org/draft-07/schema#"


@dataclass(frozen=True)
class Rewrite:
    """A rewritten schema and the names of the rules that changed it (empty: unchanged)."""

    schema: Any
    rules: tuple[str, ...]


def rewrite_schema(schema: Schema) -> Rewrite:
    """The exact rewrite of ``schema``; raises ``UnsupportedFeature`` naming what it cannot do."""
    ctx = RewriteContext(schema)

    def normalise(node: Schema) -> Schema:
        if not isinstance(node, dict):
            return node
        node = map_subschemas(node, normalise)
        for rule in NODE_RULES:
            node = rule(node, ctx)
        return node

    ctx.normalise = normalise
    out = normalise(copy.deepcopy(schema))
    out = _relocate_refs(out, ctx)
    if ctx.dialect in (4, 6) and isinstance(out, dict):
        out["$schema"] = _DRAFT7  # the rules write draft-06+ keywords; the rest reads alike
    return Rewrite(out, tuple(ctx.fired))


def _relocate_refs(out: Schema, ctx: RewriteContext) -> Schema:
    """Keep every ``$ref`` pointing at an equivalent of its original target.

    Rules move subschemas (``then`` into ``anyOf``...), so a pointer such as ``#/then/x`` may no
    longer resolve, or resolve to another node. Pointers to a whole definition
    (``#/definitions/NAME``, ``#/$defs/NAME``) and ``#`` stay: those nodes are rewritten in
    place. Every other pointer gets the rewritten copy of its original target, stored as a new
    definition.
    """
    if not isinstance(out, dict):
        return out
    home = "definitions" if "definitions" in out or "$defs" not in out else "$defs"
    moved: dict[str, str] = {}
    pending: list[Any] = [out]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and not _stable_pointer(ref):
            if ref not in moved:
                moved[ref] = f"#/{home}/cdsl-rewrite-{len(moved)}"
                target = copy.deepcopy(ctx.resolve(ref, "$ref"))
                out.setdefault(home, {})[moved[ref].rsplit("/", 1)[1]] = target
                pending.append(target)
            node["$ref"] = moved[ref]
        pending.extend(v for k, v in node.items() if k not in ("enum", "const", "default", "examples"))
    if moved:
        ctx.fire("$ref-relocation")
    return out


def _stable_pointer(ref: str) -> bool:
    parts = [p for p in ref[1:].split("/") if p]
    return not parts or len(parts) == 2 and parts[0] in ("definitions", "$defs")


__all__ = ["Rewrite", "rewrite_schema"]
