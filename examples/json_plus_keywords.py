"""JSON plus keywords: a hard JSON Schema and a soft keyword reward together.

The schema guarantees the shape (the output always parses and validates); ``keywords=`` steers
the wording towards the given words with CDSL. Run: ``.venv/bin/python examples/json_plus_keywords.py``.
"""

from __future__ import annotations

import sys

import jsonschema

import cdsl_struct as cs
from cdsl_struct.rewards import KeywordCoverage

AD = {
    "type": "object",
    "properties": {
        "headline": {"type": "string", "maxLength": 60},
        "body": {"type": "string", "maxLength": 160},
    },
    "required": ["headline", "body"],
    "additionalProperties": False,
}
KEYWORDS = ["coffee", "morning", "fresh"]
PROMPT = ("Write a short advertisement for a cafe as JSON with a headline and a body. "
          f"Use the words {', '.join(KEYWORDS)}.")


def main() -> int:
    generator = cs.Generator()
    coverage = KeywordCoverage(KEYWORDS)
    ok = True
    for keywords in (None, KEYWORDS):
        result = generator.generate(PROMPT, schema=AD, keywords=keywords, max_tokens=96)
        print(f"{result.method:12s} covered {len(coverage.covered(result.text))}/{len(KEYWORDS)}  "
              f"{result.finish_reason}  {result.value if result.complete else result.text}")
        if result.complete:
            jsonschema.validate(result.value, AD)
        ok &= result.complete
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
