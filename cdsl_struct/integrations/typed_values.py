"""Typed values of outputs constrained by Python type forms, with Outlines' meaning.

Outlines constrains ``int``, ``list[int]``, ``dict[str, int]``, ``tuple[int, str]``, ``Literal[1, 2]``,
an ``Enum``, ``Optional[T]``... by regexes of a Python-like syntax (``[1, 2]``, ``{"a":1}``,
``(1, "x")``, ``True``, ``None``; a string is ``"..."`` with no escapes). ``ValueReader(T).read(text)``
reads such an output back into a value of ``T``: ``[1, 2]`` into the list ``[1, 2]``, ``"x"`` into
``'x'``, ``2`` into ``Color.GREEN``. It follows the construction of Outlines' own
``python_types_to_terms`` step by step (the same type tests, the same quoting of literals inside
containers, the same leaf regexes), so it reads exactly the texts the constraint admits; where a
text could be read more than one way (``Union[int, float]``), the first alternative in the type's
order that reads the whole text wins.

Needs the extra ``outlines`` (as the constraint itself does for these types).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, get_args

from ..errors import OutputInvalid

__all__ = ["ValueReader", "value_reader"]

Parses = Iterator[tuple[Any, int]]


class _Node:
    """One part of an output: every way it can be read at ``pos`` as ``(value, end)``."""

    def parses(self, text: str, pos: int) -> Parses:
        raise NotImplementedError

    def quoted(self, regex_too: bool) -> _Node:
        """This part inside a container, as Outlines' ``_ensure_json_quoted`` makes it: literal
        strings in double quotes and, for a dict key (``regex_too``), regex leaves too."""
        return self


class _Leaf(_Node):
    """A regex term of Outlines (``types.integer``, a number literal...), read by ``convert``."""

    def __init__(self, pattern: str, convert: Callable[[str], Any], *, quotable: bool = True) -> None:
        self.pattern = pattern
        self.regex = re.compile(pattern)
        self.convert = convert
        self.quotable = quotable

    def parses(self, text: str, pos: int) -> Parses:
        match = self.regex.match(text, pos)
        if match is None:
            return
        try:
            value = self.convert(match.group())
        except ValueError:  # a date, time or model the regex admits but the type refuses: no reading
            return
        yield value, match.end()

    def quoted(self, regex_too: bool) -> _Node:
        if not (regex_too and self.quotable):
            return self
        convert = self.convert
        return _Leaf(f'"(?:{self.pattern})"', lambda s: convert(s[1:-1]), quotable=False)


class _Word(_Node):
    """A literal string of a ``Literal`` or an ``Enum`` (Outlines' ``String`` term): bare at the
    top, in double quotes inside a container."""

    def __init__(self, word: str, value: Any) -> None:
        self.word = word
        self.value = value

    def parses(self, text: str, pos: int) -> Parses:
        if text.startswith(self.word, pos):
            yield self.value, pos + len(self.word)

    def quoted(self, regex_too: bool) -> _Node:
        return _Word(f'"{self.word}"', self.value)


class _Either(_Node):
    """Alternatives (``Literal``, ``Enum``, ``Union``), tried in the type's order."""

    def __init__(self, options: list[_Node]) -> None:
        self.options = options

    def parses(self, text: str, pos: int) -> Parses:
        for option in self.options:
            yield from option.parses(text, pos)

    def quoted(self, regex_too: bool) -> _Node:
        return _Either([option.quoted(regex_too) for option in self.options])


class _Items(_Node):
    """``open item (", " item)* close`` (a list, ``tuple[T, ...]``) or a fixed row of items
    (``tuple[A, B]``), or ``{key:value, ...}`` (a dict); ``build`` makes the value of the parts."""

    def __init__(self, open_: str, close: str, parts: list[_Node], *, repeat: bool, optional: bool = False,
                 pairs: bool = False, build: Callable[[list[Any]], Any] = list) -> None:
        self.open, self.close, self.parts = open_, close, parts
        self.repeat, self.optional, self.pairs, self.build = repeat, optional, pairs, build

    def parses(self, text: str, pos: int) -> Parses:
        if not text.startswith(self.open, pos):
            return
        start = pos + len(self.open)
        if self.optional and text.startswith(self.close, start):
            yield self.build([]), start + len(self.close)
        for values, end in self._rows(text, start, first=True):
            if text.startswith(self.close, end):
                yield self.build(values), end + len(self.close)

    def _rows(self, text: str, pos: int, *, first: bool) -> Iterator[tuple[list[Any], int]]:
        """Every reading of one group of parts (and, when repeating, of the groups after it)."""
        if not first:
            if not text.startswith(", ", pos):
                return
            pos += 2
        for group, end in self._group(text, pos, 0):
            yield group, end
            if self.repeat:
                for more, after in self._rows(text, end, first=False):
                    yield group + more, after

    def _group(self, text: str, pos: int, index: int) -> Iterator[tuple[list[Any], int]]:
        if index == len(self.parts):
            yield [], pos
            return
        separator = ", " if index > 0 and not self.repeat else ":" if index > 0 and self.pairs else ""
        if separator:
            if not text.startswith(separator, pos):
                return
            pos += len(separator)
        for value, end in self.parts[index].parses(text, pos):
            for rest, after in self._group(text, end, index + 1):
                yield [value, *rest], after


def _datetime(text: str) -> datetime.datetime:
    # Outlines' datetime is a date, one whitespace character, a time
    return datetime.datetime.combine(datetime.date.fromisoformat(text[:10]), datetime.time.fromisoformat(text[11:]))


def _node(ptype: Any, depth: int = 0) -> _Node:
    """The reader of ``ptype``'s output, built as ``python_types_to_terms`` builds its term."""
    from outlines import types
    from outlines.types import dsl
    from outlines.types import utils as u

    if depth > 10:
        raise RecursionError(f"{ptype!r} nests too deeply")
    if isinstance(ptype, dsl.String):
        return _Word(ptype.value, ptype.value)
    if isinstance(ptype, dsl.Term):  # an Outlines term inside a type form (list[types.email]): its text
        return _Leaf(dsl.to_regex(ptype), str, quotable=isinstance(ptype, dsl.Regex))
    if u.is_int(ptype):
        return _Leaf(types.integer.pattern, int)
    if u.is_float(ptype):
        return _Leaf(types.number.pattern, float)
    if u.is_bool(ptype):
        return _Leaf(types.boolean.pattern, lambda s: s == "True")
    if u.is_str(ptype):
        return _Leaf(types.string.pattern, lambda s: s[1:-1], quotable=False)  # never quoted again
    if u.is_native_dict(ptype):
        raise TypeError("dict (any JSON) is a grammar, not a regex term")
    if u.is_time(ptype):
        return _Leaf(types.time.pattern, datetime.time.fromisoformat)
    if u.is_date(ptype):
        return _Leaf(types.date.pattern, datetime.date.fromisoformat)
    if u.is_datetime(ptype):
        return _Leaf(types.datetime.pattern, _datetime)
    if isinstance(ptype, bool):
        return _Leaf(str(ptype), lambda s, v=ptype: v)
    if isinstance(ptype, str):
        return _Word(ptype, ptype)
    if (isinstance(ptype, int) and not isinstance(ptype, bool)) or isinstance(ptype, float):
        return _Leaf(re.escape(str(ptype)), lambda s, v=ptype: v)
    if u.is_dataclass(ptype) or u.is_typed_dict(ptype) or u.is_pydantic_model(ptype):
        from pydantic import TypeAdapter

        return _Leaf(dsl.to_regex(dsl.python_types_to_terms(ptype)), TypeAdapter(ptype).validate_json,
                     quotable=False)
    if u.is_enum(ptype):
        return _Either([_member(ptype, value, depth) for value in dsl._get_enum_members(ptype)])
    args = get_args(ptype)
    if u.is_literal(ptype):
        return _Either([_node(arg, depth) for arg in args])
    if u.is_union(ptype):
        options = [_node(arg, depth + 1) for arg in args if arg not in (type(None), None)]
        if type(None) in args or None in args:
            options.append(_Leaf("None", lambda s: None))
        return _Either(options)
    if u.is_typing_list(ptype):
        return _Items("[", "]", [_node(args[0], depth + 1).quoted(False)], repeat=True)
    if u.is_typing_tuple(ptype):
        if len(args) == 0 or args == ((),):
            return _Word("()", ())
        if len(args) == 2 and args[1] is Ellipsis:
            return _Items("(", ")", [_node(args[0], depth + 1).quoted(False)], repeat=True, build=tuple)
        return _Items("(", ")", [_node(arg, depth + 1).quoted(False) for arg in args], repeat=False, build=tuple)
    if u.is_typing_dict(ptype):
        key, value = _node(args[0], depth + 1).quoted(True), _node(args[1], depth + 1).quoted(False)
        return _Items("{", "}", [key, value], repeat=True, optional=True, pairs=True,
                      build=lambda flat: dict(zip(flat[::2], flat[1::2], strict=True)))
    term = dsl.python_types_to_terms(ptype, depth)  # a genson builder or a callable: JSON Schema
    if isinstance(term, dsl.JsonSchema):
        return _Leaf(dsl.to_regex(term), json.loads, quotable=False)
    return _Leaf(dsl.to_regex(term), str, quotable=isinstance(term, dsl.Regex))


def _member(enum_type: Any, value: Any, depth: int) -> _Node:
    """One member of an ``Enum``: read as its value's literal, given back as the member."""
    node = _node(value, depth + 1)
    try:
        member = enum_type(value)
    except ValueError:  # a plain function in the Enum's body: Outlines counts it as a member
        return node
    return _Mapped(node, lambda _, m=member: m)


class _Mapped(_Node):
    def __init__(self, node: _Node, convert: Callable[[Any], Any]) -> None:
        self.node, self.convert = node, convert

    def parses(self, text: str, pos: int) -> Parses:
        for value, end in self.node.parses(text, pos):
            yield self.convert(value), end

    def quoted(self, regex_too: bool) -> _Node:
        return _Mapped(self.node.quoted(regex_too), self.convert)


@dataclasses.dataclass(eq=False)
class ValueReader:
    """Reads a finished output constrained by ``python_type`` (Outlines' meaning) into a value of it.

    ``read(text)`` raises ``OutputInvalid`` when the text is not one such output, or names no
    value of the type (a date such as ``2024-02-30``, which the regex admits).
    """

    python_type: Any
    _root: _Node = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._root = _node(self.python_type)

    def read(self, text: str) -> Any:
        """The value ``text`` spells, as ``python_type``."""
        for value, end in self._root.parses(text, 0):
            if end == len(text):
                return value
        raise OutputInvalid(f"the finished output {text!r} cannot be read as a value of {self.name}")

    @property
    def name(self) -> str:
        """The type's name, for messages."""
        return getattr(self.python_type, "__name__", None) or repr(self.python_type)


def value_reader(python_type: Any) -> ValueReader:
    """The ``ValueReader`` of ``python_type``, made once per hashable type (compiled constraints
    are cached per reader, so one type keeps one)."""
    try:
        return _cached_reader(python_type)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return ValueReader(python_type)


@functools.lru_cache(maxsize=256)
def _cached_reader(python_type: Any) -> ValueReader:
    return ValueReader(python_type)
