"""``RewardGuard``: keeps CDSL's next token (and the ``Generator``'s CDLH candidates) off what the
reward counts against the text.

Two kinds of token are kept off, each where the reward says so:

- the first token of a spent word (``Reward.spent``): a keyword already written as often as it may
  be, repeated in a list the target keeps going ("a game, a kid, a rock, a game"), or a word the
  text earns nothing with at all ("... are all words that ...": ``KeywordCoverage.off_topic``);
- a token after which the text has lost the reward for good, or ends where its final score is
  lost (``Reward.losing``): the comma that makes "Bartender, bottle, drink" a list of the words,
  or the full stop that ends "Car, drive, pedestrian" as one. A reward judged on endings sees
  neither until a lookahead ends, and by then the target has agreed with the list.

The guard only narrows what the constraint allows, never widens it, and never leaves a position
with no token: where every allowed token is kept off, none is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..constraints.vocabulary import TokenVocabulary
from ..rewards.base import Reward
from ..rewards.keywords import is_word
from .sampling import any_allowed

if TYPE_CHECKING:
    from .loop import Session

#: opening characters after which a word starts without a space
WORD_OPENERS = "\"'([{"


class RewardGuard:
    """``guard(session, text, row)`` sets the logits of the tokens the reward counts against
    ``text`` to -inf. ``spent``: keep off spent words; ``lost``: keep off tokens that lose the
    reward (both read the reward, which may say nothing of either)."""

    def __init__(self, reward: Reward, *, spent: bool = True, lost: bool = True) -> None:
        self.reward = reward
        self.spent, self.lost = spent, lost
        self._first: dict[str, int | None] = {}

    def blocked(self, session: Session, text: str) -> list[int]:
        """The tokens kept off after ``text``."""
        blocked = self._spent_firsts(session, text) if self.spent else set()
        if self.lost and self.reward.guard_marks:
            ids, pieces = marked_tokens(session.compiled.vocabulary, self.reward.guard_marks)
            blocked.update(ids[i] for i in self.reward.losing(text, pieces))
        return sorted(blocked)

    def guard(self, session: Session, text: str, row: torch.Tensor) -> torch.Tensor:
        """``row`` (masked logits of the position after ``text``) with the tokens kept off set to
        -inf, in place, unless no allowed token would be left."""
        blocked = self.blocked(session, text)
        if not blocked:
            return row
        index = torch.tensor(blocked, device=row.device)
        saved = row[index].clone()
        row[index] = -float("inf")
        if not any_allowed(row):
            row[index] = saved
        return row

    def _spent_firsts(self, session: Session, text: str) -> set[int]:
        """The first tokens of the spent words after ``text``, less those that also start a word the
        reward still suggests. A keyword of several tokens is stopped where it starts, so it cannot
        slip through as a harmless-looking first piece (``" sciss"``) that only its last token makes
        a repeat."""
        spent = self.reward.spent(text)
        if not spent:
            return set()
        at_start = not text or text[-1].isspace() or text[-1] in WORD_OPENERS
        blocked = self._firsts(session, spent, at_start)
        if blocked:
            blocked -= self._firsts(session, self.reward.suggestions(text), at_start)
        return blocked

    def _firsts(self, session: Session, words: list[str], at_start: bool) -> set[int]:
        firsts = set()
        for word in words:
            spellings = [word, word.capitalize(), word.upper()]
            for spelling in [" " + s for s in spellings] + (spellings if at_start else []):
                if spelling not in self._first:
                    self._first[spelling] = _first_piece(session.compiled.vocabulary, spelling)
                if self._first[spelling] is not None:
                    firsts.add(self._first[spelling])
        return firsts


def _first_piece(vocabulary: TokenVocabulary, spelling: str) -> int | None:
    """The token that starts ``spelling``, to keep it off; None where that would keep off more than it:
    a first piece that is a word of its own or too short to tell ("A" of "Ai", "chat" of "chatbot",
    "CH" of "CHATBOT"), where the piece of a longer word is kept off (" sciss" of "scissors")."""
    tokens = vocabulary.encode(spelling)
    if len(tokens) <= 1:
        return tokens[0] if tokens else None
    piece = vocabulary.token_bytes[tokens[0]].decode("utf-8", errors="replace").strip()
    return None if len(piece) < 3 or is_word(piece) else tokens[0]


def marked_tokens(vocabulary: TokenVocabulary, marks: str) -> tuple[list[int], tuple[str | None, ...]]:
    """The ids of the tokens whose text holds one of ``marks``, and those texts; the EOS ids last,
    as None (the output ends). Built once per vocabulary and marks."""

    def build(vocab: TokenVocabulary) -> tuple[list[int], tuple[str | None, ...]]:
        ids, pieces = [], []
        for token, raw in enumerate(vocab.token_bytes):
            if token in vocab.special_ids or token in vocab.eos_token_ids:
                continue
            piece = raw.decode("utf-8", errors="replace")
            if any(mark in piece for mark in marks):
                ids.append(token)
                pieces.append(piece)
        ids += list(vocab.eos_token_ids)
        return ids, (*pieces, *[None] * len(vocab.eos_token_ids))

    return vocabulary.engine_object(f"guard-marks:{marks}", build)
