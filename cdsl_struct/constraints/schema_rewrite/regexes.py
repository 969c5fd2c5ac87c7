"""Regexes the rewriter writes: the complement of a finite set of strings.

The patterns are read by two dialects: Python's ``re`` (``jsonschema``, which judges outputs)
and Rust's ``regex`` (llguidance). They use only what both read alike: ``^``, ``$``, ``(?:...)``,
``|``, character classes, ``*``/``+`` and ``\\uXXXX`` escapes. Python's ``$`` also matches before
a final newline, so ``^abc$`` admits ``"abc\\n"``; the complements here account for that and
refuse sets whose strings hold a newline.
"""

from __future__ import annotations

from .context import refuse

_META = set("\\.^$|?*+()[]{}")
_CLASS_META = set("\\]^[-&~")
ANY = r"[\s\S]"


def escape(char: str, in_class: bool = False) -> str:
    """``char`` as a regex atom both dialects read literally."""
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\u{ord(char):04X}"
    if char in (_CLASS_META if in_class else _META):
        return "\\" + char
    return char


def complement_of_strings(strings: set[str], keyword: str, python_dollar: bool = False) -> str:
    """An anchored pattern matching exactly the strings not in ``strings``.

    ``python_dollar``: ``strings`` came from a ``^...$`` pattern, whose matches under Python's
    ``re`` also include each string followed by one newline; exclude those too.
    """
    if any("\n" in s for s in strings):
        raise refuse(keyword, "negates a string that contains a newline")
    words = set(strings)
    if python_dollar:
        words |= {s + "\n" for s in strings}
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    return "^(?:" + _complement(trie) + ")$"


def _complement(node: dict) -> str:
    children = sorted(k for k in node if k)
    alternatives = [] if "" in node else [""]
    if children:
        alternatives.append("[^" + "".join(escape(c, in_class=True) for c in children) + "]" + ANY + "*")
        alternatives.extend(escape(c) + "(?:" + _complement(node[c]) + ")" for c in children)
    else:
        alternatives.append(ANY + "+")
    return "|".join(alternatives)


def literal_alternatives(pattern: str) -> set[str] | None:
    """The strings an anchored literal pattern ``^(a|b|c)$`` / ``^abc$`` spells, else ``None``."""
    if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
        return None
    body = pattern[1:-1]
    for opener in ("(?:", "("):
        if body.startswith(opener) and body.endswith(")") and _balanced_group(body, len(opener)):
            body = body[len(opener):-1]
            break
    words: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char == "\\":
            if i + 1 >= len(body) or body[i + 1].isalnum():
                return None  # \d, \w, \u... are not plain literals
            current.append(body[i + 1])
            i += 2
            continue
        if char == "|":
            words.append("".join(current))
            current = []
        elif char in "\\.^$?*+()[]{}":
            return None
        else:
            current.append(char)
        i += 1
    words.append("".join(current))
    return set(words)


def _balanced_group(body: str, start: int) -> bool:
    """Whether the group opened at ``body[:start]`` closes only at the end of ``body``."""
    depth, i = 1, start
    while i < len(body):
        if body[i] == "\\":
            i += 2
            continue
        if body[i] == "(":
            depth += 1
        elif body[i] == ")":
            depth -= 1
            if depth == 0:
                return i == len(body) - 1
        i += 1
    return False
