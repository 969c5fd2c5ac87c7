"""The words of an open JSON string value, and whether the value has gone round.

A small model writing a long string value (an email's body, a description) often starts it over:
``"body": "Please provide the meeting details. Please provide the meeting details. Please ...`` to
``max_tokens``, or ``"to": "john.john.john.email.john.john.john@john...``. The token loop guard stops
only a block repeated in a row, and the model slips past it with a word changed. ``ValueWords`` follows
a value's words (runs of ASCII letters and digits, and of non-ASCII bytes; case aside) and marks the
value ``looped`` once ``REPEATED_WORDS`` words in a row (``MIN_REPEAT_LETTERS`` letters at least)
repeat a run written earlier in the same value. The string guard then ends the value where a sentence
or clause of it ends (``boundary``): it has said what it had to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPEATED_WORDS = 5
"""Words in a row that, written a second time in one string value, mark it as gone round."""
MIN_REPEAT_LETTERS = 12
"""Letters and digits those words must hold (``"a b a b"`` is not a loop)."""
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") | set(range(0x80, 0x100))
_BOUNDARIES = frozenset(b".!?;,\n")
_ESCAPED_NEWLINE = b"n"[0]


@dataclass
class ValueWords:
    """The words of one string value read so far, byte by byte (``feed``)."""

    grams: set[tuple[bytes, ...]] = field(default_factory=set)
    """Every run of ``REPEATED_WORDS`` finished words in a row, lower-cased."""
    recent: tuple[bytes, ...] = ()
    """The last ``REPEATED_WORDS - 1`` finished words."""
    word: bytes = b""
    """The word being written."""
    looped: bool = False
    """A run of words repeated an earlier one of this value."""
    boundary: bool = False
    """The value's last byte ends a sentence or clause (``.``, ``!``, ``?``, ``;``, ``,``, a newline)."""

    def feed(self, byte: int, escaped: bool = False) -> None:
        """Follow the value's next byte (``escaped``: it follows a backslash)."""
        if byte in _WORD_BYTES and not escaped:
            self.word += bytes((byte | 0x20,)) if byte < 0x80 else bytes((byte,))
            self.boundary = False
            return
        if self.word:
            self._finish_word()
        self.boundary = byte == _ESCAPED_NEWLINE if escaped else byte in _BOUNDARIES

    def _finish_word(self) -> None:
        gram = (*self.recent, self.word)
        self.word = b""
        if len(gram) < REPEATED_WORDS:
            self.recent = gram
            return
        self.recent = gram[1:]
        if sum(map(len, gram)) < MIN_REPEAT_LETTERS:
            return
        if gram in self.grams:
            self.looped = True
        else:
            self.grams.add(gram)

    def copy(self) -> ValueWords:
        return ValueWords(set(self.grams), self.recent, self.word, self.looped, self.boundary)
