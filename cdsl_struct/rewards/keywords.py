"""Keyword coverage: how many of the given words appear, in any inflection."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from .base import Reward

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_POS_SUFFIX = re.compile(r"_[A-Z]+$")


@lru_cache(maxsize=4096)
def inflections(word: str) -> frozenset[str]:
    """Every form of ``word`` (``stand`` -> stand, stands, stood, standing), lower-cased.

    Uses lemminflect, whose tables ship inside the package: nothing is downloaded.
    """
    from lemminflect import getAllInflections, getAllLemmas

    base = word.lower()
    forms = {base}
    lemmas = {lemma for group in getAllLemmas(base).values() for lemma in group} | {base}
    for lemma in lemmas:
        forms.add(lemma)
        for group in getAllInflections(lemma).values():
            forms.update(form.lower() for form in group)
    return frozenset(forms)


class KeywordCoverage(Reward):
    """Fraction of ``words`` present (``mode="soft"``), or 1/0 for all present (``"hard"``).

    Words may carry CommonGen part-of-speech tags (``field_N``, ``look_V``); the tag is dropped.
    ``max_repeats`` (default: no limit) penalises stuffing: every occurrence of a word beyond
    ``max_repeats`` (inflections count as the word) takes one word's share off the soft score,
    and in ``"hard"`` mode any excess scores 0, so repeating a keyword never earns more.
    """

    earned_by_end = True

    def __init__(self, words: Iterable[str], mode: str = "soft", max_repeats: int | None = None) -> None:
        if mode not in ("soft", "hard"):
            raise ValueError(f"mode must be 'soft' or 'hard', got {mode!r}")
        if max_repeats is not None and max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1 or None, got {max_repeats}")
        self.words = [_POS_SUFFIX.sub("", w).lower() for w in words]
        if not self.words:
            raise ValueError("KeywordCoverage needs at least one word")
        self.mode = mode
        self.max_repeats = max_repeats
        self._forms = [inflections(w) for w in self.words]

    def counts(self, text: str) -> list[int]:
        """How often each word occurs in ``text`` (any inflection), in the order of ``words``."""
        tokens = [token.lower() for token in _WORD.findall(text)]
        return [sum(token in forms for token in tokens) for forms in self._forms]

    def covered(self, text: str) -> list[str]:
        """The words that appear in ``text`` in some inflection."""
        present = {token.lower() for token in _WORD.findall(text)}
        return [word for word, forms in zip(self.words, self._forms, strict=True) if forms & present]

    def excess(self, text: str) -> int:
        """Occurrences beyond ``max_repeats``, summed over the words (0 without a limit)."""
        if self.max_repeats is None:
            return 0
        return sum(max(0, count - self.max_repeats) for count in self.counts(text))

    def missing(self, text: str) -> list[str]:
        covered = set(self.covered(text))
        return [w for w in self.words if w not in covered]

    def suggestions(self, text: str) -> list[str]:
        """Every inflection of every word still missing from ``text``."""
        missing = set(self.missing(text))
        return [form for word, forms in zip(self.words, self._forms, strict=True) if word in missing
                for form in sorted(forms)]

    def spent(self, text: str) -> list[str]:
        """Every inflection of every word already written ``max_repeats`` times in ``text`` (one
        more would count against the score); none without a limit."""
        if self.max_repeats is None:
            return []
        return [form for forms, count in zip(self._forms, self.counts(text), strict=True)
                if count >= self.max_repeats for form in sorted(forms)]

    def score(self, text: str, *, final: bool) -> float:
        covered, excess = len(self.covered(text)), self.excess(text)
        if self.mode == "hard":
            return float(covered == len(self.words) and excess == 0)
        return max(0.0, covered - excess) / len(self.words)
