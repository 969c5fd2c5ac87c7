"""Keyword-constrained sentences: use all the given words, in any inflection.

A regex keeps the output one bounded sentence (hard constraint); ``keywords=`` adds keyword
coverage as a reward (soft constraint) and ``method="auto"`` then decodes with CDSL (draft
lookahead verified by the target and the reward). Plain target decoding and CDLH (target
roll-outs for every candidate: steers harder, costs many more passes) are shown beside it.
Run: ``.venv/bin/python examples/keywords_sentence.py``.
"""

from __future__ import annotations

import os
import sys

import cdsl_struct as cs
from cdsl_struct.rewards import KeywordCoverage

SENTENCE = r"[A-Z][a-z]*( [A-Za-z,']+){2,24}\."
CONCEPTS = [["dog", "frisbee", "catch", "throw"], ["field", "look", "stand"]]
FAST = os.environ.get("CDSL_EXAMPLE_FAST") == "1"  # the test suite: one word set, no CDLH, shorter


def main() -> int:
    generator = cs.Generator()
    for words in CONCEPTS[:1] if FAST else CONCEPTS:
        prompt = f"Write one short, natural sentence that uses all of these words: {', '.join(words)}."
        coverage = KeywordCoverage(words)
        print(f"\nwords  {', '.join(words)}")
        for method in ("target", "auto") if FAST else ("target", "auto", "cdlh"):
            result = generator.generate(prompt, regex=SENTENCE, keywords=words if method != "target" else None,
                                        method=method, max_tokens=24 if FAST else 40)
            print(f"{result.method:7s} covered {len(coverage.covered(result.text))}/{len(words)}  "
                  f"passes {result.stats.target_passes:3d}  {result.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
