"""Lark grammars: an arithmetic expression and an SQL SELECT statement.

Both grammars ship with the library (``arithmetic.lark``, ``sql_select.lark`` in ``cdsl_struct/grammars/``);
``grammar=`` also takes Lark text or a ``.lark`` path. The output always parses, and
``Result.value`` is its ``lark.Tree``. Run: ``.venv/bin/python examples/grammar_arithmetic_sql.py``.
"""

from __future__ import annotations

import sys

import lark

import cdsl_struct as cs

TASKS = [
    ("arithmetic", "Write an arithmetic expression for: three times four, plus two."),
    ("sql_select", "Table users has columns name and age. Write SQL to select the names of users older than 30."),
]


def main() -> int:
    generator = cs.Generator()
    ok = True
    for grammar, prompt in TASKS:
        result = generator.generate(prompt, grammar=grammar, max_tokens=48)
        print(f"{grammar}: {result.text}  ({result.finish_reason})")
        if isinstance(result.value, lark.Tree):
            print(result.value.pretty())
        ok &= isinstance(result.value, lark.Tree)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
