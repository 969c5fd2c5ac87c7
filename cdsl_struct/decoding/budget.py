"""Closing an answer before ``max_tokens`` cuts it: a valid answer at any budget that allows one.

Near the end of its budget a row asks ``BudgetCloser.plan`` for the shortest way to a complete
output it can find from its constraint state (``shortest_completion``: a depth-first search that
tries the tokens that close things first — end a string, close an object or array, the smallest
value — taking the tokens the constraint forces as they come, and rolls the state back to where it
was). While the model's own tokens leave room for that completion it decodes freely, one token a
step (no speculation this close to the end: a step must not outrun the check). Once the room left
is within ``margin`` of the completion, the row's next tokens are the completion, proposed as
forced tokens whose masks allow nothing else (``closing_proposal``), then EOS where it fits: one
step writes them all. The output is valid; its ``finish_reason`` stays ``length`` and
``Result.closed_by_budget`` says it was closed early (a string may be short, optional members
missing). Where no completion fits, the row is cut at ``max_tokens`` as without a closer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..constraints.mask import allocate_bitmask, set_bit
from ..errors import InvalidToken

if TYPE_CHECKING:
    from ..constraints import ConstraintState, TokenVocabulary
    from .loop import Proposal, Session

#: a row is first looked at when this many tokens are left (its searches cost engine time)
MAX_WINDOW = 128
#: a row is searched again, one token a step, once the room left is within this of its last
#: ending (more than a speculative step's tokens: a step must not jump past the point to close)
SLACK = 8
_BRACKETS = set("}]")
_SMALL_VALUES = {"0", "1", '""', "[]", "{}", "false", "true", "null", "[", "{"}
_JOINERS = set(",: ")


def closing_ranks(vocabulary: TokenVocabulary, size: int) -> np.ndarray:
    """Per token id (``size`` of them: a mask's width), its order as a closing step, lower first:
    ``""`` (the empty string, allowed only where a value starts), ``"`` (it ends a string), tokens
    only of ``}`` and ``]`` (the longer the earlier: each closes more), ``,`` and ``:``, the
    smallest values, then the rest by length; whitespace and ids past the vocabulary last. (A
    token such as ``"]`` is not a closer: at a value it opens a string.)
    Made once per vocabulary."""
    def build(vocab: TokenVocabulary) -> np.ndarray:
        ranks = np.full(max(size, vocab.size), 1e6)
        for token, raw in enumerate(vocab.token_bytes):
            text = raw.decode("utf-8", errors="replace")
            if token in vocab.special_ids:
                continue
            if text == '""':  # allowed only where a value starts: the whole shortest string
                ranks[token] = -1.0
            elif text == '"':  # inside a string the one closer, at a value the start of the shortest string
                ranks[token] = 0.0
            elif text and set(text) <= _BRACKETS:
                ranks[token] = 1.0 - len(text) / 100
            elif text and set(text) <= _JOINERS:  # before values: inside a number a comma ends it
                ranks[token] = 1.5 + len(text) / 100
            elif text in _SMALL_VALUES:
                ranks[token] = 2.0 + len(text) / 100
            elif text.strip():
                ranks[token] = 4.0 + len(text)
        return ranks

    return vocabulary.engine_object("closing_ranks", build)[:size]


def shortest_completion(state: ConstraintState, limit: int, ranks: np.ndarray, branch: int = 4,
                        nodes: int = 96, improve: bool = False) -> list[int] | None:
    """Tokens (at most ``limit``, EOS not counted) that bring ``state`` to a complete output,
    searched depth first in ``ranks`` order (``branch`` tokens a position, ``nodes`` tries in all);
    None where none was found. ``improve``: after the first ending, spend what is left of ``nodes``
    on shorter ones (branch and bound). ``state`` ends where it started."""
    mask = allocate_bitmask(len(ranks))
    eos = np.array(state.vocabulary.eos_token_ids)
    spent = 0

    def search(room: int) -> list[int] | None:
        nonlocal spent
        if state.is_complete():
            return []
        if room <= 0 or spent >= nodes:
            return None
        forced = state.forced_tokens(limit=room)
        if forced:
            state.advance(forced)
            try:
                rest = search(room - len(forced))
            finally:
                state.rollback(len(forced))
            return None if rest is None else forced + rest
        best: list[int] | None = None
        for token in _candidates(state, mask, ranks, eos, branch):
            bound = room if best is None else min(room, len(best) - 1)  # only a shorter ending is better
            if bound <= 0 or spent >= nodes:
                break
            spent += 1
            try:
                state.advance(token)
            except InvalidToken:  # a mask may allow a token its matcher refuses (an unspellable byte)
                continue
            try:
                rest = search(bound - 1)
            finally:
                state.rollback(1)
            if rest is not None and (best is None or len(rest) + 1 < len(best)):
                best = [token, *rest]
                if not improve:
                    break
        return best

    return search(limit)


def _candidates(state: ConstraintState, mask: Any, ranks: np.ndarray, eos: np.ndarray, branch: int) -> list[int]:
    """The ``branch`` allowed tokens (EOS aside) that rank first as closing steps, in order."""
    mask.zero_()
    state.fill_mask(mask)
    allowed = np.flatnonzero(np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:len(ranks)])
    allowed = allowed[~np.isin(allowed, eos)]
    order = ranks[allowed]
    if allowed.size > branch:
        best = np.argpartition(order, branch)[:branch]
        allowed, order = allowed[best], order[best]
    return allowed[np.argsort(order, kind="stable")].tolist()


@dataclass
class BudgetCloser:
    """A row's budget watch (``Request.on_budget="close"``). It looks first when the room left is
    within ``MAX_WINDOW`` (the shortest ending from there is its ``estimate``), then searches
    again only while the room left is within ``SLACK`` of the last ending found: there the row
    decodes one token a step (a longer step could jump past the point to close), elsewhere as
    usual. ``margin``: the room beyond the ending the model keeps before the closer writes it.
    The searches run on the engine's thread: a few per row, near its end."""

    margin: int = 1
    engaged: bool = False
    """Whether it closed the answer (``Result.closed_by_budget``)."""
    estimate: int | None = None
    """The length of the last ending found (None: none yet)."""
    next_look: int = MAX_WINDOW
    """While no ending is known: the room left at which to look again."""

    def watching(self, session: Session) -> bool:
        """Whether the row is near enough the end of its budget to decode one token a step."""
        room = session.max_tokens - len(session.output)
        if self.engaged:
            return False
        if self.estimate is None:
            if room > self.next_look:
                return False
            found = shortest_completion(session.state, room, _ranks(session))
            if found is None:  # nothing fits from here yet: a written part may make it shorter
                self.next_look = room - SLACK
                return False
            self.estimate = len(found)
        return room <= self.estimate + self.margin + SLACK

    def plan(self, session: Session) -> list[int] | None:
        """The ending to write now, or None while the model may go on (or nothing fits)."""
        room = session.max_tokens - len(session.output)
        if session.state.finished:
            return None
        ranks = _ranks(session)
        completion = shortest_completion(session.state, room, ranks)
        self.estimate = None if completion is None else len(completion)
        if completion is None:
            self.next_look = room - SLACK
            return None
        if len(completion) + self.margin < room:
            return None
        # about to close: look for a shorter ending first (the first one found is often not), so
        # the model keeps writing while one fits
        completion = shortest_completion(session.state, room, ranks, nodes=256, improve=True) or completion
        self.estimate = len(completion)
        if len(completion) + self.margin < room:
            return None
        self.engaged = True
        return completion


def _ranks(session: Session) -> np.ndarray:
    return closing_ranks(session.compiled.vocabulary, session.compiled.vocab_size)


def closing_proposal(session: Session, completion: list[int], proposal: Proposal) -> None:
    """Fill ``proposal`` with ``completion`` then EOS where room is left, each position's mask
    allowing only its token (the last one is the target's own choice, the rest forced)."""
    vocab_size = session.compiled.vocab_size
    room = session.max_tokens - len(session.output)
    tokens = list(completion)
    if len(tokens) < room:
        tokens.append(session.compiled.vocabulary.eos_token_ids[0])
    for token in tokens[:-1]:
        proposal.masks.append(_only(token, vocab_size))
        if not session.speculate(proposal, token, None):
            return
        proposal.forced += 1
        session.stats.forced += 1
    proposal.masks.append(_only(tokens[-1], vocab_size))
    proposal.closing = True


def _only(token: int, vocab_size: int) -> Any:
    mask = allocate_bitmask(vocab_size)
    set_bit(mask, token)
    return mask
