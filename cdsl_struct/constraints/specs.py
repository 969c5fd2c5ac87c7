"""Constraint specs: what the output must look like, independent of any engine or tokenizer.

A spec is checked when it is made (bad JSON Schema, regex or grammar syntax raise typed errors
here, before any engine sees it) and has a stable ``key`` used to cache compiled constraints.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import lark

try:  # Python >= 3.11 keeps the regex parser private
    from re import _constants as sre_constants
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

from ..errors import GrammarSyntaxError, InvalidSchema, UnknownGrammar, UnsatisfiableSchema, UnsupportedFeature

GRAMMARS_DIR = Path(__file__).resolve().parents[1] / "grammars"


class ConstraintSpec:
    """Base of the spec types. ``key`` identifies the constraint for caching; ``writes_json``: every
    output is JSON text from its first byte (what the string guard reads, ``decoding.strings``)."""

    kind: str = ""
    writes_json = False

    @property
    def key(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class JsonSchema(ConstraintSpec):
    """Output is one JSON value valid under a JSON Schema.

    ``schema`` is a dict, a JSON string, ``True``/``False``, or a pydantic model class (then
    ``model`` keeps the class so results can be returned as instances).
    """

    schema: Any
    model: Any = field(default=None, compare=False)
    kind = "json_schema"
    writes_json = True

    def __post_init__(self) -> None:
        schema, model = _normalise_schema(self.schema)
        object.__setattr__(self, "schema", schema)
        if model is not None:
            object.__setattr__(self, "model", model)
        check_json_schema(schema)

    @property
    def key(self) -> str:
        """The schema as JSON, keys in their given order: the engines emit object properties in
        ``properties`` order, so two schemas that differ only in that order are different
        constraints. (``model`` is not part of it: the compiler keeps it per spec.)"""
        return "json:" + json.dumps(self.schema, ensure_ascii=False)


@dataclass(frozen=True)
class Regex(ConstraintSpec):
    """Output fully matches a regular expression (no lookarounds or backreferences).

    The class escapes mean exactly what they mean in a JSON Schema ``pattern`` here (ECMA-262):
    ``\\d`` is ``[0-9]`` and ``\\w`` is ``[0-9a-zA-Z_]`` (``\\D``, ``\\W`` their complements, also
    inside classes such as ``[\\d_]``), while ``\\s``/``\\S`` keep Unicode whitespace; see
    ``json_schema_classes``. ``unicode=True`` keeps the engines' Unicode meanings instead (``\\d``
    then admits every Unicode decimal digit, such as ``"٣"`` or ``"🯸"``; ``\\w`` every letter).
    """

    pattern: str
    unicode: bool = False
    engine_pattern: str = field(init=False, repr=False, compare=False)
    """The regex the engines compile: ``pattern`` through ``json_schema_classes`` unless ``unicode``."""
    kind = "regex"

    def __post_init__(self) -> None:
        check_regex(self.pattern)
        if not isinstance(self.unicode, bool):
            raise TypeError(f"Regex(unicode=...) must be a bool, got {type(self.unicode).__name__}")
        engine = self.pattern if self.unicode else json_schema_classes(self.pattern)
        object.__setattr__(self, "engine_pattern", engine)

    @property
    def key(self) -> str:
        """The pattern, marked when ``unicode``: the flag changes what the engines compile."""
        return ("regex-unicode:" if self.unicode else "regex:") + self.pattern


@dataclass(frozen=True)
class Choice(ConstraintSpec):
    """Output is exactly one of the given strings."""

    options: tuple[str, ...]
    kind = "choice"

    def __init__(self, options: Any) -> None:
        values = tuple(options)
        if not values:
            raise UnsatisfiableSchema("Choice needs at least one option")
        if not all(isinstance(v, str) for v in values):
            raise TypeError("Choice options must be strings")
        object.__setattr__(self, "options", values)

    @property
    def pattern(self) -> str:
        """The options as one regex alternation, each option matched literally."""
        return "|".join(f"({escape_regex(option)})" for option in self.options)

    @property
    def engine_pattern(self) -> str:
        """The regex the engines compile: ``pattern`` as it is (the options are literals)."""
        return self.pattern

    @property
    def key(self) -> str:
        return "choice:" + json.dumps(self.options, ensure_ascii=False)


@dataclass(frozen=True, eq=False)
class Grammar(ConstraintSpec):
    """Output parses under a Lark grammar (rule ``start``).

    ``source`` is grammar text, a path to a ``.lark`` file, or the name of a grammar shipped in
    ``grammars/`` (``"json"``, ``"arithmetic"``, ``"sql_select"``, ``"function_call"``). A string
    that is one bare identifier (``GRAMMAR_NAME``) is always a name: one that is not shipped raises
    ``UnknownGrammar`` (naming the shipped ones and the closest), never a Lark syntax error.
    """

    source: Any
    text: str = field(init=False, repr=False)
    origin: str = field(init=False)
    kind = "grammar"

    def __post_init__(self) -> None:
        text, origin = _read_grammar(self.source)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "origin", origin)
        check_lark_grammar(text, origin)

    @property
    def key(self) -> str:
        return "lark:" + self.text

    @classmethod
    def from_text(cls, text: str) -> Grammar:
        """A grammar from Lark text only, never a file path or a shipped grammar's name: what a
        server takes from its clients (a string such as ``"../secret.lark"`` is then grammar text)."""
        if not isinstance(text, str):
            raise TypeError("grammar text must be a string")
        return cls(GrammarText(text))

    def parser(self) -> lark.Lark:
        """A new lark Earley parser for finished outputs (builds a ``lark.Tree``)."""
        return lark.Lark(self.text, start="start", parser="earley")

    def prepare_parser(self) -> None:
        """Build the shared parser ``parse`` uses now, off a request's path (a grammar of thousands of
        words takes a second or more)."""
        _shared_parser(self.text)

    def parse(self, text: str) -> lark.Tree:
        """The ``lark.Tree`` of a finished output. The parser is built once per grammar text and
        shared (a large grammar takes seconds to build, far longer than a parse); parses of one
        grammar run one at a time, as lark does not promise that a parser is thread-safe."""
        parser, lock = _shared_parser(self.text)
        with lock:
            return parser.parse(text)


@functools.lru_cache(maxsize=32)
def _shared_parser(text: str) -> tuple[lark.Lark, threading.Lock]:
    return lark.Lark(text, start="start", parser="earley"), threading.Lock()


_CONVERTERS: list[tuple[Callable[[Any], bool], Callable[[Any], ConstraintSpec]]] = []


def register_spec_converter(accepts: Callable[[Any], bool], convert: Callable[[Any], ConstraintSpec]) -> None:
    """Teach ``as_spec`` another kind of value: ``convert(value)`` for values where ``accepts(value)``.
    Integrations register themselves (``cdsl_struct.integrations.outlines_types``), so this core
    module imports none of them."""
    _CONVERTERS.append((accepts, convert))


def as_spec(value: Any) -> ConstraintSpec:
    """Coerce a spec-like value: a spec, a JSON Schema dict or JSON text, a pydantic model class, or
    a value a registered converter takes (the package registers Outlines output types and Python
    type forms: ``Literal[...]``, an ``Enum``, ``int``, a dataclass, ``outlines.types.Regex(...)``...)."""
    if isinstance(value, ConstraintSpec):
        return value
    if isinstance(value, (dict, bool, str, bytes)) or _is_pydantic_model(value):
        return JsonSchema(value)
    for accepts, convert in _CONVERTERS:
        if accepts(value):
            return convert(value)
    raise TypeError(
        f"expected JsonSchema, Regex, Choice, Grammar, a schema dict, a pydantic model or an Outlines output "
        f"type, got {type(value)!r}"
    )


# --- JSON Schema -------------------------------------------------------------------------------


def _is_pydantic_model(value: Any) -> bool:
    return isinstance(value, type) and hasattr(value, "model_json_schema")


def _normalise_schema(schema: Any) -> tuple[Any, Any]:
    if _is_pydantic_model(schema):
        return schema.model_json_schema(), schema
    if isinstance(schema, (str, bytes)):
        try:
            return json.loads(schema), None
        except json.JSONDecodeError as exc:
            raise InvalidSchema(
                f"schema is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from exc
    if isinstance(schema, (dict, bool)):
        return schema, None
    raise InvalidSchema(f"a JSON Schema must be a dict, a JSON string or a pydantic model, not {type(schema)!r}")


def check_json_schema(schema: Any) -> None:
    """Raise ``InvalidSchema`` if ``schema`` fails its metaschema, ``UnsatisfiableSchema`` if ``false``."""
    if schema is False:
        raise UnsatisfiableSchema("the schema `false` accepts no value")
    if schema is True:
        return
    if not isinstance(schema, dict):
        raise InvalidSchema(f"a JSON Schema must be an object or a boolean, got {type(schema).__name__}")
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidSchema(f"invalid JSON Schema at {where}: {exc.message}") from None
    _check_root_ref_chain(schema)


_ANNOTATIONS = {"$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title", "description", "examples",
                "default", "deprecated", "readOnly", "writeOnly"}


def _check_root_ref_chain(schema: dict) -> None:
    """``UnsatisfiableSchema`` when the root is only a ``$ref`` whose chain of bare references
    comes back to itself (``{"$ref": "#"}``): no value satisfies it (a validator recurses forever)."""
    node, seen = schema, []
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and set(node) <= _ANNOTATIONS:
        ref = node["$ref"]
        if ref in seen:
            raise UnsatisfiableSchema(f"the schema is only a cycle of references ({' -> '.join([*seen, ref])}); "
                                      "no value satisfies it")
        seen.append(ref)
        node = _local_target(schema, ref)


def _local_target(schema: dict, ref: str) -> Any:
    """The subschema a local ``#/...`` reference points to (``None`` if not local or not found)."""
    if not ref.startswith("#"):
        return None
    node: Any = schema
    for part in filter(None, ref[1:].split("/")):
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


# --- Regex -------------------------------------------------------------------------------------

_REGEX_META = set("\\.^$|?*+()[]{}")
_UNSUPPORTED_GROUPS = {
    "(?=": "lookahead assertion (?=...)",
    "(?!": "negative lookahead assertion (?!...)",
    "(?<=": "lookbehind assertion (?<=...)",
    "(?<!": "negative lookbehind assertion (?<!...)",
    "(?P=": "named backreference (?P=name)",
    "(?(": "conditional group (?(id)yes|no)",
}


def escape_regex(text: str) -> str:
    """Escape ``text`` so both engines (Rust regex syntax) match it literally."""
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


JSON_SCHEMA_ASCII_CLASSES = "dw"
"""The class escapes a JSON Schema ``pattern`` reads as ASCII sets (ECMA-262): ``\\d``/``\\D`` and
``\\w``/``\\W``; ``\\s``/``\\S`` stay Unicode. llguidance's JSON Schema compiler rewrites every
``pattern`` with ``llguidance.regex_to_lark(pattern, use_ascii="dw")`` ("JavaScript or JSON Schema
semantics"; outlines-core refuses ``pattern``, see ``outlines_core_schema``), so that is the one rule."""


def json_schema_classes(pattern: str) -> str:
    """``pattern`` with ``\\d``, ``\\D``, ``\\w``, ``\\W`` (also inside character classes) spelled as
    the ASCII sets a JSON Schema ``pattern`` gives them, by the very function llguidance applies to a
    schema's ``pattern`` (``JSON_SCHEMA_ASCII_CLASSES``). ``[\\d_]`` becomes ``[[0-9]_]``, a nested class
    both engines (Rust ``regex`` syntax) read as a union; a ``/`` comes back escaped, which both read
    as ``/``. The result is for the engines, not for Python's ``re``."""
    import llguidance  # the engine's own rewrite, so that the two paths cannot drift apart

    return llguidance.regex_to_lark(pattern, use_ascii=JSON_SCHEMA_ASCII_CLASSES)


MAX_NESTING = 64
"""Deepest nesting of groups a regex or a grammar may have: the parsers that read them recurse
once per level, and a deeper one is refused with a typed error before any of them runs."""


def check_nesting(text: str, what: str, limit: int = MAX_NESTING) -> None:
    """Raise ``UnsupportedFeature`` when ``text`` opens more than ``limit`` nested ``(`` / ``[``
    (escaped brackets, and brackets inside character classes and quotes, counted as well: an
    upper bound, which only matters for texts near the limit)."""
    depth = deepest = 0
    for char in text:
        if char in "([":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]" and depth:
            depth -= 1
    if deepest > limit:
        raise UnsupportedFeature(f"{what} nests {deepest} levels of brackets; at most {limit} are supported",
                                 feature="nesting depth")


def check_regex(pattern: str) -> None:
    """Reject a regex that is malformed, too deeply nested, or uses a feature no engine can express."""
    if not isinstance(pattern, str):
        raise TypeError("a regex pattern must be a string")
    check_nesting(pattern, "the regex")
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise GrammarSyntaxError(
            f"invalid regex: {exc.msg} at position {exc.pos}", line=exc.lineno, column=exc.colno
        ) from None
    for marker, feature in _UNSUPPORTED_GROUPS.items():
        if marker in pattern:
            raise UnsupportedFeature(f"regex uses a {feature}, which no engine supports", feature=feature)
    if _has_backreference(parsed):
        raise UnsupportedFeature("regex uses a backreference, which no engine supports", feature="backreference")


def _has_backreference(node: Any) -> bool:
    if isinstance(node, sre_parse.SubPattern):
        node = node.data
    if isinstance(node, (list, tuple)):
        if len(node) == 2 and node[0] in (sre_constants.GROUPREF, sre_constants.GROUPREF_EXISTS):
            return True
        return any(_has_backreference(child) for child in node)
    return False


# --- Lark grammars -----------------------------------------------------------------------------


class GrammarText(str):
    """Lark text that must not be read as a path or a name (see ``Grammar.from_text``)."""


GRAMMAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
"""What ``Grammar`` reads as a grammar's name rather than Lark text: a string that is one identifier
in full (letters, digits, ``_`` and ``-``, not starting with a digit or ``-``). Lark text must define
at least ``start:``, so such a string can never be a grammar; a name that is not a shipped grammar
raises ``UnknownGrammar`` at once instead of failing later as a syntax error."""


def shipped_grammars() -> tuple[str, ...]:
    """The names of the grammars shipped in ``grammars/`` (file names without ``.lark``), sorted."""
    return tuple(sorted(path.stem for path in GRAMMARS_DIR.glob("*.lark"))) if GRAMMARS_DIR.is_dir() else ()


def unknown_grammar(name: str) -> UnknownGrammar:
    """The ``UnknownGrammar`` for ``name``: it lists the shipped names and suggests the closest one."""
    known = shipped_grammars()
    close = difflib.get_close_matches(name, known, n=1)
    suggestion = close[0] if close else None
    hint = f"did you mean {suggestion!r}? " if suggestion else ""
    listed = f"shipped grammars: {', '.join(known)}" if known else "no grammars are shipped with this install"
    return UnknownGrammar(f"unknown grammar name {name!r}: {hint}{listed} (a grammar is Lark text, a path to a "
                          ".lark file, or one of those names)", name=name, known=known, suggestion=suggestion)


def _read_grammar(source: Any) -> tuple[str, str]:
    if isinstance(source, GrammarText):
        return str(source), "<grammar text>"
    if isinstance(source, Path):
        return source.read_text(encoding="utf-8"), str(source)
    if not isinstance(source, str):
        raise TypeError("a grammar is Lark text, a path to a .lark file, or a shipped grammar's name")
    if GRAMMAR_NAME.fullmatch(source):
        shipped = GRAMMARS_DIR / f"{source}.lark"
        if source not in shipped_grammars():
            raise unknown_grammar(source)
        return shipped.read_text(encoding="utf-8"), str(shipped)
    if "\n" not in source and source.endswith(".lark"):
        path = Path(source)
        if not path.exists():
            raise GrammarSyntaxError(f"grammar file {source} does not exist")
        return path.read_text(encoding="utf-8"), source
    return source, "<grammar text>"


MAX_RULE_ALTERNATIVES = 4096
MAX_TERMINAL_DEPTH = 64
"""Terminals defined through other terminals, nested: lark resolves such chains in time that grows
faster than quadratically (100 deep: 0.3 s; 300: 5 s; 3,000: tens of seconds, before any check of
ours could run), so deeper chains are refused from the text alone."""


def check_lark_grammar(text: str, origin: str = "<grammar text>") -> None:
    """Load the grammar with lark; raise ``GrammarSyntaxError`` with line and column on failure
    (``UnsupportedFeature`` for one nested deeper than ``MAX_NESTING``, or with a rule that lark
    would expand into more than ``MAX_RULE_ALTERNATIVES`` alternatives)."""
    check_nesting(text, f"{origin}")
    _check_terminal_depth(text, origin)
    try:
        _check_rule_expansion(text, origin)
        lark.Lark(text, start="start", parser="earley")
    except RecursionError:
        raise UnsupportedFeature(f"{origin}: the grammar nests or repeats too deeply for the parser",
                                 feature="grammar size") from None
    except lark.exceptions.UnexpectedInput as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        raise GrammarSyntaxError(
            f"{origin}: syntax error at line {line} column {column}: {str(exc).strip().splitlines()[0]}",
            line=line, column=column,
        ) from None
    except (lark.exceptions.GrammarError, lark.exceptions.ConfigurationError) as exc:
        found = re.search(r"line (\d+)(?:,? col(?:umn)? (\d+))?", str(exc))
        line = int(found.group(1)) if found else None
        column = int(found.group(2)) if found and found.group(2) else None
        raise GrammarSyntaxError(f"{origin}: grammar error: {exc}", line=line, column=column) from None


def _check_rule_expansion(text: str, origin: str) -> None:
    """Refuse a rule that lark's Earley parser would expand into too many alternatives: it turns
    each optional item (``x?``, ``[x]``, ``x*``) and inline group of a rule into separate
    alternatives, so 16 optional items in one rule take seconds and 64 would never finish."""
    from lark.load_grammar import GrammarBuilder

    builder = GrammarBuilder()
    builder.load_grammar(text, origin)
    for name, definition in builder._definitions.items():  # lark keeps no public view of them
        if not definition.is_term and _alternatives(definition.tree) > MAX_RULE_ALTERNATIVES:
            raise UnsupportedFeature(
                f"{origin}: rule {str(name)!r} expands into more than {MAX_RULE_ALTERNATIVES} alternatives (each "
                "optional item or inline group doubles them or more); split it into smaller rules",
                feature="grammar size")


_DEFINITION_START = re.compile(r"^[ \t]*[?!]?([A-Za-z_][A-Za-z_0-9]*)(?:\{[^}]*\})?(?:\.-?\d+)?[ \t]*:",
                               re.MULTILINE)
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"i?|/(?:[^/\\\n]|\\.)+/[imslux]*')
_TERMINAL_NAME = re.compile(r"\b_?[A-Z][A-Z_0-9]*\b")


def _check_terminal_depth(text: str, origin: str) -> None:
    """Refuse terminals nested through each other deeper than ``MAX_TERMINAL_DEPTH``, read from the
    text (lark itself would spend minutes on such a grammar before answering)."""
    starts = list(_DEFINITION_START.finditer(text))
    uses: dict[str, set[str]] = {}
    ends = [following.start() for following in starts[1:]] + [len(text)] if starts else []
    for start, end in zip(starts, ends, strict=True):
        name = start.group(1)
        if name.lstrip("_")[:1].isupper():
            body = _LITERAL.sub(" ", text[start.end():end])
            uses[name] = set(_TERMINAL_NAME.findall(body))
    depth: dict[str, int] = {}
    for root in uses:
        if root in depth:
            continue
        depth[root] = 0  # 0 while on the path: a cycle counts once (lark reports cycles itself)
        stack = [(root, iter(uses[root]))]
        while stack:
            name, children = stack[-1]
            child = next((c for c in children if c in uses and c not in depth), None)
            if child is not None:
                depth[child] = 0
                stack.append((child, iter(uses[child])))
                continue
            stack.pop()
            depth[name] = 1 + max((depth[c] for c in uses[name] if c in uses), default=0)
            if depth[name] > MAX_TERMINAL_DEPTH:
                raise UnsupportedFeature(
                    f"{origin}: terminal {name!r} is defined through more than {MAX_TERMINAL_DEPTH} nested "
                    "terminals; define it with fewer levels", feature="grammar size")


def _alternatives(node: Any) -> int:
    """How many BNF alternatives lark makes of an EBNF rule tree (capped just past the limit)."""
    cap = MAX_RULE_ALTERNATIVES + 1
    if not isinstance(node, lark.Tree):
        return 1
    if node.data == "expansions":
        return min(cap, sum(_alternatives(child) for child in node.children))
    if node.data == "expansion":
        total = 1
        for child in node.children:
            total = min(cap, total * _alternatives(child))
        return total
    if node.data == "maybe":
        return min(cap, _alternatives(node.children[0]) + 1)
    if node.data == "expr":
        inner = _alternatives(node.children[0])
        op = node.children[1] if len(node.children) > 1 else None
        if op in ("?", "*"):
            return min(cap, inner + 1)
        if op == "~":  # x ~ n or x ~ n..m: sequences of n to m copies
            counts = [int(str(t)) for t in node.children[2:] if str(t).isdigit()]
            high = max(counts) if counts else 1
            return cap if inner > 1 and high > 12 else min(cap, sum(inner ** k for k in range(min(counts or [1]),
                                                                                          high + 1)))
        return inner
    return 1
