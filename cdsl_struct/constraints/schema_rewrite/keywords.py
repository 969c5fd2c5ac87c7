"""Rules for single keywords: ``format``, draft-04 bounds, ``uniqueItems``, ``min/maxProperties``,
``propertyNames``.

- An unknown ``format`` is an annotation (every draft says so): dropped. A standard format is
  kept for the engine to enforce or refuse.
- Draft-04's ``exclusiveMaximum: true`` beside ``maximum: m`` is today's ``exclusiveMaximum: m``;
  keywords later drafts added (``const``, ``if``...) are annotations in draft-04: dropped.
- ``uniqueItems: false`` and ``uniqueItems`` with ``maxItems <= 1`` say nothing; over items from a
  small finite set it is the list of every array of distinct items; otherwise it is left for the
  engine (no context-free grammar expresses it over an unbounded item set).
- ``min/maxProperties`` over a finite property set (``additionalProperties: false``, no
  ``patternProperties``): ``anyOf`` over which keys are present or absent.
- ``propertyNames`` with a ``pattern`` or a list of names: ``patternProperties`` plus
  ``additionalProperties: false``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

from .context import RewriteContext, Schema, any_of, conjoin, refuse
from .jsontypes import ALL_TYPES, json_equal

STANDARD_FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4",
    "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})
DRAFT3_FORMATS = frozenset({"utc-millisec", "color", "style", "phone", "ip-address", "host-name"})
#: most branches a keyword may expand into
MAX_BRANCHES = 64


def drop_unknown_format(node: dict, ctx: RewriteContext) -> dict:
    value = node.get("format")
    if value is None or value in STANDARD_FORMATS:
        return node
    if value in DRAFT3_FORMATS and "draft-03" in str((ctx.root or {}).get("$schema", "")):
        return node
    del node["format"]
    ctx.fire("format-annotation")
    return node


#: validation keywords later drafts added: annotations (so dropped) in a draft-04 schema
AFTER_DRAFT4 = ("const", "contains", "propertyNames", "if", "then", "else", "dependentRequired",
                "dependentSchemas", "prefixItems", "unevaluatedProperties", "unevaluatedItems")


def draft4_forms(node: dict, ctx: RewriteContext) -> dict:
    """Draft-04 read in today's terms (the rewrite is declared draft-07, see ``rewrite_schema``)."""
    if ctx.dialect == 3:
        raise refuse("$schema", "draft-03 schemas are not rewritten")
    if ctx.dialect == 4:
        for key in AFTER_DRAFT4:
            if key in node:
                del node[key]
                ctx.fire("keyword-of-another-draft")
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(flag), bool):
            exclusive = node.pop(flag)
            if exclusive and bound in node:
                node[flag] = node.pop(bound)
            ctx.fire("draft4-bounds")
    return node


def unique_items(node: dict, ctx: RewriteContext) -> dict:
    if "uniqueItems" not in node:
        return node
    if node["uniqueItems"] is False or node.get("maxItems", 2) <= 1:
        del node["uniqueItems"]
        ctx.fire("uniqueItems-vacuous")
        return node
    values = _finite_items(node.get("items"), ctx)
    if values is None or "prefixItems" in node:
        return node  # left for the engine to refuse by name
    low, high = node.get("minItems", 0), min(node.get("maxItems", len(values)), len(values))
    many = len(values) > MAX_BRANCHES  # counted only that far (see _finite_items)
    if (many and high >= 1) or _arrays_over(len(values), low, high, MAX_BRANCHES):
        size = f"more than {MAX_BRANCHES}" if many else str(len(values))
        raise refuse("uniqueItems", f"over {size} item values makes more than {MAX_BRANCHES} arrays (the limit)")
    arrays = [list(p) for k in range(low, high + 1) for p in itertools.permutations(values, k)]
    del node["uniqueItems"]
    ctx.fire("uniqueItems-finite")
    others = [t for t in ALL_TYPES if t != "array"]
    return conjoin(node, any_of([{"type": others}, {"enum": arrays}] if arrays else [{"type": others}]))


def _arrays_over(n: int, low: int, high: int, limit: int) -> bool:
    """Whether more than ``limit`` arrays of ``low..high`` distinct items from ``n`` values exist,
    counted with early exit (the exact count of a large enum has thousands of digits)."""
    total, perm = 0, 1  # perm: n!/(n-k)! for the current k
    for k in range(0, high + 1):
        if k:
            perm *= n - k + 1
        if k >= low:
            total += perm
        if total > limit or (k >= low and perm > limit):
            return True
    return False


def _finite_items(items: Schema, ctx: RewriteContext) -> list | None:
    if isinstance(items, dict) and set(items) == {"$ref"}:
        try:
            items = ctx.resolve(items["$ref"], "uniqueItems")
        except Exception:  # noqa: BLE001 - an unreadable target is simply not finite
            return None
    if not isinstance(items, dict):
        return [] if items is False else None
    if "const" in items:
        candidates = [items["const"]]
    elif isinstance(items.get("enum"), list):
        candidates = items["enum"]
    elif items.get("type") == "boolean":
        candidates = [False, True]
    elif items.get("type") == "null":
        candidates = [None]
    else:
        return None
    distinct: list = []
    for value in candidates:
        if not any(json_equal(value, seen) for seen in distinct):
            distinct.append(value)
            if len(distinct) > MAX_BRANCHES:  # already too many arrays once one item is allowed: stop
                break  # comparing (quadratic in a large enum)
    return distinct


def property_counts(node: dict, ctx: RewriteContext) -> dict:
    low, high = node.get("minProperties"), node.get("maxProperties")
    if low is None and high is None:
        return node
    props = node.get("properties") or {}
    required = set(node.get("required") or [])
    if set(props) <= required and not node.get("patternProperties"):
        return node  # the engine's own case: every listed key required
    finite = node.get("additionalProperties") is False and not node.get("patternProperties")
    names = [n for n, s in props.items() if s is not False]
    optional = [n for n in names if n not in required]
    if low is not None:
        if low <= len(required):
            del node["minProperties"]
        elif finite:
            del node["minProperties"]
            node = conjoin(node, _choose(optional, low - len(required), lambda s: {"required": list(s)}))
        else:
            raise refuse("minProperties", "needs a finite property set (additionalProperties: false)")
    if high is not None:
        if finite and high >= len(names):
            del node["maxProperties"]
        elif finite:
            del node["maxProperties"]
            absent = len(names) - high
            node = conjoin(node, _choose(optional, absent, lambda s: {"properties": {n: False for n in s}}))
        else:
            raise refuse("maxProperties", "needs a finite property set (additionalProperties: false)")
    ctx.fire("min/maxProperties")
    return node


def _choose(names: list[str], k: int, branch: Callable[[tuple[str, ...]], Schema]) -> Schema:
    if k > len(names):
        return {"type": [t for t in ALL_TYPES if t != "object"]}
    if math.comb(len(names), k) > MAX_BRANCHES:
        raise refuse("minProperties/maxProperties", f"expands into more than {MAX_BRANCHES} branches")
    return any_of([branch(subset) for subset in itertools.combinations(names, k)])


def property_names(node: dict, ctx: RewriteContext) -> dict:
    if "propertyNames" not in node:
        return node
    names = node["propertyNames"]
    if names is True or names == {}:
        del node["propertyNames"]
        ctx.fire("propertyNames")
        return node
    if node.get("patternProperties") or not isinstance(names, dict):
        raise refuse("propertyNames", "beside patternProperties (or as `false`) is not rewritten")
    extra = node.get("additionalProperties", True)
    props = dict(node.get("properties") or {})
    if set(names) == {"pattern"}:
        pattern = names["pattern"]
        try:
            re.compile(pattern)
        except re.error:
            raise refuse("propertyNames", f"has a pattern Python cannot read: {pattern!r}") from None
        matching = [n for n in props if re.search(pattern, n)]
        if matching and extra not in (True, {}):
            raise refuse("propertyNames", f"pattern also matches declared {matching[0]!r}, which "
                                          "additionalProperties does not constrain")
        node["properties"] = {n: (s if n in matching else False) for n, s in props.items()}
        node["patternProperties"] = {pattern: extra}
    elif set(names) <= {"enum", "type"} and "enum" in names or set(names) <= {"const", "type"} and "const" in names:
        allowed = names["enum"] if "enum" in names else [names["const"]]
        if not all(isinstance(n, str) for n in allowed):
            raise refuse("propertyNames", "lists a non-string name")
        node["properties"] = {n: (s if n in allowed else False) for n, s in props.items()}
        node["properties"].update({n: extra for n in allowed if n not in props})
    else:
        raise refuse("propertyNames", f"with {sorted(names)} is not rewritten (only pattern or enum)")
    node["additionalProperties"] = False
    del node["propertyNames"]
    ctx.fire("propertyNames")
    return node
