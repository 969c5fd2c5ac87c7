"""The string guard: a JSON string value the model meant to end is ended.

A small model writing JSON often drops a string value's closing quote and goes straight to what
follows it. After ``"city": "London`` SmolLM2-135M gives `` }`` 0.73 and ``"`` 0.02: inside a string
`` }`` is text, so the constraint allows it, and the value swallows the rest of the answer
(``"London } Ada Lovelace was a British mathematician who ...`` up to ``max_tokens``). Asked for a
record without being told to answer in JSON ("... Extract the person."), about a quarter of the
person records of the extraction families went so (BENCHMARKS.md, "the string guard").

Where a JSON string value is open (not an object's key), none of its own brackets is open (``"{name}"``
and ``"[1]"`` keep theirs), and the constraint allows its closing quote there, the guard moves the
probability of every allowed token that opens with a closing bracket, after any whitespace, onto the
quote: the quote's logit becomes the log of the sum of their exponentials, theirs ``-inf``. The value
ends, and the model writes its bracket next. Where a string may open, a token that opens one with a
closing bracket (``"]``, ``"},``: after ``["a", "a", "a", `` the loop guard stops a fourth ``"a"`` and
SmolLM2 writes ``"] }}``, meaning to end the array) moves onto the quote alone, so the string it opens
ends before the bracket. Only the balance between tokens the constraint allows
changes, so no constraint is loosened, and the move is a function of the text before a position:
target-only and speculative decoding choose the same tokens under it.

Tool calls are guarded too: their arguments are JSON inside the call format (``tools.formats``),
and a small model leaves a string argument open the same way, or writes the call's closing marker
into it (``"subject": "Hi,</tool_call>x.com"``: SmolLM2 learned hermes's ``</tool_call>``). There,
tokens that open with ``</`` move onto the quote as well, in a string that holds no ``<`` of its own.
So are a structural tag's JSON contents (``<city>{"name": "Paris</city>``).

A number is ended too: past ``MAX_NUMBER_DIGITS`` digits, every token that would go on with it (a
digit, ``.``, ``e``, a sign) is kept off where the constraint allows anything else. Asked about Paris as
JSON, SmolLM2 wrote ``"population": 1111111100000000111111110111...`` to ``max_tokens`` (the schema
bounds no integer), and the OpenAI client's ``parse`` raised on the budget's ``length``.

An array of strings that loops ends too: once ``REPEATED_ITEMS`` of its items repeat earlier ones (case,
spaces and end punctuation aside), the probability of the tokens that would go on to another item (a
comma, or a closing quote fused with one, ``",``) moves onto its closing bracket (or the plain quote).
In a calendar call SmolLM2 listed ``"attendees": ["El Diablo", "El Diablo", ...`` to ``max_tokens``. So
does an array of objects (compared as their bytes lower-cased, whitespace outside strings aside): a closing
brace fused with a comma (``},``) moves onto the plain brace, and the comma after it onto the bracket. Asked
for the planets, SmolLM2 went on ``{"name": "Uranus", ...}, {"name": "Neptune", ...}, {"name": "Pluto", ...}``
round and round.

A string value that goes round ends: once a run of its words repeats an earlier one (``value_words``),
all the probability where a sentence or clause of it ends moves onto the tokens that open with its closing
quote (``"``, ``",``), in proportion to their own.

``JsonScan`` follows a JSON text byte by byte (an answer that is JSON from its first byte, no reasoning
before it), ``MarkedScan`` the JSON inside a tool request's output; ``string_moves`` finds a step's
positions to move; ``move_to_quote`` moves them, after the masks, in a few ops over all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..constraints.specs import JsonSchema
from ..constraints.structural_tag import StructuralTag
from ..constraints.vocabulary import TokenVocabulary
from ..tools.grammar import ToolCallsGrammar
from .string_tokens import NUMBER_BYTES, StringTokens, string_tokens
from .value_words import ValueWords

_QUOTE, _BACKSLASH, _COLON, _COMMA, _ANGLE = b'"'[0], b"\\"[0], b":"[0], b","[0], b"<"[0]
_OPENING, _CLOSING = frozenset(b"{["), frozenset(b"}]")
_OBJECT = b"{"[0]
_SPACE = frozenset(b" \t\r\n")
_STARTS = frozenset(b'{["')
_DIGITS, _NUMBER_STARTS = frozenset(b"0123456789"), frozenset(b"-0123456789")
REPEATED_ITEMS = 2
"""The items of an array of strings or objects that may repeat earlier ones before the guard ends it."""
MAX_NUMBER_DIGITS = 18
"""The digits a JSON number may have before the guard ends it: every integer of 18 digits fits in 64
bits, and a longer number from a small model is a run of digits rather than a value."""


@dataclass
class JsonScan:
    """Where a JSON text stands after the bytes fed so far: its open containers, and whether a
    string is open, is a key, and how its own brackets balance. ``fed``: output tokens scanned."""

    containers: list[int] = field(default_factory=list)
    in_string: bool = False
    key: bool = False
    escaped: bool = False
    inner: int = 0
    key_next: bool = False
    fed: int = 0
    markup: bool = False
    """The open string holds a ``<``: a ``</`` in it may close a tag of its own."""
    value_next: bool = False
    """Outside strings, the last byte that is not whitespace starts a value: ``[``, ``:``, an array's ``,``."""
    number: bool = False
    """Outside strings, a number is being written: its last byte is one of it."""
    digits: int = 0
    """The digits of the number being written (or of the last one)."""
    items: list[tuple[frozenset[bytes], int] | None] = field(default_factory=list)
    """Per open container: an array's string and object items so far (as ``_item_key`` reads a string,
    an object as its bytes lower-cased with no whitespace outside strings) and how many of them repeated
    an earlier one; None for an object."""
    item: bytes | None = None
    """The bytes of the array item being written, where a string directly in an array is open."""
    item_done: bool = False
    """Outside strings, the last byte that is not whitespace closed a string or object directly in an
    array."""
    records: list[bytes | None] = field(default_factory=list)
    """Per open container: an object directly in an array, its bytes so far (whitespace outside strings
    left out); None for any other."""
    recording: int = 0
    """How many of ``records`` are open."""
    words: ValueWords | None = None
    """The words of the open string value (not a key): whether it went round (``value_words``)."""
    marked = False
    """Whether this scan reads JSON after markers (``MarkedScan``: tool calls, structural tags)."""

    def feed(self, data: bytes) -> None:
        """Follow ``data``, the next bytes of the text."""
        for byte in data:
            if self.recording and (self.in_string or byte not in _SPACE):
                self._record(byte)
            if self.in_string:
                if self.words is not None:
                    self.words.feed(byte, self.escaped)
                if self.escaped:
                    self.escaped = False
                elif byte == _BACKSLASH:
                    self.escaped = True
                elif byte == _QUOTE:
                    self.in_string, self.words = False, None
                    if self.item is not None:
                        self._item_closed()
                    continue
                elif byte in _OPENING:
                    self.inner += 1
                elif byte in _CLOSING:
                    self.inner -= 1
                elif byte == _ANGLE:
                    self.markup = True
                if self.item is not None:
                    self.item += bytes((byte,))
            elif byte in _SPACE:
                self.number = False
            else:
                self._structure(byte)

    def _structure(self, byte: int) -> None:
        """Follow one byte outside strings that is not whitespace."""
        if byte in NUMBER_BYTES and (self.number or byte in _NUMBER_STARTS):
            if not self.number:
                self.number, self.digits = True, 0
            self.digits += byte in _DIGITS
            self.value_next = False
            return
        self.number = self.value_next = self.item_done = False
        if byte == _QUOTE:
            self.in_string, self.inner, self.markup = True, 0, False
            self.key = self.key_next and bool(self.containers) and self.containers[-1] == _OBJECT
            self.item = b"" if self.items and self.items[-1] is not None else None
            self.words = None if self.key else ValueWords()
        elif byte in _OPENING:
            in_array = bool(self.items) and self.items[-1] is not None
            self.containers.append(byte)
            self.items.append(None if byte == _OBJECT else (frozenset(), 0))
            self.records.append(b"{" if byte == _OBJECT and in_array else None)
            self.recording += self.records[-1] is not None
            self.key_next = byte == _OBJECT
            self.value_next = not self.key_next
        elif byte in _CLOSING:
            if self.containers:
                self.containers.pop()
                self.items.pop()
                record = self.records.pop()
                if record is not None:
                    self.recording -= 1
                    if self.items and self.items[-1] is not None:
                        self._count_item(record.lower())
            self.key_next = False
        elif byte == _COLON:
            self.key_next, self.value_next = False, True
        elif byte == _COMMA:
            self.key_next = bool(self.containers) and self.containers[-1] == _OBJECT
            self.value_next = not self.key_next

    def _item_closed(self) -> None:
        self._count_item(_item_key(self.item))
        self.item = None

    def _count_item(self, key: bytes) -> None:
        """An item of the innermost array closed as ``key``."""
        seen, repeated = self.items[-1]
        self.items[-1] = (seen | {key}, repeated + (key in seen))
        self.item_done = True

    def _record(self, byte: int) -> None:
        """Add ``byte`` to every open object item (``records``): an outer one holds the inner ones' bytes."""
        one = bytes((byte,))
        for at, record in enumerate(self.records):
            if record is not None:
                self.records[at] = record + one

    @property
    def looping(self) -> bool:
        """Whether the innermost array's string or object items repeat earlier ones (``REPEATED_ITEMS``)."""
        return bool(self.items) and self.items[-1] is not None and self.items[-1][1] >= REPEATED_ITEMS

    @property
    def item_looping(self) -> bool:
        """Whether an item of a string array is open that, closed here, leaves the array ``looping``: a
        closing quote fused with the comma (``", "``) would start the next item before the array is seen
        to loop."""
        if self.item is None or not self.items or self.items[-1] is None:
            return False
        seen, repeated = self.items[-1]
        return repeated + (_item_key(self.item) in seen) >= REPEATED_ITEMS

    @property
    def record_looping(self) -> bool:
        """Whether an object item of an array is open at its own level, outside strings, that, closed here,
        leaves the array ``looping`` (``item_looping`` for an object: ``},`` would start the next item)."""
        if self.in_string or not self.records or self.records[-1] is None:
            return False
        return self._record_repeats(b"}")

    @property
    def record_string_looping(self) -> bool:
        """Whether a string value of such an object is open that, closed with the object here, leaves the array
        ``looping``: ``"},`` would start the next item."""
        if not self.in_string or self.key or not self.records or self.records[-1] is None:
            return False
        return self._record_repeats(b'"}')

    def _record_repeats(self, closing: bytes) -> bool:
        seen, repeated = self.items[-2]
        return repeated + ((self.records[-1] + closing).lower() in seen) >= REPEATED_ITEMS

    @property
    def value_open(self) -> bool:
        """Whether a string value is open with no bracket of its own left open: where a closing bracket
        would end it rather than close one of its own (a string that already holds more closing brackets
        than opening ones swallowed one)."""
        return self.in_string and not self.key and self.inner <= 0

    @property
    def value_may_start(self) -> bool:
        """Whether a value (a string among them) may start here: after ``[``, ``:`` or an array's ``,``."""
        return not self.in_string and self.value_next

    @property
    def number_long(self) -> bool:
        """Whether a number with ``MAX_NUMBER_DIGITS`` digits or more is being written."""
        return self.number and self.digits >= MAX_NUMBER_DIGITS

    @property
    def value_looped(self) -> bool:
        """Whether an open string value went round (``ValueWords.looped``) and a sentence or clause of it
        just ended: where it ends."""
        return self.value_open and self.words is not None and self.words.looped and self.words.boundary

    @property
    def tag_open(self) -> bool:
        """Whether a string value after a marker is open (``value_open``) with no ``<`` of its own: where a
        ``</`` would end the call or tag rather than close a tag the string opened."""
        return self.marked and self.value_open and not self.markup

    def copy(self) -> JsonScan:
        return dataclasses.replace(self, containers=list(self.containers), items=list(self.items),
                                   records=list(self.records),
                                   words=None if self.words is None else self.words.copy())


def _item_key(raw: bytes) -> bytes:
    """An array item as compared with the others: case, spaces and end punctuation aside ("Denzel!",
    " denzel")."""
    return raw.decode("utf-8", errors="replace").casefold().strip(" .,!?;:").encode()


@dataclass
class MarkedScan(JsonScan):
    """``JsonScan`` over an output whose JSON follows markers in free text: a tool request's calls
    (``tools.grammar``: after the format's trigger, or from the trigger itself where a call's JSON starts
    with it, llama3's ``{"name": "``; an answer format's JSON from the start, ``armed``) and a structural
    tag's JSON contents (after a JSON tag's begin; ``rearm`` off: free text follows each). The text and
    the markers around the JSON are not read as JSON."""

    triggers: tuple[bytes, ...] = ()
    json_trigger: bool = False
    """A trigger is the first bytes of the JSON."""
    armed: bool = False
    """The next ``{``, ``[`` or ``"`` outside JSON starts a JSON value: after a trigger, or from the start
    with an answer format."""
    rearm: bool = True
    """Armed again after each JSON value (a call's format goes on to the next call)."""
    outside: bool = True
    seen: bytes = b""
    """Outside JSON and not armed: the last bytes, where the triggers are looked for."""
    marked = True

    def feed(self, data: bytes) -> None:
        for at in range(len(data)):
            byte = data[at:at + 1]
            if not self.outside:
                super().feed(byte)
                if not self.containers and not self.in_string:
                    self.outside, self.armed = True, self.rearm
            elif self.armed and byte[0] in _STARTS:
                self.outside = False
                super().feed(byte)
            elif not self.armed:
                self.seen = (self.seen + byte)[-max(map(len, self.triggers), default=1):]
                trigger = next((t for t in self.triggers if self.seen.endswith(t)), None)
                if trigger is not None:
                    self.armed, self.seen = True, b""
                    if self.json_trigger:
                        self.outside = False
                        super().feed(trigger)


@dataclass
class StringMoves:
    """A step's positions where a string value is open (``rows``), of those where a ``</`` would end a
    call's argument (``tag_rows``), where a string may open (``start_rows``), where a number has run
    past ``MAX_NUMBER_DIGITS`` (``number_rows``), where an array of strings or objects loops (``item_rows``,
    ``array_rows``, ``object_rows``, ``object_string_rows``), and where a string value that went round ends
    (``ended_rows``)."""

    rows: list[int] = field(default_factory=list)
    tag_rows: list[int] = field(default_factory=list)
    start_rows: list[int] = field(default_factory=list)
    number_rows: list[int] = field(default_factory=list)
    item_rows: list[int] = field(default_factory=list)
    """An item of an array whose items repeat (``JsonScan.looping``) is open: it closes without a comma."""
    array_rows: list[int] = field(default_factory=list)
    """After an item of such an array: the array closes."""
    object_rows: list[int] = field(default_factory=list)
    """An object item of such an array is open at its own level (``JsonScan.record_looping``): it closes
    without a comma."""
    object_string_rows: list[int] = field(default_factory=list)
    """A string value of such an object is open (``JsonScan.record_string_looping``): ``"},`` becomes ``"}``."""
    ended_rows: list[int] = field(default_factory=list)
    """A string value that went round has just ended a sentence or clause (``JsonScan.value_looped``): it
    ends."""

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in _MOVED)

    def __iadd__(self, other: StringMoves) -> StringMoves:
        for name in _ALL_ROWS:
            getattr(self, name).extend(getattr(other, name))
        return self


_ALL_ROWS = ("rows", "tag_rows", "start_rows", "number_rows", "item_rows", "array_rows", "object_rows",
             "object_string_rows", "ended_rows")
_MOVED = _ALL_ROWS[:1] + _ALL_ROWS[2:]  # tag_rows are among rows


def guarded(session: Any) -> bool:
    """Whether the string guard reads ``session``'s output (``reads_json``)."""
    return reads_json(session.compiled.spec)


def reads_json(spec: Any) -> bool:
    """Whether outputs under ``spec`` hold JSON the string guard reads: JSON from the first byte (a
    ``JsonSchema``'s answer, an output type's value: ``ConstraintSpec.writes_json``), a tool request's
    calls, or a structural tag's JSON contents (``MarkedScan``)."""
    if isinstance(spec, StructuralTag):
        return bool(_json_begins(spec))
    return getattr(spec, "writes_json", False) or isinstance(spec, ToolCallsGrammar)  # ReasoningSpec wraps one


def new_scan(spec: Any) -> JsonScan:
    """A scan of an output under ``spec`` from its first byte (``guarded`` specs)."""
    if isinstance(spec, StructuralTag):
        return MarkedScan(triggers=_json_begins(spec), rearm=False)
    if not isinstance(spec, ToolCallsGrammar):
        return JsonScan()
    fmt = spec.request.format
    return MarkedScan(triggers=(fmt.trigger.encode(),), json_trigger=fmt.trigger_in_call,
                      armed=spec.answer_format is not None and spec.request.mode != "call")


def _json_begins(spec: StructuralTag) -> tuple[bytes, ...]:
    return tuple(tag.begin.encode() for tag in spec.tags if isinstance(tag.content, JsonSchema))


def string_moves(session: Any, tokens: Sequence[int], start: int) -> StringMoves:
    """The rows of a step's logits (``start`` on: the positions after ``session.output`` and each of
    ``tokens``) where a string value is open (``JsonScan.value_open``), and where a tool call's is with
    no ``<`` in it (``JsonScan.tag_open``)."""
    vocab = session.compiled.vocabulary
    scan = session.json_scan
    if scan is None or scan.fed > len(session.output):
        scan = session.json_scan = new_scan(session.compiled.spec)
    for token in session.output[scan.fed:]:
        feed_token(scan, vocab, token)
    scan.fed = len(session.output)
    moves = StringMoves()
    walk = scan.copy() if tokens else scan
    for offset in range(len(tokens) + 1):
        add_position(moves, walk, start + offset)
        if offset < len(tokens):
            feed_token(walk, vocab, tokens[offset])
    return moves


def add_position(moves: StringMoves, scan: JsonScan, row: int) -> None:
    """Add ``row``, the position after the text ``scan`` has read, to ``moves`` where the guard acts."""
    if scan.value_open:
        moves.rows.append(row)
        if scan.tag_open:
            moves.tag_rows.append(row)
        if scan.item_looping:
            moves.item_rows.append(row)
        if scan.value_looped:
            moves.ended_rows.append(row)
        if scan.record_string_looping:
            moves.object_string_rows.append(row)
    elif scan.value_may_start:
        moves.start_rows.append(row)
    elif scan.number_long:
        moves.number_rows.append(row)
    elif scan.item_done and scan.looping:
        moves.array_rows.append(row)
    if scan.record_looping:
        moves.object_rows.append(row)


def feed_token(scan: JsonScan, vocab: TokenVocabulary, token: int) -> None:
    """A call's markers may be special tokens (Qwen's ``<tool_call>``): a ``MarkedScan`` reads their text."""
    if token not in vocab.eos_token_ids and (scan.marked or token not in vocab.special_ids):
        scan.feed(vocab.token_bytes[token])


def move_to_quote(logits: torch.Tensor | np.ndarray, moves: StringMoves, tokens: StringTokens) -> None:
    """At each of ``moves.rows`` of masked ``logits`` whose quote is allowed, move the closers'
    probability onto the quote (and the ``</`` tokens' at ``moves.tag_rows``; at ``moves.start_rows``,
    the ``opens``'); at ``moves.number_rows``, keep the number's ``digits`` off where any other token is
    allowed; at ``moves.item_rows``, move a looping array's ``quote_commas`` onto the quote, and at
    ``moves.array_rows`` its ``commas`` onto the closing bracket; at ``moves.object_rows``, an object item's
    ``brace_commas`` onto the closing brace, and at ``moves.object_string_rows`` its ``"},`` onto ``"}``; at
    ``moves.ended_rows``, every allowed token's onto those that open with the quote. In place (numpy rows
    where the logits are host memory)."""
    if moves.tag_rows and len(tokens.tags_np):
        _move(logits, moves.tag_rows, tokens.quote, tokens.tags, tokens.tags_np)
    _move(logits, moves.rows, tokens.quote, tokens.closers, tokens.closers_np)
    if moves.start_rows and len(tokens.opens_np):
        _move(logits, moves.start_rows, tokens.quote, tokens.opens, tokens.opens_np)
    if moves.number_rows and len(tokens.digits_np):
        _keep_off(logits, moves.number_rows, tokens.digits, tokens.digits_np)
    if moves.item_rows and len(tokens.quote_commas_np):
        _move(logits, moves.item_rows, tokens.quote, tokens.quote_commas, tokens.quote_commas_np)
    if moves.array_rows and tokens.bracket is not None and len(tokens.commas_np):
        _move(logits, moves.array_rows, tokens.bracket, tokens.commas, tokens.commas_np)
    if moves.object_rows and tokens.brace is not None and len(tokens.brace_commas_np):
        _move(logits, moves.object_rows, tokens.brace, tokens.brace_commas, tokens.brace_commas_np)
    if moves.object_string_rows and tokens.quote_brace is not None and len(tokens.quote_brace_commas_np):
        _move(logits, moves.object_string_rows, tokens.quote_brace, tokens.quote_brace_commas,
              tokens.quote_brace_commas_np)
    if moves.ended_rows and len(tokens.quote_starts_np):
        _end(logits, moves.ended_rows, tokens.quote_starts, tokens.quote_starts_np)


def _end(logits: torch.Tensor | np.ndarray, rows: Sequence[int], index: torch.Tensor, index_np: np.ndarray
         ) -> None:
    """At each of ``rows`` where a token of ``index`` (``StringTokens.quote_starts``) is allowed, move every
    allowed token's probability onto those, in proportion to their own (the model ends the value as it
    would have: ``",`` where it would have written that)."""
    if isinstance(logits, np.ndarray):
        for at in rows:
            row = logits[at]
            kept = row[index_np]
            if np.isfinite(kept.max()):
                shift = np.logaddexp.reduce(row) - np.logaddexp.reduce(kept)
                row[:] = -np.inf
                row[index_np] = kept + shift
        return
    at = torch.tensor(rows, dtype=torch.long).to(logits.device, non_blocking=True)
    index = index.to(logits.device, non_blocking=True)
    whole = logits[at]
    kept = whole[:, index]
    ended = torch.full_like(whole, float("-inf"))
    ended[:, index] = kept + (torch.logsumexp(whole, dim=1) - torch.logsumexp(kept, dim=1))[:, None]
    logits[at] = torch.where(torch.isfinite(kept.amax(dim=1))[:, None], ended, whole)


def _keep_off(logits: torch.Tensor | np.ndarray, rows: Sequence[int], index: torch.Tensor, index_np: np.ndarray
              ) -> None:
    """Set ``index``'s logits to -inf at each of ``rows`` where a token outside it stays allowed."""
    if isinstance(logits, np.ndarray):
        for at in rows:  # row by row on views: a fancy-indexed copy of the rows cost ~40 us a row here
            row = logits[at]
            kept = row[index_np]
            row[index_np] = -np.inf
            if not np.isfinite(row.max()):
                row[index_np] = kept
        return
    at = torch.tensor(rows, dtype=torch.long).to(logits.device, non_blocking=True)
    index = index.to(logits.device, non_blocking=True)
    kept = logits[at[:, None], index]
    logits[at[:, None], index] = float("-inf")
    others = torch.isfinite(logits[at].amax(dim=1))
    logits[at[:, None], index] = torch.where(others[:, None], float("-inf"), kept)


def _move(logits: torch.Tensor | np.ndarray, rows: Sequence[int], quote_id: int, closers_index: torch.Tensor,
          closers_np: np.ndarray) -> None:
    if not rows:
        return
    if isinstance(logits, np.ndarray):
        at = np.asarray(rows, dtype=np.int64)
        at = at[np.isfinite(logits[at, quote_id])]
        if not len(at):
            return
        closers = logits[at[:, None], closers_np]
        logits[at, quote_id] = np.logaddexp(logits[at, quote_id], np.logaddexp.reduce(closers, axis=1))
        logits[at[:, None], closers_np] = -np.inf
        return
    at = torch.tensor(rows, dtype=torch.long).to(logits.device, non_blocking=True)
    closers_index = closers_index.to(logits.device, non_blocking=True)
    quote = logits[at, quote_id]
    allowed = torch.isfinite(quote)
    closers = logits[at[:, None], closers_index]
    logits[at, quote_id] = torch.where(allowed, torch.logaddexp(quote, torch.logsumexp(closers, dim=1)), quote)
    logits[at[:, None], closers_index] = torch.where(allowed[:, None], float("-inf"), closers)


def guard_strings(session: Any, tokens: Sequence[int], masked: torch.Tensor, last_only: bool = False) -> None:
    """The string guard on a step program's masked logits, in place: ``masked`` holds the positions after
    ``session.output`` and each of ``tokens`` (``last_only``: one row, the position after all of them).
    Nothing where the session's output is not ``guarded``."""
    if not guarded(session):
        return
    tokens_of = string_tokens(session.compiled.vocabulary)
    if tokens_of is None:
        return
    moves = string_moves(session, tokens, 0)
    if last_only:
        last = len(tokens)
        moves = StringMoves(**{name: [0] if last in getattr(moves, name) else [] for name in _ALL_ROWS})
    move_to_quote(masked.view(-1, masked.shape[-1]), moves, tokens_of)
