"""A keyword request (``generate(keywords=...)``): the words, whether the instruction names them,
the form of the answer, the reward that steers towards them, and the report of what was covered.

Measured on held-out CommonGen concept sets (BENCHMARKS.md, "Keywords from prompts that do not
name them"): an instruction that does not name its keywords ("Write a sentence.") gives the model
nothing to steer from, and the reward alone can only insert a word where the target finds it
plausible (every word in 0.01 of the sets); named in the instruction, they appear (0.65). So by
default the words are named in the last user message where it lacks one, and the answer is one
finished sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .constraints import Regex
from .errors import InvalidArgument
from .rewards import TALK_ABOUT_WORDS, KeywordCoverage

MAX_REPEATS = 2
"""Each keyword may appear this often before repeats lower the reward (stuffing never scores)."""
HOLD_ENDING_WORDS = 20
"""``Keywords.hold_ending``: a sentence of fewer words does not end while a keyword is missing. Chosen on
CommonGen's tune split (BENCHMARKS.md): 12 words gained less coverage, no bound made a quarter of the
answers ramble to the budget."""

OPTIMISM = 0.1
"""``Keywords.optimism``: the share of a missing word's reward an unfinished sentence is credited with while
CDSL and CDLH steer (``CDLH.optimism``; the paper's 0.5 is what the CommonGen bench compares). Chosen on
CommonGen's tune split (BENCHMARKS.md): against 0.5, every word in 0.77 of the sets where the user names them
(0.65) and 0.90 where the library does (0.73), the target's loss on the other tokens 4-7% higher; 0.2 and 0.3
gained less, 0 no more."""

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_SENTENCE = rf"""(?:[A-Z"'(]|{_NUMBER})(?:[^\n.!?0-9]|{_NUMBER})*[.!?]+["')]?"""
SENTENCE = Regex(_SENTENCE)
"""One sentence on one line: it opens with a capital, a number, a quote or a parenthesis and ends
at its first ``.``, ``!`` or ``?`` that is not a number's decimal point ("3.5" stays inside;
"Mr. Smith", "e.g. this" and the "dish.add" or "ball.1.1" a small model glues would end it)."""
PARAGRAPH = Regex(f"{_SENTENCE}(?: {_SENTENCE})*")
"""Sentences separated by single spaces, on one line."""
FORMS: dict[str, Regex | None] = {"sentence": SENTENCE, "paragraph": PARAGRAPH, "text": None}
"""``Keywords.form``: the hard constraint each form puts on an answer that has no other (None: free text)."""

_INSTRUCTIONS = {
    "sentence": "Write one sentence that uses the words {words}.",
    "paragraph": "Use the words {words}.",
    "text": "Use the words {words}.",
}
"""Chosen on the tune split among five wordings (BENCHMARKS.md, "keywords from any prompt")."""


@dataclass(frozen=True)
class KeywordReport:
    """Which keywords an output holds (any inflection counts), in the order they were given."""

    covered: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """Whether every keyword appears."""
        return not self.missing

    def as_dict(self) -> dict[str, list[str]]:
        return {"covered": list(self.covered), "missing": list(self.missing)}


@dataclass(frozen=True)
class Keywords:
    """What ``generate(keywords=...)`` asks for: ``words`` in the answer (inflections count).

    ``name``: where the last user message does not already hold every word, append an
    instruction naming the words (chat prompts only; ``chat=False`` text is encoded as
    given). ``form``: the answer's shape when no other hard constraint is given: ``"sentence"``
    (one sentence, ``SENTENCE``), ``"paragraph"`` (sentences on one line) or ``"text"`` (free
    text); a ``schema``, ``regex``, ``choices``, ``grammar`` or ``tools`` replaces it.
    ``max_repeats``: occurrences of a word that still earn reward. ``no_lists``: a list of the
    words ("Dog, ride, walk.") earns nothing, nor does text about the words ("Dog, ride, walk are all
    words that ...": ``TALK_ABOUT_WORDS``), so the steering prefers sentences, and CDSL writes neither
    (``decoding.guards``); a schema's JSON is judged by its string values (a caption of "Car, gas,
    pump, station" is a list; ``KeywordCoverage.json_values``), a tool call's not at all. ``hold_ending``:
    while a word is missing from a sentence of fewer than ``HOLD_ENDING_WORDS`` words, CDSL and CDLH
    do not end it where they may write on (prose only; the budget closer still ends it in time:
    ``KeywordCoverage(hold_ending=...)``). ``optimism``: the share of a missing word's reward an unfinished
    answer is credited with while steering, in [0, 1] (``OPTIMISM``): lower writes the words in sooner and
    more often, in terser sentences; the paper's 0.5 steers more gently. ``instruction``:
    the sentence that names the words, with ``{words}`` where they go (default: the form's own,
    "Write one sentence that uses the words {words}." for a sentence).
    """

    words: tuple[str, ...]
    name: bool = True
    form: str = "sentence"
    max_repeats: int = MAX_REPEATS
    no_lists: bool = True
    instruction: str | None = None
    hold_ending: bool = True
    optimism: float = OPTIMISM

    def __post_init__(self) -> None:
        if isinstance(self.words, (str, bytes)) or not self.words or \
                not all(isinstance(w, str) and w.strip() for w in self.words):
            raise InvalidArgument("keywords must be a non-empty list of words", param="keywords")
        object.__setattr__(self, "words", tuple(w.strip() for w in self.words))
        if self.form not in FORMS:
            raise InvalidArgument(f"keyword form must be one of {', '.join(map(repr, FORMS))}, got {self.form!r}",
                                  param="keywords")
        if not isinstance(self.max_repeats, int) or self.max_repeats < 1:
            raise InvalidArgument(f"max_repeats must be an integer >= 1, got {self.max_repeats!r}", param="keywords")
        if isinstance(self.optimism, bool) or not isinstance(self.optimism, (int, float)) \
                or not 0.0 <= self.optimism <= 1.0:
            raise InvalidArgument(f"keywords' optimism must be a number in [0, 1], got {self.optimism!r}",
                                  param="keywords")
        object.__setattr__(self, "optimism", float(self.optimism))
        if self.instruction is not None and not (isinstance(self.instruction, str) and "{words}" in self.instruction):
            raise InvalidArgument("a keyword instruction must be text with {words} where the words go",
                                  param="keywords")

    @classmethod
    def of(cls, value: Any) -> Keywords | None:
        """``value`` as a request: a ``Keywords``, a list of words, or a dict of the fields
        (``{"words": [...], "name": false, "form": "text"}``, as the server takes it); None stays None."""
        if value is None or isinstance(value, Keywords):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"words", "name", "form", "max_repeats", "no_lists", "instruction", "hold_ending",
                                   "optimism"}
            if unknown:
                raise InvalidArgument(f"unknown keyword option(s): {', '.join(sorted(unknown))}", param="keywords")
            if "words" not in value:
                raise InvalidArgument("keywords needs its words", param="keywords")
            words = value["words"]
            options = {k: v for k, v in value.items() if k != "words"}
            for flag in ("name", "no_lists", "hold_ending"):
                if flag in options and not isinstance(options[flag], bool):
                    raise InvalidArgument(f"keywords' {flag} must be true or false", param="keywords")
        else:
            words, options = value, {}
        if isinstance(words, (str, bytes)) or not isinstance(words, Sequence):
            raise InvalidArgument("keywords must be a non-empty list of words", param="keywords")
        return cls(tuple(words), **options)

    def reward(self, prose: bool = True, json: bool = False) -> KeywordCoverage:
        """The coverage reward that steers CDLH and CDSL towards the words. ``no_lists`` judges
        ``prose`` as a whole, and a ``json`` answer (a schema's) by its string values
        (``KeywordCoverage.json_values``): its own commas separate values, not the words."""
        judged = self.no_lists and prose
        return KeywordCoverage(self.words, max_repeats=self.max_repeats, no_lists=judged or (self.no_lists and json),
                               json_values=json and not prose, off_topic=TALK_ABOUT_WORDS if judged else (),
                               hold_ending=HOLD_ENDING_WORDS if self.hold_ending and prose else 0)

    @property
    def constraint(self) -> Regex | None:
        """The hard constraint of the form (None: free text)."""
        return FORMS[self.form]

    def naming(self, message: str) -> str | None:
        """The sentence to append to the user's ``message`` naming the words, where it lacks one
        (None: it holds them all, or naming is off)."""
        if not self.name:
            return None
        coverage = KeywordCoverage(self.words)
        if not coverage.missing(message):
            return None
        template = self.instruction if self.instruction is not None else _INSTRUCTIONS[self.form]
        return template.replace("{words}", ", ".join(coverage.words))

    def report(self, text: str) -> KeywordReport:
        """Which words ``text`` holds."""
        coverage = KeywordCoverage(self.words)
        covered = set(coverage.covered(text))
        return KeywordReport(tuple(w for w, c in zip(self.words, coverage.words, strict=True) if c in covered),
                             tuple(w for w, c in zip(self.words, coverage.words, strict=True) if c not in covered))


def named_prompt(prompt: Any, keywords: Keywords) -> Any:
    """``prompt`` (a string or a list of messages) with the instruction naming ``keywords`` appended
    to its last user message, where it needs one; otherwise ``prompt`` as it is."""
    if isinstance(prompt, str):
        instruction = keywords.naming(prompt)
        return prompt if instruction is None else f"{prompt.rstrip()}\n\n{instruction}"
    messages = list(prompt)
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            instruction = keywords.naming(message["content"])
            if instruction is not None:
                messages[index] = {**message, "content": f"{message['content'].rstrip()}\n\n{instruction}"}
            return messages
    return prompt
