"""Rules for the logic keywords: ``not``, ``oneOf``, ``if``/``then``/``else``, dependencies.

Each turns its keyword into ``anyOf``/``allOf`` over ``not``-free subschemas:

- ``not S`` -> the pushed-down complement of ``S`` (``negation.negate``);
- ``oneOf [A, B, ...]`` -> ``anyOf`` when every pair is proven disjoint; otherwise each branch
  excludes the branches it may overlap: ``anyOf [A and not B, B and not A]``;
- ``if I then T else E`` -> ``anyOf [I and T, not I and E]``;
- ``dependencies``/``dependentRequired``/``dependentSchemas`` ``{k: D}`` -> ``anyOf [no k, D]``,
  where "no k" is ``{properties: {k: false}}`` (true of non-objects, as the keyword is).

Keywords the schema's declared draft does not define are annotations there and are dropped:
``if``/``then``/``else`` before draft-07, ``dependentRequired``/``dependentSchemas`` before
2019-09, ``dependencies`` from 2019-09 on. A schema that names no draft is read as 2020-12
with draft-07's ``dependencies`` (as llguidance and most such schemas in the wild read it).
"""

from __future__ import annotations

from .context import RewriteContext, all_of, any_of, conjoin, refuse
from .disjoint import disjoint
from .negation import key_universe, negate

#: ``oneOf`` branches whose pairwise exclusion is still attempted
MAX_EXCLUSION_BRANCHES = 6


def rewrite_not(node: dict, ctx: RewriteContext) -> dict:
    if "not" not in node:
        return node
    inner = node.pop("not")
    ctx.fire("not")
    return conjoin(node, negate(inner, ctx, key_universe(node, ctx)))


def rewrite_one_of(node: dict, ctx: RewriteContext) -> dict:
    if "oneOf" not in node:
        return node
    branches = node.pop("oneOf")
    n = len(branches)
    overlaps = {(i, j) for i in range(n) for j in range(n)
                if i < j and not disjoint(branches[i], branches[j], ctx)}
    if not overlaps:
        ctx.fire("oneOf->anyOf")
        return conjoin(node, any_of(list(branches)))
    if n > MAX_EXCLUSION_BRANCHES:
        raise refuse("oneOf", f"has {n} branches not proven disjoint; exclusion is limited to "
                              f"{MAX_EXCLUSION_BRANCHES}")
    ctx.fire("oneOf-exclusion")
    exclusive = []
    for i, branch in enumerate(branches):
        keys = key_universe({"allOf": [node, branch]}, ctx)
        others = [negate(branches[j], ctx, keys) for j in range(n) if (min(i, j), max(i, j)) in overlaps]
        exclusive.append(all_of([branch, *others]))
    return conjoin(node, any_of(exclusive))


def rewrite_conditional(node: dict, ctx: RewriteContext) -> dict:
    if ctx.dialect in (3, 4, 6) and any(k in node for k in ("if", "then", "else")):
        for key in ("if", "then", "else"):
            node.pop(key, None)
        ctx.fire("keyword-of-another-draft")
        return node
    if "if" not in node:
        node.pop("then", None)
        node.pop("else", None)
        return node
    condition = node.pop("if")
    then, otherwise = node.pop("then", True), node.pop("else", True)
    ctx.fire("if-then-else")
    if then is True and otherwise is True:
        return node
    keys = key_universe(node, ctx)
    if otherwise is True:
        return conjoin(node, any_of([negate(condition, ctx, keys), then]))
    if then is True:
        return conjoin(node, any_of([condition, otherwise]))
    return conjoin(node, any_of([all_of([condition, then]), all_of([negate(condition, ctx, keys), otherwise])]))


def rewrite_dependencies(node: dict, ctx: RewriteContext) -> dict:
    for keyword in ("dependencies", "dependentRequired", "dependentSchemas"):
        if keyword not in node:
            continue
        entries = node.pop(keyword)
        if ctx.dialect in ((2019, 2020) if keyword == "dependencies" else (3, 4, 6, 7)):
            ctx.fire("keyword-of-another-draft")
            continue
        if not isinstance(entries, dict):
            raise refuse(keyword, "is not an object")
        ctx.fire(keyword)
        for name, needs in entries.items():
            if isinstance(needs, list):
                needs = {"required": list(needs)} if needs else True
            if needs is True or needs == {}:
                continue
            conjoin(node, any_of([{"properties": {name: False}}, needs]))
    return node
