"""A real sentence as a hard constraint: whole words from a word list, single spaces, a period.

The loose sentence regex (``[A-Z][a-z]*( [A-Za-z,']+){2,24}\\.``) lets a model glue tokens into
non-words ("ateam", "glassfulfilledglass"): any run of letters is allowed. Here every word must be
one of a fixed list (the most frequent English words of ``wordfreq``, plus the inflections of the
task's keywords), so a token that would glue two words leaves the list and is masked out; the
rule is exact, not a heuristic. The list is written as a prefix tree (one regex branch per first
letter, and so on), which keeps llguidance's lexer small; the repetition lives in the grammar, not
in the regex. Only the first word is capitalised; words are separated by one space or ", ".

Each keyword at most ``max_repeats`` times is left to the reward (``KeywordCoverage(max_repeats=)``),
which is exact about it (stuffing scores less), and measured by the bench: counting several
keywords at once is a product of counters, which neither a regex nor a context-free grammar
writes compactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from cdsl_struct.rewards import inflections

LOOSE_SENTENCE = r"[A-Z][a-z]*( [A-Za-z,']+){2,24}\."
WORD_LIST_SIZE = 30000
REAL_WORD_ZIPF = 2.0
"""A word is real when ``wordfreq`` gives it at least this Zipf frequency (100 per billion words):
web-text fusions such as "ateam" (1.14) fall below it; rare real words such as "unicycle" (2.37)
or "sheepdog" (2.45) stay above."""
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


@lru_cache(maxsize=4)
def common_words(size: int = WORD_LIST_SIZE) -> tuple[str, ...]:
    """The ``size`` most frequent English words of ``wordfreq`` that are plain lower-case letters
    (single letters only ``a`` and ``i``)."""
    from wordfreq import top_n_list

    return tuple(w for w in top_n_list("en", size)
                 if re.fullmatch("[a-z]+", w) and (len(w) > 1 or w in ("a", "i")))


def trie_regex(words: Iterable[str]) -> str:
    """One regex matching exactly ``words``, factored as a prefix tree."""
    trie: dict = {}
    for word in words:
        if not word:
            continue
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    if not trie:
        raise ValueError("trie_regex needs at least one non-empty word")

    def emit(node: dict) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        if len(branches) == 1 and "" not in node:
            return branches[0]
        body = "(?:" + "|".join(branches) + ")"
        return body + "?" if "" in node else body

    return emit(trie)


def sentence_words(keywords: Iterable[str] = (), size: int = WORD_LIST_SIZE) -> list[str]:
    """The allowed words: ``common_words(size)`` plus every inflection of every keyword
    (CommonGen tags such as ``_N`` dropped), sorted."""
    words = set(common_words(size))
    for keyword in keywords:
        words.update(form for form in inflections(re.sub(r"_[A-Z]+$", "", keyword).lower())
                     if re.fullmatch("[a-z]+", form))
    return sorted(words)


def sentence_grammar(keywords: Iterable[str] = (), size: int = WORD_LIST_SIZE) -> str:
    """A Lark grammar for one sentence of listed words (see the module docstring): a capitalised
    first word, at least two more words each after ``" "`` or ``", "``, and a final period."""
    words = sentence_words(keywords, size)
    first = trie_regex(sorted({w.capitalize() for w in words} | {"I"}))
    rest = trie_regex(words)
    return (f'start: FIRST (SEP WORD) (SEP WORD)+ "."\n'
            f'SEP: " " | ", "\n'
            f"FIRST: /{first}/\n"
            f"WORD: /{rest}/\n")


def words_of(text: str) -> list[str]:
    """The words of ``text`` (letters, with an inner apostrophe), lower-cased."""
    return [w.lower() for w in _WORD.findall(text)]


def real_word_share(text: str, keywords: Iterable[str] = ()) -> float:
    """The share of ``text``'s words that are English words (Zipf frequency at least
    ``REAL_WORD_ZIPF`` in ``wordfreq``, or an inflection of a keyword); 1.0 for text without words."""
    from wordfreq import zipf_frequency

    words = words_of(text)
    if not words:
        return 1.0
    known: set[str] = set()
    for keyword in keywords:
        known |= inflections(re.sub(r"_[A-Z]+$", "", keyword).lower())
    return sum(w in known or zipf_frequency(w, "en") >= REAL_WORD_ZIPF for w in words) / len(words)


def repeated_block(text: str, times: int = 3, max_words: int = 8) -> bool:
    """Whether ``text`` writes one block of up to ``max_words`` words ``times`` times in a row
    (``"a body, a body, a body"``; punctuation between words is ignored, case too)."""
    words = words_of(text)
    for size in range(1, max_words + 1):
        for start in range(len(words) - size * times + 1):
            block = words[start:start + size]
            if all(words[start + k * size:start + (k + 1) * size] == block for k in range(1, times)):
                return True
    return False
