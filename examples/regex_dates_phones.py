"""Regex constraints: ISO dates and phone numbers, several prompts in one batch.

Each output fully matches its regex. A list of prompts is decoded one after the other with the
regex compiled once. The 135M model may get the digits wrong; the format is never wrong.
Run: ``.venv/bin/python examples/regex_dates_phones.py``.
"""

from __future__ import annotations

import re
import sys

import cdsl_struct as cs

ISO_DATE = r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
PHONE = r"\+\d{1,3} \d{2,4} \d{3,4} \d{3,4}"

DATES = [
    "Write the date of the Moon landing, 20 July 1969, as YYYY-MM-DD.",
    "The meeting is on March 3rd, 2025. Write that date as YYYY-MM-DD.",
]
PHONES = [
    "Write the phone number 020 7946 0958 in international form with the UK code +44.",
    "Write the French number 01 23 45 67 89 in international form with the code +33.",
]


def main() -> int:
    generator = cs.Generator()
    ok = True
    for pattern, prompts in ((ISO_DATE, DATES), (PHONE, PHONES)):
        results = generator.generate_batch(prompts, regex=pattern, max_tokens=24)
        for prompt, result in zip(prompts, results, strict=True):
            matches = result.complete and re.fullmatch(pattern, result.text) is not None
            ok &= matches
            print(f"{result.text:20s} matches={matches}  <- {prompt}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
