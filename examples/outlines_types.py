"""Outlines output types as constraints: ``Literal``, ``Enum``, pydantic, ``bool`` and Outlines' own types.

``cdsl_struct.integrations.outlines_types.to_spec`` turns what an Outlines user passes as an output
type into our spec, with the meaning Outlines gives it; ``compile()`` takes them as they are.
Run: ``.venv/bin/python examples/outlines_types.py`` (``outlines.types`` needs the extra ``outlines``).
"""

from __future__ import annotations

import enum
import sys
from typing import Literal

from pydantic import BaseModel

import cdsl_struct as cs
from cdsl_struct.integrations.outlines_types import to_spec


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Pet(BaseModel):
    name: str
    legs: int


KEYWORD = {"json_schema": "schema", "regex": "regex", "choice": "choices", "grammar": "grammar"}


def cases() -> list[tuple[str, object]]:
    found = [("Is water wet? Answer yes or no.", Literal["yes", "no"]),
             ("How does a sunny day make you feel?", Mood),
             ("Describe a dog called Rex as JSON with name and legs.", Pet),
             ("Is the Earth round? Answer True or False.", bool)]
    try:
        from outlines import types

        found.append(("Write the date of 14 March 2025 as YYYY-MM-DD.", types.date))
        found.append(("Write the IP address of localhost.", types.ipv4))
    except ImportError:
        print("(outlines not installed: its own types are skipped)")
    return found


def main() -> int:
    generator = cs.Generator(draft=None)
    ok = True
    for prompt, output_type in cases():
        spec = to_spec(output_type)
        result = generator.generate(prompt, max_tokens=40, **{KEYWORD[spec.kind]: spec})
        ok &= result.complete
        name = getattr(output_type, "__name__", None) or repr(output_type)[:30]
        print(f"{name:30s} {spec.kind:12s} {result.finish_reason:6s} {result.value!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
