"""Keyword coverage: how many of the given words appear, in any inflection."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

from .base import Reward

_WORD = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)?")
"""A word: letters (accented ones too: "café"), with one apostrophe inside ("don't", "child's")."""
_POSSESSIVE = ("'s", "\u2019s")
_PHRASE_SPLIT = re.compile(r"[\s-]+")
_NOT_OF_WORDS = re.compile(r"[^\w\s'\u2019-]|[\d_]")
"""A character no word or phrase of ``_WORD``'s holds: a keyword with one ("C++", "5G", "COVID-19",
"Python 3.12") is matched as written (``literal_pattern``), not by inflection."""
_POS_SUFFIX = re.compile(r"_[A-Z]+$")
_FILLERS = frozenset({"a", "an", "the", "and", "or", "some"})
LIST_ITEMS = 3
"""A text is a list once this many of its comma-separated pieces are items (``list_shaped``)."""
ITEM_WORDS = 2
"""A piece of at most this many words, not counting articles and "and"/"or", is an item."""


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


@lru_cache(maxsize=4096)
def is_word(text: str) -> bool:
    """Whether ``text`` is an English noun, verb, adjective or adverb in some form (lemminflect's tables)."""
    from lemminflect import getAllLemmas

    return bool(getAllLemmas(text.lower()))


def keyword_forms(word: str) -> frozenset[str]:
    """``inflections`` of a keyword; of a phrase ("ice cream", "t-shirt"), those of its last word after
    the others, words joined by single spaces ("ice creams", "t shirt"), as ``_words`` reads text."""
    parts = [part for part in _PHRASE_SPLIT.split(word.lower()) if part]
    if len(parts) <= 1:
        return inflections(word)
    head = " ".join(parts[:-1])
    return frozenset(f"{head} {form}" for form in inflections(parts[-1]))


def literal_pattern(keyword: str) -> re.Pattern[str] | None:
    """How a keyword that is not made of words (``_NOT_OF_WORDS``) is found in text: as written,
    case aside, not inside a longer run of letters and digits ("C++" in "I write c++ code", not
    "5G" in "15G"); None for a keyword of words, which is matched in any inflection."""
    if not _NOT_OF_WORDS.search(keyword):
        return None
    left = r"(?<![^\W_])" if keyword[0].isalnum() else ""
    right = r"(?![^\W_])" if keyword[-1].isalnum() else ""
    return re.compile(left + re.escape(keyword) + right, re.IGNORECASE)


def _words(text: str) -> list[str]:
    """The words of ``text``, lower-cased, a possessive's "'s" dropped ("child's" -> "child")."""
    words = []
    for word in _WORD.findall(text):
        word = word.lower()
        words.append(word[:-2] if word.endswith(_POSSESSIVE) else word)
    return words


TALK_ABOUT_WORDS = ("word", "sentence", "letter", "phrase", "keyword", "noun", "verb", "alphabet")
"""Words of text about the keywords rather than with them, which a small model writes when asked
for a sentence that uses some words ("Ate, food, front is a sentence that uses all the words.")."""
_SEPARATORS = ",;"
_STOPS = ".!?"
_ENDED = re.compile(r"[.!?][\"')\]]*\s*$")


@lru_cache(maxsize=8)
def _kinds(pieces: tuple[str | None, ...]) -> tuple[list[int], list[int], list[int]]:
    """Which of ``pieces`` have no letters before their last mark: those that hold a separator,
    those that only end a sentence (None, the output's end, too); and which have letters there
    (judged one by one)."""
    separated, ending, worded = [], [], []
    for index, piece in enumerate(pieces):
        last = None if piece is None else max((i for i, c in enumerate(piece) if c in _SEPARATORS + _STOPS),
                                              default=None)
        if piece is not None and last is None:
            continue
        if piece is not None and _WORD.search(piece[:last]):
            worded.append(index)
        else:
            (separated if piece is not None and any(c in _SEPARATORS for c in piece) else ending).append(index)
    return separated, ending, worded


def _closed_items(text: str, *, final: bool) -> int:
    """How many of ``text``'s comma-separated pieces are items, the last one only when ``final``."""
    pieces = re.split(r"[,;]", text)
    return sum(_is_item(piece) for piece in (pieces if final else pieces[:-1]))


def _is_item(piece: str) -> bool:
    words = [w for w in _WORD.findall(piece) if w.lower() not in _FILLERS]
    return 0 < len(words) <= ITEM_WORDS


def list_shaped(text: str, *, final: bool) -> bool:
    """Whether ``text`` reads as a list of words rather than a sentence: at least ``LIST_ITEMS`` of
    its comma-separated pieces are items of at most ``ITEM_WORDS`` words (articles and "and"/"or"
    not counted), as in "Jockey, horse, race, ride." or "Sit, a card, a floor, a shuffle.".
    "He bought eggs, milk, and bread." has one item and is a sentence. Unfinished (``final``
    false), the piece after the last comma is still being written and is not judged, so a text
    once list-shaped stays so as it grows.
    """
    return _closed_items(text, final=final) >= LIST_ITEMS


def json_string_values(text: str) -> list[tuple[str, bool]]:
    """The string values of a JSON text, finished or not, in order (object keys left out), each as
    written between its quotes (escapes kept) with whether its closing quote is there yet."""
    values: list[tuple[str, bool]] = []
    containers: list[str] = []
    key_next = False
    at, end = 0, len(text)
    while at < end:
        char = text[at]
        if char == '"':
            close = at + 1
            while close < end and text[close] != '"':
                close += 2 if text[close] == "\\" else 1
            if not (key_next and containers and containers[-1] == "{"):
                values.append((text[at + 1:min(close, end)], close < end))
            at = close + 1
            continue
        if char in "{[":
            containers.append(char)
            key_next = char == "{"
        elif char in "}]":
            if containers:
                containers.pop()
            key_next = False
        elif char == ":":
            key_next = False
        elif char == ",":
            key_next = bool(containers) and containers[-1] == "{"
        at += 1
    return values


def _closing_quote(piece: str, escaped: bool) -> int | None:
    """Where ``piece`` closes the JSON string it continues (its first quote not escaped; ``escaped``: the
    string so far ends in an escaping backslash), or None."""
    at = 0
    while at < len(piece):
        if escaped:
            escaped = False
        elif piece[at] == "\\":
            escaped = True
        elif piece[at] == '"':
            return at
        at += 1
    return None


class KeywordCoverage(Reward):
    """Fraction of ``words`` present (``mode="soft"``), or 1/0 for all present (``"hard"``).

    Words may carry CommonGen part-of-speech tags (``field_N``, ``look_V``); the tag is dropped.
    ``max_repeats`` (default: no limit) penalises stuffing: every occurrence of a word beyond
    ``max_repeats`` (inflections count as the word) takes one word's share off the soft score,
    and in ``"hard"`` mode any excess scores 0, so repeating a keyword never earns more.
    ``no_lists`` scores 0 for a text that lists words instead of using them in a sentence
    (``list_shaped``), that opens by listing them, a keyword as an item of its own ("Jump, pool,
    stand are all the same."), or that ends holding nothing but keywords ("Jump pool stand."): a
    list holds every keyword at no cost in fluency, and would otherwise earn as much as a sentence.
    ``json_values``: the text is JSON (a schema's answer), and ``no_lists`` judges each of its string
    values instead: ``list_shaped`` ("Car, gas, pump, station"), opening with a keyword as an item of
    its own ("Door, open, slide. This is ..."), or, closed, three keywords or more and nothing else
    ("Door open slide"); a value of one or two keywords may be a tag. The guard then keeps the
    separator and the closing quote that would make the value being written ``list_shaped`` off it,
    and leaves the JSON's own commas alone.
    ``off_topic``: words (any inflection) a text earns nothing with, e.g. ``TALK_ABOUT_WORDS`` for
    text about the keywords instead of with them
    ("Boat, dock, water are all words that use all the letters of the alphabet."); a keyword is
    never off topic. ``hold_ending`` (a word count, 0: off): while a word is missing from a text of
    fewer words than that, the tokens that would end it (a full stop, ``!``, ``?``, the output's end)
    are among those ``losing`` names, so CDSL and CDLH write on where anything else is allowed
    ("Sleigh." becomes a sentence with the dog in it; where only an ending fits, as a budget closer
    leaves it, the guard gives way); a longer text may end short of its words rather than ramble on.
    The score is the same.
    """

    earned_by_end = True

    def __init__(self, words: Iterable[str], mode: str = "soft", max_repeats: int | None = None,
                 no_lists: bool = False, off_topic: Iterable[str] = (), hold_ending: int = 0,
                 json_values: bool = False) -> None:
        if mode not in ("soft", "hard"):
            raise ValueError(f"mode must be 'soft' or 'hard', got {mode!r}")
        if max_repeats is not None and max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1 or None, got {max_repeats}")
        if isinstance(hold_ending, bool) or not isinstance(hold_ending, int) or hold_ending < 0:
            raise ValueError(f"hold_ending must be a word count >= 0, got {hold_ending!r}")
        originals = [_POS_SUFFIX.sub("", w).strip() for w in words]
        self.words = [w.lower() for w in originals]
        if not self.words:
            raise ValueError("KeywordCoverage needs at least one word")
        self.mode = mode
        self.max_repeats = max_repeats
        self.no_lists = no_lists
        self.hold_ending = hold_ending
        self.json_values = json_values
        self._literals = [literal_pattern(w) for w in self.words]
        self._forms = [frozenset({w}) if literal else keyword_forms(w)
                       for w, literal in zip(self.words, self._literals, strict=True)]
        # a phrase's forms as word tuples, matched in the text's word sequence
        self._phrases = [[] if literal else [tuple(f.split(" ")) for f in forms if " " in f]
                         for forms, literal in zip(self._forms, self._literals, strict=True)]
        # what the draft is steered to write: a literal keyword as it was given ("C++", not "c++")
        self._spellings = [(original,) if literal else tuple(sorted(forms))
                           for original, forms, literal in zip(originals, self._forms, self._literals, strict=True)]
        self._form_words = frozenset(w for forms in self._forms for form in forms for w in form.split(" "))
        own = frozenset().union(*self._forms)
        self.off_topic = [w.lower() for w in off_topic if not inflections(w) & own]
        self._off_topic_forms = frozenset().union(*(inflections(w) for w in self.off_topic))

    def counts(self, text: str) -> list[int]:
        """How often each word occurs in ``text`` (any inflection; a phrase as consecutive words), in
        the order of ``words``."""
        tokens = _words(text)
        counts = []
        for forms, phrases, literal in zip(self._forms, self._phrases, self._literals, strict=True):
            if literal is not None:
                counts.append(len(literal.findall(text)))
                continue
            count = sum(token in forms for token in tokens)
            for phrase in phrases:
                count += sum(tuple(tokens[i:i + len(phrase)]) == phrase for i in range(len(tokens)))
            counts.append(count)
        return counts

    def covered(self, text: str) -> list[str]:
        """The words that appear in ``text`` in some inflection."""
        return [word for word, count in zip(self.words, self.counts(text), strict=True) if count]

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
        return [form for word, forms in zip(self.words, self._spellings, strict=True) if word in missing
                for form in forms]

    def spent(self, text: str) -> list[str]:
        """Every inflection of every word already written ``max_repeats`` times in ``text`` (one
        more would count against the score), and of every ``off_topic`` word (one would lose it)."""
        spent = sorted(self._off_topic_forms)
        if self.max_repeats is not None:
            spent += [form for forms, count in zip(self._spellings, self.counts(text), strict=True)
                      if count >= self.max_repeats for form in forms]
        return spent

    def failed(self, text: str) -> bool:
        """Whether ``text`` has lost the reward for good: it holds an ``off_topic`` word, or, with
        ``no_lists``, it is already a list of words or opens as one."""
        return self._talks_off_topic(text) or (self.no_lists and self._listed(text, final=False))

    def _listed(self, text: str, final: bool) -> bool:
        """``list_shaped``, or opening with a keyword as an item of its own ("Jump, pool, stand are
        all the same."): the words of the request listed as the sentence's subject; finished, a text of
        keywords alone ("Jump pool stand.", "Boat dock water."): their list without its commas. With
        ``json_values``: any string value ``list_shaped`` (a closed one judged as finished)."""
        if self.json_values:
            return any(list_shaped(value, final=final or closed) or self._opens_with_keyword(value)
                       or ((final or closed) and self._keywords_alone(value, LIST_ITEMS))
                       for value, closed in json_string_values(text))
        return list_shaped(text, final=final) or self._opens_with_keyword(text) or \
            (final and self._keywords_alone(text))

    def _keywords_alone(self, text: str, least: int = 2) -> bool:
        words = _words(text)
        return len(words) >= least and all(w in self._form_words for w in words)

    def _opens_with_keyword(self, text: str) -> bool:
        pieces = re.split(r"[,;]", text, maxsplit=1)
        if len(pieces) < 2:
            return False
        words = [w for w in _words(pieces[0]) if w not in _FILLERS]
        return 0 < len(words) <= ITEM_WORDS and any(w in self._form_words for w in words)

    def _talks_off_topic(self, text: str) -> bool:
        return bool(self._off_topic_forms) and any(w in self._off_topic_forms for w in _words(text))

    @property
    def guard_marks(self) -> str:  # type: ignore[override]
        """With ``no_lists``: a list is made by closing an item (a separator) or by ending the
        sentence on one (a full stop, or the output's end). With ``hold_ending`` alone: the stops.
        With ``json_values``: a separator, or the quote that closes a value."""
        if self.json_values:
            return _SEPARATORS + '"' if self.no_lists else ""
        return _SEPARATORS + _STOPS if self.no_lists else (_STOPS if self.hold_ending else "")

    def losing(self, text: str, pieces: Sequence[str | None]) -> list[int]:
        """With ``no_lists``: the pieces that make ``text`` a list, by closing its last item (or a
        keyword that opens it as one), or by ending the sentence (a full stop; None, the output's
        end) as a list. With ``hold_ending``: the pieces that end a sentence of fewer words than that
        while a word is missing."""
        if not (self.no_lists or self.hold_ending) or self.failed(text):
            return []
        if self.json_values:
            return self._losing_in_value(text, pieces)
        separated, ending, worded = _kinds(tuple(pieces))
        lost = []
        # a separator closes the last piece (a list's item, or a keyword opening the sentence as one);
        # an ending judges every piece as final
        if self.no_lists and separated and self._listed(text + _SEPARATORS[0], final=False):
            lost += separated
        if ending and self._ends_lost(text):
            lost += ending
        for index in worded:  # letters before a mark: the piece's words count too
            piece = pieces[index]
            stop = next((i for i, c in enumerate(piece) if c in _STOPS), None)
            if self.failed(text + piece) or (stop is not None and self._ends_lost(text + piece[:stop])):
                lost.append(index)
        return sorted(lost)

    def _losing_in_value(self, text: str, pieces: Sequence[str | None]) -> list[int]:
        """``losing`` of a JSON text: the pieces whose separator, or closing quote, makes the string value
        being written a list; none where no value is open (the JSON's own commas)."""
        values = json_string_values(text)
        if not values or values[-1][1]:  # an unclosed value is where the text ends
            return []
        value = values[-1][0]
        written = re.split(r"[,;]", value)
        items = sum(_is_item(piece) for piece in written[:-1])
        escaped = (len(value) - len(value.rstrip("\\"))) % 2 == 1
        lost = []
        for index, piece in enumerate(pieces):
            if piece is None:
                continue
            quote = _closing_quote(piece, escaped)
            part = piece if quote is None else piece[:quote]
            marks = sum(part.count(mark) for mark in _SEPARATORS) + (quote is not None)
            if items + marks < LIST_ITEMS:  # too few items could close, whatever they hold
                continue
            if items + _closed_items(written[-1] + part, final=quote is not None) >= LIST_ITEMS:
                lost.append(index)
        return lost

    def _ends_lost(self, text: str) -> bool:
        """Whether ending the sentence after ``text`` would lose: a list, or a word still missing from a
        short text that has not ended yet (``hold_ending``: after its full stop, holding off the end
        would only add a closing quote or bracket)."""
        held = len(_WORD.findall(text)) < self.hold_ending and not _ENDED.search(text) and bool(self.missing(text))
        return (self.no_lists and self._listed(text, final=True)) or held

    def score(self, text: str, *, final: bool) -> float:
        if (self.no_lists and self._listed(text, final=final)) or self._talks_off_topic(text):
            return 0.0
        covered, excess = len(self.covered(text)), self.excess(text)
        if self.mode == "hard":
            return float(covered == len(self.words) and excess == 0)
        return max(0.0, covered - excess) / len(self.words)
