"""Shared pieces of the schema rewriter: the walk over subschemas, ``$ref`` lookup, refusals.

A rewrite rule sees one schema node whose subschemas have already been rewritten, and returns
the node rewritten (or unchanged). Rules must be exact: a rule that cannot rewrite a node
without admitting or rejecting a different set of instances raises ``refuse(keyword, why)``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ...errors import UnsupportedFeature

Schema = Any  # a dict, or True / False

#: keywords whose value is one subschema
SINGLE = ("additionalProperties", "additionalItems", "items", "contains", "propertyNames", "not",
          "if", "then", "else", "unevaluatedProperties", "unevaluatedItems")
#: keywords whose value is a list of subschemas
LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
#: keywords whose value maps names to subschemas
MAPS = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas")
#: every keyword that can change which instances are valid (in some draft); any other key is
#: an annotation (``title``, ``definitions``, ``x-...``, ``_format``...)
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "items", "additionalItems", "prefixItems", "contains",
    "minContains", "maxContains", "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties",
    "required", "properties", "patternProperties", "additionalProperties", "propertyNames", "dependencies",
    "dependentRequired", "dependentSchemas", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref",
    "$dynamicRef", "$recursiveRef", "unevaluatedItems", "unevaluatedProperties", "disallow", "extends",
    "divisibleBy",
})


def refuse(keyword: str, why: str) -> UnsupportedFeature:
    """The error for a node the rewriter cannot express exactly (raise it)."""
    return UnsupportedFeature(f"schema rewrite: `{keyword}` {why}", feature=keyword, backend="rewrite")


#: most nodes negation may visit for one schema: exclusions over large ``$ref`` graphs grow fast
MAX_WORK = 5000
#: most ``$ref`` targets unfolded inside one another
MAX_REF_DEPTH = 6


class RewriteContext:
    """The root schema (for ``$ref``), the rules that fired, and a recursion guard."""

    def __init__(self, root: Schema) -> None:
        self.root = root
        self.fired: list[str] = []
        self._resolving: set[str] = set()
        self._resolved: dict[str, Schema] = {}
        self.negating: set[str] = set()  # refs being negated (recursion guard)
        self.work = 0  # schema nodes built by negation, against MAX_WORK
        self.normalise: Callable[[Schema], Schema] = lambda s: s  # set by the rewriter

    @property
    def dialect(self) -> int | None:
        """The draft the root's ``$schema`` names (3, 4, 6, 7, 2019, 2020), ``None`` if none."""
        uri = str(self.root.get("$schema", "")) if isinstance(self.root, dict) else ""
        for mark, draft in (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7),
                            ("2019-09", 2019), ("2020-12", 2020)):
            if mark in uri:
                return draft
        return None

    def fire(self, rule: str) -> None:
        if rule not in self.fired:
            self.fired.append(rule)

    def spend(self, keyword: str) -> None:
        """Count one unit of negation work; refuse past ``MAX_WORK``."""
        self.work += 1
        if self.work > MAX_WORK:
            raise refuse(keyword, f"expands past {MAX_WORK} negated subschemas")

    def resolve(self, ref: str, keyword: str) -> Schema:
        """The normalised schema a local ``$ref`` points at; refuses remote or recursive refs."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise refuse(keyword, f"needs the target of $ref {ref!r}, which is not a local reference")
        if ref in self._resolved:
            return self._resolved[ref]
        if ref in self._resolving:
            raise refuse(keyword, f"would unfold the recursive reference {ref!r}")
        if len(self._resolving) >= MAX_REF_DEPTH:
            raise refuse(keyword, f"would unfold more than {MAX_REF_DEPTH} nested references")
        node: Any = self.root
        for part in (p for p in ref[1:].split("/") if p):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise refuse(keyword, f"needs the target of $ref {ref!r}, which does not resolve")
        self._resolving.add(ref)
        try:
            self._resolved[ref] = self.normalise(copy.deepcopy(node))
            return self._resolved[ref]
        finally:
            self._resolving.discard(ref)


def map_subschemas(node: dict, rewrite: Callable[[Schema], Schema]) -> dict:
    """A copy of ``node`` with ``rewrite`` applied to every direct subschema."""
    out = dict(node)
    for key in SINGLE:
        if key in out and isinstance(out[key], (dict, bool)):
            out[key] = rewrite(out[key])
    for key in LISTS:
        if key in out and isinstance(out[key], list):
            out[key] = [rewrite(s) for s in out[key]]
    for key in MAPS:
        if key in out and isinstance(out[key], dict):
            out[key] = {name: rewrite(s) for name, s in out[key].items()}
    if isinstance(out.get("dependencies"), dict):
        out["dependencies"] = {
            name: rewrite(s) if isinstance(s, (dict, bool)) else s for name, s in out["dependencies"].items()
        }
    return out


def conjoin(node: dict, extra: Schema) -> dict:
    """``node`` with ``extra`` added as one more ``allOf`` member (``node`` is modified)."""
    if extra is True:
        return node
    node.setdefault("allOf", []).append(extra)
    return node


def any_of(branches: list[Schema]) -> Schema:
    """The disjunction of ``branches``, simplified (``false`` dropped, nested ``anyOf`` flattened)."""
    flat: list[Schema] = []
    for branch in branches:
        if branch is True:
            return True
        if branch is False:
            continue
        if isinstance(branch, dict) and set(branch) == {"anyOf"}:
            flat.extend(branch["anyOf"])
        else:
            flat.append(branch)
    if not flat:
        return False
    if len(flat) == 1:
        return flat[0]
    return {"anyOf": flat}


def all_of(members: list[Schema]) -> Schema:
    """The conjunction of ``members``, simplified."""
    kept = [m for m in members if m is not True]
    if any(m is False for m in kept):
        return False
    if not kept:
        return True
    if len(kept) == 1:
        return kept[0]
    return {"allOf": kept}
