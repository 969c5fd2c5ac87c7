"""Whitespace policy for JSON output: configurable, always bounded, one default.

Unbounded whitespace lets a small model emit spaces or newlines forever, so every policy
allows a bounded amount between JSON tokens:

- ``"compact"``: none at all (``{"a":1,"b":[2,3]}``);
- ``"spaced"``: exactly Python's ``json.dumps`` separators ``", "`` and ``": "`` and nothing else;
- ``"flexible"``: at most one space at every place JSON allows whitespace;
- ``"newlines"``: at every such place, nothing, one space, or a newline and up to 8 spaces of
  indent (JSON laid out on lines, as models often write it);
- ``"any"``: at every such place, any run of spaces, tabs and newlines up to 16 characters: the
  model lays the JSON out as it prefers (XGrammar's default, with a bound);
- any other string is a regex for one whitespace slot, e.g. ``"[ \\n]{0,2}"``; it must be bounded.

``DEFAULT_WHITESPACE`` is the policy the library uses when none is given; ``cdsl-struct bench
quality`` measures the candidates (BENCHMARKS.md says why this one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import CompileError
from ..options import DEFAULT_WHITESPACE, WHITESPACE_POLICIES

try:
    from re import _constants as sre_constants
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_WHITESPACE_CHARS = set(" \t\n\r")
NEWLINES_PATTERN = r"(?:\n[ ]{0,8}|[ ])?"
ANY_PATTERN = r"[ \t\n]{0,16}"
NAMED_POLICIES = WHITESPACE_POLICIES
__all__ = ["DEFAULT_WHITESPACE", "NAMED_POLICIES", "WhitespacePolicy"]


@dataclass(frozen=True)
class WhitespacePolicy:
    """Where JSON output may hold whitespace. ``pattern`` is the regex of one slot ("" = none)."""

    name: str
    pattern: str = ""
    item_separator: str = ","
    key_separator: str = ":"

    @classmethod
    def parse(cls, value: str | WhitespacePolicy) -> WhitespacePolicy:
        if isinstance(value, WhitespacePolicy):
            return value
        if value == "compact":
            return cls("compact")
        if value == "spaced":
            return cls("spaced", item_separator=", ", key_separator=": ")
        if value == "flexible":
            return cls("flexible", pattern="[ ]?")
        if value == "newlines":
            return cls("newlines", pattern=NEWLINES_PATTERN)
        if value == "any":
            return cls("any", pattern=ANY_PATTERN)
        _check_bounded_whitespace(value)
        return cls("pattern", pattern=value)

    @property
    def key(self) -> str:
        return f"{self.name}:{self.pattern}"


def _check_bounded_whitespace(pattern: str) -> None:
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise CompileError(f"whitespace pattern {pattern!r} is not a valid regex: {exc}") from None
    if _unbounded(parsed.data):
        raise CompileError(
            f"whitespace pattern {pattern!r} is unbounded; use a bounded repeat such as {{0,4}}"
        )
    for char in _literal_chars(parsed.data):
        if char not in _WHITESPACE_CHARS:
            raise CompileError(f"whitespace pattern {pattern!r} matches a non-whitespace character {char!r}")


def _unbounded(items: list) -> bool:
    for op, arg in items:
        if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            low, high, body = arg
            if high == sre_constants.MAXREPEAT or _unbounded(body.data):
                return True
        elif op == sre_constants.SUBPATTERN and _unbounded(arg[-1].data):
            return True
        elif op == sre_constants.BRANCH and any(_unbounded(b.data) for b in arg[1]):
            return True
    return False


def _literal_chars(items: list) -> list[str]:
    chars: list[str] = []
    for op, arg in items:
        if op == sre_constants.LITERAL:
            chars.append(chr(arg))
        elif op == sre_constants.IN:
            for inner_op, inner_arg in arg:
                if inner_op == sre_constants.LITERAL:
                    chars.append(chr(inner_arg))
                elif inner_op == sre_constants.RANGE:
                    chars.extend(chr(c) for c in range(inner_arg[0], inner_arg[1] + 1))
                else:
                    chars.append("<class>")
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            chars.extend(_literal_chars(arg[2].data))
        elif op == sre_constants.SUBPATTERN:
            chars.extend(_literal_chars(arg[-1].data))
        elif op == sre_constants.BRANCH:
            for branch in arg[1]:
                chars.extend(_literal_chars(branch.data))
        else:
            chars.append(f"<{op}>")
    return chars
