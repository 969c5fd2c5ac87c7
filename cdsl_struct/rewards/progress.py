"""Rewards that follow a hard constraint's progress: schema keys written, regex matched."""

from __future__ import annotations

import json
import re
from typing import Any

from .base import Reward


class SchemaProgress(Reward):
    """Fraction of a JSON Schema's required top-level keys already written in the text."""

    earned_by_end = True

    def __init__(self, schema: dict[str, Any]) -> None:
        self.keys = list(schema.get("required") or schema.get("properties") or [])
        if not self.keys:
            raise ValueError("SchemaProgress needs a schema with required keys or properties")

    def score(self, text: str, *, final: bool) -> float:
        written = sum(1 for key in self.keys if json.dumps(key) + ":" in text.replace('": ', '":'))
        return written / len(self.keys)


class RegexMatch(Reward):
    """1 when the regex is found in the text (``full=True``: the whole final text matches)."""

    earned_by_end = True

    def __init__(self, pattern: str, full: bool = False) -> None:
        self.pattern = re.compile(pattern)
        self.full = full

    def score(self, text: str, *, final: bool) -> float:
        if self.full:
            return float(final and self.pattern.fullmatch(text) is not None)
        return float(self.pattern.search(text) is not None)
