"""Partial values of JSON text while it streams, each consistent with the final value.

``partial_json(text)`` reads a prefix of a JSON document and returns what it says so far: objects
with the members whose values have begun, arrays with the elements begun, strings as far as they
are written (they only grow), numbers, ``true``, ``false`` and ``null`` only once they are whole (a
number's digits could still go on). So every partial value is a *prefix* of the final one
(``consistent_with``): a program can show or act on it without ever taking anything back.
``partial_model`` gives the same as a pydantic model built without validation (the fields so far;
nested models as deep as written).

The text must be the output of a JSON constraint (a prefix of valid JSON): ``partial_json`` reads
leniently and stops at the first character it cannot place, returning what came before.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_WHITESPACE = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}

#: what ``partial_json`` returns where the text has no value yet
NOTHING = object()


class _Incomplete(Exception):
    """The text ended inside a value that cannot be shown yet (a number, a literal, a key)."""


def partial_json(text: str) -> Any:
    """The value ``text`` (a prefix of a JSON document) holds so far, or ``NOTHING`` before any."""
    reader = _Reader(text)
    try:
        return reader.value()
    except _Incomplete:
        return NOTHING


def consistent_with(partial: Any, final: Any) -> bool:
    """Whether ``partial`` is a prefix of ``final``: the same keys' values prefixes of theirs (an
    object may lack members), an array's elements prefixes of the first ones, a string a prefix
    of the final string, anything else equal."""
    if partial is NOTHING:
        return True
    if isinstance(partial, dict):
        return isinstance(final, dict) and all(k in final and consistent_with(v, final[k]) for k, v in partial.items())
    if isinstance(partial, list):
        return (isinstance(final, list) and len(partial) <= len(final)
                and all(consistent_with(p, f) for p, f in zip(partial, final, strict=False)))
    if isinstance(partial, str):
        return isinstance(final, str) and final.startswith(partial)
    return type(partial) is type(final) and partial == final


def partial_model(model: Any, value: Any) -> Any:
    """``value`` (a partial JSON object) as an instance of the pydantic ``model``, built without
    validation: the fields so far, nested models and lists of them built the same way; fields not
    yet written are unset (``model_fields_set`` says which are)."""
    if not isinstance(value, dict):
        return None
    fields = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key in value:
            fields[name] = _typed(field.annotation, value[key])
    return model.model_construct(**fields)


def _typed(annotation: Any, value: Any) -> Any:
    from typing import get_args, get_origin

    model = _model_class(annotation)
    if model is not None and isinstance(value, dict):
        return partial_model(model, value)
    if get_origin(annotation) is list and isinstance(value, list):
        (item,) = get_args(annotation) or (Any,)
        return [_typed(item, element) for element in value]
    for option in get_args(annotation) if get_origin(annotation) is not list else ():
        if _model_class(option) is not None and isinstance(value, dict):
            return partial_model(option, value)
    return value


def _model_class(annotation: Any) -> Any:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


class _Reader:
    """A cursor over the text; each method reads one value or raises ``_Incomplete``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def _skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in _WHITESPACE:
            self.at += 1

    def _peek(self) -> str:
        self._skip()
        if self.at >= len(self.text):
            raise _Incomplete
        return self.text[self.at]

    def value(self) -> Any:
        first = self._peek()
        if first == "{":
            return self._object()
        if first == "[":
            return self._array()
        if first == '"':
            return self._string()[0]
        return self._scalar()

    def _object(self) -> dict[str, Any]:
        self.at += 1
        members: dict[str, Any] = {}
        while True:
            try:
                char = self._peek()
                if char == "}":
                    self.at += 1
                    return members
                if char == ",":
                    self.at += 1
                    char = self._peek()
                key, whole = self._string()
                if not whole or self._peek() != ":":
                    raise _Incomplete
                self.at += 1
                self._peek()  # its value has begun
            except _Incomplete:
                return members
            try:
                members[key] = self.value()
            except _Incomplete:
                return members
            if self.at >= len(self.text):
                return members

    def _array(self) -> list[Any]:
        self.at += 1
        elements: list[Any] = []
        while True:
            try:
                char = self._peek()
                if char == "]":
                    self.at += 1
                    return elements
                if char == ",":
                    self.at += 1
                elements.append(self.value())
            except _Incomplete:
                return elements
            if self.at >= len(self.text):
                return elements

    def _string(self) -> tuple[str, bool]:
        """A string from its opening quote: its text so far and whether it closed."""
        if self._peek() != '"':
            raise _Incomplete
        self.at += 1
        parts: list[str] = []
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char == '"':
                self.at += 1
                return "".join(parts), True
            if char != "\\":
                end = self.at
                while end < len(text) and text[end] not in '"\\':
                    end += 1
                parts.append(text[self.at:end])
                self.at = end
                continue
            escape = text[self.at + 1:self.at + 2]
            if escape == "u":
                code = text[self.at + 2:self.at + 6]
                if len(code) < 4:
                    break  # the escape is not whole yet: the string so far ends before it
                char_code = int(code, 16)
                if 0xD800 <= char_code < 0xDC00:  # a surrogate pair: both halves, or neither yet
                    low = text[self.at + 6:self.at + 12]
                    if len(low) < 6:
                        break
                    parts.append(json.loads(f'"\\u{code}{low}"'))
                    self.at += 12
                    continue
                parts.append(chr(char_code))
                self.at += 6
            elif escape in _ESCAPES:
                parts.append(_ESCAPES[escape])
                self.at += 2
            else:
                break
        self.at = len(text)
        return "".join(parts), False

    def _scalar(self) -> Any:
        """A number or literal, only when something after it shows it is whole."""
        text, start = self.text, self.at
        for word, value in _LITERALS.items():
            if text.startswith(word, start):
                self.at = start + len(word)
                return value
        match = _NUMBER.match(text, start)
        if match is None or match.end() >= len(text) or text[match.end()] not in _WHITESPACE + ",]}":
            raise _Incomplete  # the digits may go on ("1" of "1.5"), or the literal is not whole
        self.at = match.end()
        number = match.group()
        return float(number) if any(c in number for c in ".eE") else int(number)
