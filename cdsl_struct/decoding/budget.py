"""Closing an answer before ``max_tokens`` cuts it: a valid answer at any budget that allows one.

Near the end of its budget a row asks ``BudgetCloser`` for the shortest way to a complete output
it can find from its constraint state (``shortest_completion``: a depth-first search that tries
the tokens that close things first — end a string, close an object or array, the smallest value —
taking the tokens the constraint forces as they come, and a structural tag's begin as one move
where a tag must still be written, and rolls the state back to where it was),
spelled in as few tokens as the tokenizer writes it (``respell``: the search steps ``"`` then
``,`` then ``"`` where SmolLM2 writes ``","`` as one token; JSON loses its whitespace outside
strings). While the model's own tokens leave room for that ending it decodes freely, one token a
step after the tokens the constraint forces (no speculation this close to the end: a step must not
outrun the check), a JSON row without whitespace between its tokens. Once the room left is within
``margin`` of the ending, the row closes: each step allows only the tokens after which an ending
still fits, the model choosing among them (an enum's member, a number's digits; in a string,
little but its end), then EOS. The output is valid; its ``finish_reason`` stays ``length`` and
``Result.closed_by_budget`` says it was closed early (a string may be short, optional members
missing, a number small). Where no ending fits, the row is cut at ``max_tokens`` as without a
closer.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..constraints.mask import allocate_bitmask, clear_bit, is_allowed, set_bit
from ..errors import InvalidToken
from .compact_json import lex, quote_merges, starts_with_quote, strip_outside_strings, whitespace_keep

if TYPE_CHECKING:
    from ..constraints import ConstraintState, TokenVocabulary
    from .loop import Session

#: a row is first looked at when this many tokens are left (its searches cost engine time)
MAX_WINDOW = 128
#: a row is searched again, one token a step, once the room left is within this of its last
#: ending (more than a speculative step's tokens: a step must not jump past the point to close)
SLACK = 8
#: a JSON row writes compact JSON once the room left is within this of its ending (0: only while
#: closing). On the tune split of benchmarks.budget_close, 16 kept more fields at 75% of the natural
#: length (accuracy 0.45 against 0.33 at 0), but it rewrites answers that would have ended by
#: themselves within 16 tokens of their budget (compact, and the model then often writes less):
#: an answer that fits must come back as the model writes it.
COMPACT_WINDOW = 0
#: while closing, every allowed token is tried when at most this many are (an enum's members, a
#: number's digits); where more are (a string's content), the ending's next token is written
CHOICES = 64
#: the nodes of the quick search that tries one token while closing
QUICK_NODES = 24
#: a mask with at most this many nonzero 32-bit words is unpacked whole; a denser one is read in
#: closing order, a chunk of ``_FIRST_CHUNK`` tokens first
_SPARSE_WORDS = 64
_FIRST_CHUNK = 512
_BRACKETS = set("}]")
_SMALL_VALUES = {"0", "1", '""', "[]", "{}", "false", "true", "null", "[", "{"}
_JOINERS = set(",:")
_SENTENCE_ENDS = {".": -2.0, "!": -1.9, "?": -1.8}


def closing_ranks(vocabulary: TokenVocabulary, size: int, prose: bool = False) -> np.ndarray:
    """Per token id (``size`` of them: a mask's width), its order as a closing step, lower first:
    ``""`` (the empty string, allowed only where a value starts), ``"`` (it ends a string), tokens
    only of ``}`` and ``]`` (the longer the earlier: each closes more), ``,`` and ``:``, the
    smallest values, then the rest by length; whitespace (taken only where nothing else is
    allowed) and ids past the vocabulary last. (A
    token such as ``"]`` is not a closer: at a value it opens a string.) ``prose``: a sentence's
    end (``.``, ``!``, ``?``) ranks first, for text outside JSON (a sentence, where ``"`` and ``,``
    are allowed anywhere and end nothing). Made once per vocabulary."""
    def build(vocab: TokenVocabulary) -> np.ndarray:
        ranks = np.full(max(size, vocab.size), 1e6)
        for token, raw in enumerate(vocab.token_bytes):
            text = raw.decode("utf-8", errors="replace")
            if token in vocab.special_ids:
                continue
            if prose and text in _SENTENCE_ENDS:
                ranks[token] = _SENTENCE_ENDS[text]
            elif text == '""':  # allowed only where a value starts: the whole shortest string
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

    return vocabulary.engine_object("closing_ranks:prose" if prose else "closing_ranks", build)[:size]


@dataclass(frozen=True, eq=False)
class ClosingOrder:
    """The tokens of a mask ``size`` wide in ``closing_ranks`` order (ties by id, EOS left out),
    for picking the first few a mask allows without unpacking all of it. Made once per vocabulary
    and width (``closing_order``)."""

    order: np.ndarray
    """Token ids, best closing step first."""
    position: np.ndarray
    """Per token id, its index in ``order`` (-1: EOS, never a closing step)."""

    @classmethod
    def build(cls, ranks: np.ndarray, eos: Sequence[int]) -> ClosingOrder:
        order = np.argsort(ranks, kind="stable")
        order = order[~np.isin(order, list(eos))].astype(np.int64)
        position = np.full(len(ranks), -1, dtype=np.int64)
        position[order] = np.arange(len(order))
        return cls(order, position)

    @property
    def size(self) -> int:
        return len(self.position)

    def first_allowed(self, words: np.ndarray, count: int) -> list[int]:
        """The first ``count`` tokens in closing order that the bitmask ``words`` (uint32) allows.
        Where few words have a bit set (a key, a number, a literal) only those are unpacked; where
        many do (a string's content) the order is walked a chunk at a time, growing, until
        ``count`` are found: the best closers are usually in the first chunk."""
        nonzero = np.flatnonzero(words)
        if nonzero.size <= _SPARSE_WORDS:
            bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").reshape(-1, 32)
            rows, columns = np.nonzero(bits)
            allowed = nonzero[rows] * 32 + columns
            places = self.position[allowed[allowed < self.size]]
            places = np.sort(places[places >= 0])[:count]
            return self.order[places].tolist()
        found: list[int] = []
        start, chunk = 0, _FIRST_CHUNK
        while start < len(self.order) and len(found) < count:
            ids = self.order[start:start + chunk]
            hits = ids[(words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1 == 1]
            found.extend(hits[:count - len(found)].tolist())
            start, chunk = start + chunk, chunk * 4
        return found


def closing_order(vocabulary: TokenVocabulary, size: int, prose: bool = False) -> ClosingOrder:
    """``ClosingOrder`` of ``vocabulary`` for masks ``size`` wide (``prose``: see ``closing_ranks``), made once."""
    ranks = closing_ranks(vocabulary, size, prose)  # outside: the vocabulary's lock is not reentrant
    return vocabulary.engine_object(f"closing_order:{size}:{prose}",
                                    lambda vocab: ClosingOrder.build(ranks, vocab.eos_token_ids))


def shortest_completion(state: ConstraintState, limit: int, closing: ClosingOrder, branch: int = 4,
                        nodes: int = 96, improve: bool = False,
                        openers: Sequence[list[int]] = ()) -> list[int] | None:
    """Tokens (at most ``limit``, EOS not counted) that bring ``state`` to a complete output,
    searched depth first in ``closing`` order (``branch`` tokens a position, ``nodes`` tries in all),
    where the state forces none and knows none that close (``closing_tokens``: a thought's marker);
    None where none was found. ``openers``: token runs tried first, each as one move, wherever the
    state accepts the whole run (a structural tag's begin: in free text no closing token ranks
    first, and one tag must still be written). ``improve``: after the first ending, spend what is
    left of ``nodes`` on shorter ones (branch and bound). ``state`` ends where it started."""
    mask = allocate_bitmask(closing.size)
    spent = 0

    def search(room: int) -> list[int] | None:
        nonlocal spent
        if state.is_complete():
            return []
        if room <= 0 or spent >= nodes:
            return None
        forced = state.forced_tokens(limit=room) or state.closing_tokens()[:room]
        if forced:
            state.advance(forced)
            try:
                rest = search(room - len(forced))
            finally:
                state.rollback(len(forced))
            return None if rest is None else forced + rest
        best: list[int] | None = None
        for move in _moves(state, mask, closing, branch, openers):
            bound = room if best is None else min(room, len(best) - 1)  # only a shorter ending is better
            if bound < len(move) or spent >= nodes:
                if len(move) == 1:
                    break
                continue
            spent += 1
            try:
                state.advance(move)
            except InvalidToken:  # a mask may allow a token its matcher refuses (an unspellable byte)
                continue
            try:
                rest = search(bound - len(move))
            finally:
                state.rollback(len(move))
            if rest is not None and (best is None or len(rest) + len(move) < len(best)):
                best = [*move, *rest]
                if not improve:
                    break
        return best

    return search(limit)


def respell(state: ConstraintState, completion: list[int], before: bytes | None) -> list[int]:
    """``completion`` spelled in fewer tokens where the state accepts that spelling as a complete
    output: its text as the tokenizer encodes it, and for JSON (``before``: the JSON written so far,
    None for other output) also without whitespace outside strings. The search walks the
    constraint a short token at a time (``"`` then ``,`` then ``"``), where the tokenizer writes
    ``","`` as one. ``state`` ends where it started."""
    raw = state.vocabulary.decode(completion)
    spellings = [raw]
    if before is not None:
        spellings.insert(0, strip_outside_strings(raw, lex(before)))
    best = completion
    for spelling in spellings:
        try:
            tokens = state.vocabulary.encode(spelling.decode("utf-8"))
        except UnicodeDecodeError:  # the output so far ends inside a character
            continue
        same_text = state.vocabulary.decode(tokens) == spelling  # not with a prefix space added
        if len(tokens) < len(best) and same_text and _completes(state, tokens):
            best = tokens
    return best


def _completes(state: ConstraintState, tokens: list[int]) -> bool:
    advanced = 0
    try:
        for token in tokens:
            state.advance(token)
            advanced += 1
        return state.is_complete()
    except InvalidToken:
        return False
    finally:
        state.rollback(advanced)


def _moves(state: ConstraintState, mask: Any, closing: ClosingOrder, branch: int,
           openers: Sequence[list[int]]) -> Iterator[list[int]]:
    """The search's moves from ``state``: each opener the state accepts whole, then single tokens
    (``_candidates``, computed only when asked for)."""
    for opener in openers:
        if opener and state.validate(opener) == len(opener):
            yield opener[:_completing_prefix(state, opener)]
    for token in _candidates(state, mask, closing, branch):
        yield [token]


def _completing_prefix(state: ConstraintState, tokens: list[int]) -> int:
    """The length of the shortest prefix of ``tokens`` (all acceptable) after which ``state`` is
    complete, else all of them: an opener whose first token closes what is open (a fence's end is
    its next one's start) goes no further."""
    for count, token in enumerate(tokens, 1):
        state.advance(token)
        if state.is_complete():
            state.rollback(count)
            return count
    state.rollback(len(tokens))
    return len(tokens)


def _candidates(state: ConstraintState, mask: Any, closing: ClosingOrder, branch: int) -> list[int]:
    """The ``branch`` allowed tokens (EOS aside) that rank first as closing steps, in order."""
    mask.zero_()
    state.fill_mask(mask)
    return closing.first_allowed(mask.numpy().view(np.uint32), branch)


@dataclass
class BudgetCloser:
    """A row's budget watch (``Request.on_budget="close"``). It looks first when the room left is
    within ``MAX_WINDOW`` (the shortest ending from there is its ``estimate``), then searches
    again only while the room left is within ``slack`` of the last ending found: there the row
    decodes one token a step after the tokens its constraint forces (a longer step could jump past
    the point to close), and a JSON row within ``compact_window`` of its ending writes compact
    JSON (``compact_json``). Once the room left is within ``margin`` of the ending, it closes:
    each step allows only the tokens after which an ending still fits (``closing_mask``), so the
    model keeps choosing an enum's member or a number's digits while a string it is in ends. The
    searches run on the engine's thread: a few per row, near its end."""

    margin: int = 1
    slack: int = SLACK
    compact_window: int = COMPACT_WINDOW
    engaged: bool = False
    """Whether it is closing the answer."""
    compacted: bool = False
    """Whether its masks left out whitespace the constraint allows (compact JSON near the end)."""
    trimmed: bool = False
    """Whether its masks left out, before closing, a token after which no ending fit (``_fitting``)."""
    estimate: int | None = None
    """The length of the last ending found (None: none yet)."""
    next_look: int = MAX_WINDOW
    """While no ending is known: the room left at which to look again."""
    last_ending: tuple[int, list[int]] | None = None
    """The last ending found, and the output length it was found at."""
    openers: list[list[int]] | None = None
    """What the row's constraint may still require opened (``_openers``), once known."""

    def watching(self, session: Session) -> bool:
        """Whether the row is near enough the end of its budget to decode one token a step."""
        room = session.max_tokens - len(session.output)
        if self.engaged:
            return not session.state.finished
        if self.estimate is None:
            if room > self.next_look:
                return False
            found = self._ending(session, room)
            if found is None:  # nothing fits from here yet: a written part may make it shorter
                self.next_look = room - self.slack
                return False
            self.estimate = len(found)
        return room <= self.estimate + self.margin + self.slack

    def unwatched(self, session: Session) -> int:
        """How many tokens a step of a row not yet watched may propose (its target token aside)
        before the closer must look again: a run of forced tokens (a tool call's next name and
        keys) must not carry the row past the point to close."""
        room = session.max_tokens - len(session.output)
        look_at = self.next_look if self.estimate is None else self.estimate + self.margin + self.slack
        return max(0, room - look_at - 1)

    def plan(self, session: Session) -> bool:
        """Whether the row closes from this step on (checked each step while watching)."""
        if self.engaged or session.state.finished:
            return self.engaged
        room = session.max_tokens - len(session.output)
        completion = self._ending(session, room)
        self.estimate = None if completion is None else len(completion)
        if completion is None:
            self.next_look = room - self.slack
            return False
        if not completion:  # complete: EOS may end it here, but a token on may open what cannot close in time
            self.engaged = room <= self.margin + self.slack and bool(self._continuations(session, room)[1])
            return self.engaged
        if len(completion) + self.margin < room:
            return False
        # about to close: look for a shorter ending first (the first one found is often not), so
        # the model keeps writing while one fits
        completion = self._ending(session, room, improve=True) or completion
        self.estimate = len(completion)
        self.engaged = len(completion) + self.margin >= room
        return self.engaged

    def mask(self, session: Session, proposed: list[int]) -> Any:
        """The mask of the row's next token while watching, after ``proposed`` (advanced into the
        state): while closing ``closing_mask``; else the constraint's, as compact JSON for a JSON
        row within ``compact_window`` of its ending (None: the constraint's, filled later)."""
        room = session.max_tokens - len(session.output) - len(proposed)
        if not self.engaged and proposed and room <= self.margin + self.slack and session.state.is_complete():
            # forced tokens completed the output in this step (a call's close): the model's token
            # must not open what cannot close in time
            self.engaged = bool(self._continuations(session, room, proposed)[1])
        if self.engaged:
            return self.closing_mask(session, proposed, room)
        mask = self._constraint_mask(session, proposed) if self._compacting(session, proposed) else None
        return self._fitting(session, proposed, room, mask)

    def _fitting(self, session: Session, proposed: list[int], room: int, mask: Any) -> Any:
        """``mask`` (None: the constraint's) without the tokens after which no ending fits in ``room`` where
        the constraint allows at most ``CHOICES`` and another fits: one token may lengthen the shortest
        ending past the room (``, {`` after an array's item opens another object) before the row engages."""
        full = mask if mask is not None else session.current_mask()
        allowed = _allowed(full, session.compiled.vocab_size, session.compiled.vocabulary.eos_token_ids)
        if not 1 < allowed.size <= CHOICES:
            return mask
        overruns = [token for token in allowed.tolist() if not self._fits_after(session, proposed, token, room - 1)]
        if not overruns or len(overruns) == allowed.size:
            return mask
        kept = full.clone()
        for token in overruns:
            clear_bit(kept, token)
        self.trimmed = True
        return kept

    @property
    def shaped(self) -> bool:
        """Whether the budget shaped the answer: closed it, kept it from opening what could not close in
        time, or wrote it compact near the end (``Result.closed_by_budget``: content may be short)."""
        return self.engaged or self.compacted or self.trimmed

    def splits_a_quote(self, session: Session, proposed: list[int]) -> bool:
        """Whether the last of ``proposed`` (forced tokens, advanced into the state) is one that
        compact JSON writes with the ``"`` that must follow it (``{`` where ``{"`` is a token): the
        caller drops it, so the model writes both in one token."""
        if not proposed or not self._compacting(session, proposed):
            return False
        last = proposed[-1]
        if last not in quote_merges(session.compiled.vocabulary):
            return False
        session.state.rollback(1)
        try:
            mask = session.current_mask()
            return is_allowed(mask, quote_merges(session.compiled.vocabulary)[last]) and \
                self._only_a_quote_after(session, proposed[:-1], last)
        finally:
            session.state.advance(last)

    def _compacting(self, session: Session, proposed: Sequence[int]) -> bool:
        """Whether the row writes compact JSON after ``proposed``: a JSON row, closing or within
        ``compact_window`` of its ending."""
        if self.compact_window < 0 or getattr(session.compiled.spec, "kind", "") != "json_schema":
            return False
        room = session.max_tokens - len(session.output) - len(proposed)
        return self.engaged or (self.estimate is not None and room <= self.estimate + self.margin + self.compact_window)

    def closing_mask(self, session: Session, proposed: list[int], room: int) -> Any:
        """Only the tokens after which an ending still fits in ``room``: the first token of the
        shortest ending found, and where the constraint allows at most ``CHOICES`` tokens, each
        after which a quick search finds an ending that fits. EOS alone once the output is
        complete; None (the constraint's own mask: the row is cut as without a closer) where no
        ending fits."""
        state, vocab = session.state, session.compiled.vocabulary
        if state.is_complete():
            mask = _only(vocab.eos_token_ids[0], session.compiled.vocab_size)
            for token in self._continuations(session, room, proposed)[0]:
                set_bit(mask, token)
            return mask
        ending = self._rest_of_last(session, proposed, room) or self._ending(session, room, proposed=proposed)
        if ending is None:
            return None
        allowed = _allowed(self._constraint_mask(session, proposed), session.compiled.vocab_size, vocab.eos_token_ids)
        if allowed.size > CHOICES:  # a string's content (or a free value): which the model wants is unknown here
            allowed = allowed[:0]
        mask = _only(ending[0], session.compiled.vocab_size)
        for token in allowed.tolist():
            if token != ending[0] and self._fits_after(session, proposed, token, room - 1):
                set_bit(mask, token)
        return mask

    def _continuations(self, session: Session, room: int, proposed: Sequence[int] = ()) -> tuple[list[int], list[int]]:
        """From a complete output, the tokens (EOS aside) after which an ending still fits in ``room``
        and those after which none does: after a tool call, the start of another call that the
        room left cannot hold. Both empty where the constraint allows more than ``CHOICES`` tokens
        on (free text: any token keeps it complete)."""
        allowed = _allowed(self._constraint_mask(session, list(proposed)), session.compiled.vocab_size,
                           session.compiled.vocabulary.eos_token_ids)
        if allowed.size > CHOICES:
            return [], []
        fits: list[int] = []
        overruns: list[int] = []
        for token in allowed.tolist():
            (fits if self._fits_after(session, list(proposed), token, room - 1) else overruns).append(token)
        return fits, overruns

    def _fits_after(self, session: Session, proposed: list[int], token: int, room: int) -> bool:
        try:
            session.state.advance(token)
        except InvalidToken:
            return False
        try:
            if session.state.is_complete():
                return True
            found = shortest_completion(session.state, 2 * room, _closing(session), branch=2, nodes=QUICK_NODES,
                                        openers=self._openers(session))
            if found is None or len(found) <= room:
                return found is not None
            return len(respell(session.state, found, _json_written(session, [*proposed, token]))) <= room
        finally:
            session.state.rollback(1)

    def _constraint_mask(self, session: Session, proposed: list[int]) -> Any:
        """The constraint's mask; for a compact JSON row without whitespace outside strings
        (where that leaves any token: a policy that requires whitespace keeps it) and without the
        structural tokens only a ``"`` may follow where the token with it is allowed."""
        mask = session.current_mask()
        if not self._compacting(session, proposed):
            return mask
        before = _json_written(session, proposed)
        compact = mask & whitespace_keep(session.compiled.vocabulary, session.compiled.vocab_size)[lex(before)]
        if not bool(compact.any()):
            return mask
        self.compacted = self.compacted or not torch.equal(compact, mask)
        for token, merged in quote_merges(session.compiled.vocabulary).items():
            if is_allowed(compact, token) and is_allowed(compact, merged) and \
                    self._only_a_quote_after(session, proposed, token):
                clear_bit(compact, token)
        return compact

    def _only_a_quote_after(self, session: Session, proposed: list[int], token: int) -> bool:
        """Whether compact JSON can only go on with ``"`` after ``token``."""
        vocab = session.compiled.vocabulary
        try:
            session.state.advance(token)
        except InvalidToken:
            return False
        try:
            keep = whitespace_keep(vocab, session.compiled.vocab_size)[lex(_json_written(session, [*proposed, token]))]
            allowed = _allowed(session.current_mask() & keep, session.compiled.vocab_size, vocab.eos_token_ids)
            return allowed.size > 0 and bool(starts_with_quote(vocab)[allowed].all())
        finally:
            session.state.rollback(1)

    def _openers(self, session: Session) -> list[list[int]]:
        """The token runs that open what the row's constraint may still require: a structural
        tag's begins (``StructuralTag.openers``) as the tokenizer spells them; none otherwise."""
        if self.openers is None:
            texts = getattr(session.compiled.spec, "openers", tuple)()
            self.openers = [session.compiled.vocabulary.encode(text) for text in texts]
        return self.openers

    def _ending(self, session: Session, room: int, improve: bool = False,
                proposed: Sequence[int] = ()) -> list[int] | None:
        """The shortest ending found from the row's state within ``room`` tokens, respelled. A row
        that has written nothing yet takes the ending found for an earlier row of the same program
        (``_FIRST_ENDINGS``): every row of a schema starts in the same state."""
        fresh = not improve and not proposed and not session.output and session.state.num_tokens == 0
        known = _FIRST_ENDINGS.get(session.compiled.program) if fresh else None
        if known is not None and (len(known[1]) <= room if known[1] is not None else room <= known[0]):
            found = known[1]
        else:
            found = self._search(session, room, improve, proposed)
            if fresh:
                _FIRST_ENDINGS.put(session.compiled.program, (room, found))
        if found is None or len(found) > room:
            return None
        self.last_ending = (len(session.output) + len(proposed), found)
        return found

    def _search(self, session: Session, room: int, improve: bool, proposed: Sequence[int]) -> list[int] | None:
        # the search's tokens are short, so it may look past the room by as many as respelling saves
        found = shortest_completion(session.state, 2 * room, _closing(session), nodes=256 if improve else 96,
                                    improve=improve, openers=self._openers(session))
        return None if found is None else respell(session.state, found, _json_written(session, proposed))

    def _rest_of_last(self, session: Session, proposed: Sequence[int], room: int) -> list[int] | None:
        """What is left of the last ending found where the row has written only its tokens since
        (the model took the ending's next token): still an ending, and no search is needed."""
        if self.last_ending is None:
            return None
        at, ending = self.last_ending
        written = [*session.output, *proposed][at:]
        rest = ending[len(written):]
        if not rest or ending[:len(written)] != written or len(rest) > room:
            return None
        return rest


class _ProgramEndings:
    """Per engine program (weakly held), the ending found from a fresh state and the room it was
    searched in; shared by the engines of a process (a compiled constraint is)."""

    def __init__(self) -> None:
        self._endings: weakref.WeakKeyDictionary[Any, tuple[int, list[int] | None]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, program: Any) -> tuple[int, list[int] | None] | None:
        with self._lock:
            try:
                return self._endings.get(program)
            except TypeError:  # a program that cannot be weakly referenced is not remembered
                return None

    def put(self, program: Any, searched: tuple[int, list[int] | None]) -> None:
        with self._lock:
            try:
                self._endings[program] = searched
            except TypeError:
                pass


_FIRST_ENDINGS = _ProgramEndings()


def _json_written(session: Session, proposed: Sequence[int] = ()) -> bytes | None:
    """The bytes a JSON row wrote so far, ``proposed`` included (None for a row whose output is
    not JSON)."""
    if getattr(session.compiled.spec, "kind", "") != "json_schema":
        return None
    eos = session.compiled.vocabulary.eos_token_ids
    return session.compiled.vocabulary.decode([t for t in [*session.output, *proposed] if t not in eos])


def _closing(session: Session) -> ClosingOrder:
    """The closing order of the row's output: a regex's (a sentence, say) ends at a sentence's end first."""
    prose = getattr(session.compiled.spec, "kind", "") == "regex"
    return closing_order(session.compiled.vocabulary, session.compiled.vocab_size, prose)


def _allowed(mask: Any, size: int, eos: Sequence[int]) -> np.ndarray:
    allowed = np.flatnonzero(np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:size])
    return allowed[~np.isin(allowed, eos)]


def _only(token: int, vocab_size: int) -> Any:
    mask = allocate_bitmask(vocab_size)
    set_bit(mask, token)
    return mask
