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
    """

    earned_by_end = True

    def __init__(self, words: Iterable[str], mode: str = "soft") -> None:
        if mode not in ("soft", "hard"):
            raise ValueError(f"mode must be 'soft' or 'hard', got {mode!r}")
        self.words = [_POS_SUFFIX.sub("", w).lower() for w in words]
        if not self.words:
            raise ValueError("KeywordCoverage needs at least one word")
        self.mode = mode
        self._forms = [inflections(w) for w in self.words]

    def covered(self, text: str) -> list[str]:
        """The words that appear in ``text`` in some inflection."""
        present = {token.lower() for token in _WORD.findall(text)}
        return [word for word, forms in zip(self.words, self._forms, strict=True) if forms & present]

    def missing(self, text: str) -> list[str]:
        covered = set(self.covered(text))
        return [w for w in self.words if w not in covered]

    def suggestions(self, text: str) -> list[str]:
        """Every inflection of every word still missing from ``text``."""
        missing = set(self.missing(text))
        return [form for word, forms in zip(self.words, self._forms, strict=True) if word in missing
                for form in sorted(forms)]

    def score(self, text: str, *, final: bool) -> float:
        fraction = len(self.covered(text)) / len(self.words)
        return fraction if self.mode == "soft" else float(fraction == 1.0)
