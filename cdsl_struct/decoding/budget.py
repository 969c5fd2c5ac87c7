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

if TYPE_CHECKING:
    from ..constraints import ConstraintState, TokenVocabulary
    from .loop import Proposal, Session

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
                        nodes: int = 256, improve: bool = False) -> list[int] | None:
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
            state.advance(token)
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
    """A row's budget watch (``Request.on_budget="close"``). ``window``: how many tokens before
    ``max_tokens`` it starts looking; ``margin``: how much room beyond the completion it leaves
    the model before closing (a token of the model's can lengthen the completion)."""

    window: int = 32
    margin: int = 1
    engaged: bool = False
    """Whether it closed the answer (``Result.closed_by_budget``)."""
    sized: bool = False

    def watching(self, session: Session) -> bool:
        """Whether the row is near enough the end of its budget to decode one token a step. The
        first call sizes the window to the constraint: half again the shortest whole answer (a
        half-written one can need more to close), so a schema whose smallest answer is long is
        watched early enough."""
        if not self.sized:
            self.sized = True
            ranks = closing_ranks(session.compiled.vocabulary, session.compiled.vocab_size)
            whole = shortest_completion(session.state, session.max_tokens, ranks, improve=True)
            if whole is not None:
                self.window = max(self.window, 3 * len(whole) // 2 + 2 * self.margin)
        return not self.engaged and session.max_tokens - len(session.output) <= self.window

    def plan(self, session: Session) -> list[int] | None:
        """The completion to write now, or None while the model may go on (or nothing fits)."""
        room = session.max_tokens - len(session.output)
        if room > self.window or session.state.finished:
            return None
        ranks = closing_ranks(session.compiled.vocabulary, session.compiled.vocab_size)
        completion = shortest_completion(session.state, room, ranks)
        if completion is None or len(completion) + self.margin < room:
            return None
        # about to close: look for a shorter ending first (the first one found is often not), so
        # the model keeps writing while one fits
        completion = shortest_completion(session.state, room, ranks, improve=True) or completion
        if len(completion) + self.margin < room:
            return None
        self.engaged = True
        return completion


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
