"""JSON extraction with a pydantic model: the value comes back as a validated instance.

The model is the embedded SmolLM2-135M-Instruct; the output is constrained to the model's JSON
Schema, so it always parses, and ``Result.value`` is a ``Book`` instance (None if the output
were cut short by ``max_tokens``). Run: ``.venv/bin/python examples/extract_pydantic.py``.
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import cdsl_struct as cs


class Book(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=60)
    author: str = Field(max_length=40)
    year: int = Field(ge=1000, le=2100)
    genre: Literal["fiction", "science", "history", "poetry"]


PASSAGE = ("Mary Shelley's Frankenstein, first published in 1818, is often called the first science "
           "fiction novel.")


def main() -> int:
    generator = cs.Generator()  # loads the embedded model once; reuse it for many calls
    result = generator.generate(f"Extract the book as JSON.\n\n{PASSAGE}", schema=Book, max_tokens=64)
    print(f"text    {result.text}")
    print(f"value   {result.value!r}")
    print(f"finish  {result.finish_reason} (complete: {result.complete}, method: {result.method})")
    stats = result.stats
    print(f"cost    {stats.tokens} tokens in {stats.target_passes} target passes "
          f"({stats.accepted}/{stats.proposed} speculated tokens accepted, {stats.forced} forced)")
    return 0 if isinstance(result.value, Book) else 1


if __name__ == "__main__":
    sys.exit(main())
