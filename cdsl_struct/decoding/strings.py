"""The string guard: a JSON string value the model meant to end is ended.

A small model writing JSON often drops a string value's closing quote and goes straight to what
follows it. After ``"city": "London`` SmolLM2-135M gives `` }`` 0.73 and ``"`` 0.02: inside a string
`` }`` is text, so the constraint allows it, and the value swallows the rest of the answer
(``"London } Ada Lovelace was a British mathematician who ...`` up to ``max_tokens``). Asked for a
record without being told to answer in JSON ("... Extract the person."), about a quarter of the
person records of the extraction families went so (BENCHMARKS.md, "the string guard").

Where a JSON string value is open (not an object's key), its own brackets are balanced (``"{name}"``
and ``"[1]"`` keep theirs), and the constraint allows its closing quote there, the guard moves the
probability of every allowed token that opens with a closing bracket, after any whitespace, onto the
quote: the quote's logit becomes the log of the sum of their exponentials, theirs ``-inf``. The value
ends, and the model writes its bracket next. Only the balance between tokens the constraint allows
changes, so no constraint is loosened, and the move is a function of the text before a position:
target-only and speculative decoding choose the same tokens under it.

``JsonScan`` follows a JSON text byte by byte (the answer of a ``JsonSchema`` request, no reasoning
before it); ``string_moves`` finds a step's positions to move; ``move_to_quote`` moves them, after
the masks, in a few ops over all of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..constraints import JsonSchema
from ..constraints.vocabulary import TokenVocabulary

_QUOTE, _BACKSLASH, _COLON, _COMMA = b'"'[0], b"\\"[0], b":"[0], b","[0]
_OPENING, _CLOSING = frozenset(b"{["), frozenset(b"}]")
_OBJECT = b"{"[0]


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

    def feed(self, data: bytes) -> None:
        """Follow ``data``, the next bytes of the text."""
        for byte in data:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif byte == _BACKSLASH:
                    self.escaped = True
                elif byte == _QUOTE:
                    self.in_string = False
                elif byte in _OPENING:
                    self.inner += 1
                elif byte in _CLOSING:
                    self.inner -= 1
            elif byte == _QUOTE:
                self.in_string, self.inner = True, 0
                self.key = self.key_next and bool(self.containers) and self.containers[-1] == _OBJECT
            elif byte in _OPENING:
                self.containers.append(byte)
                self.key_next = byte == _OBJECT
            elif byte in _CLOSING:
                if self.containers:
                    self.containers.pop()
                self.key_next = False
            elif byte == _COLON:
                self.key_next = False
            elif byte == _COMMA:
                self.key_next = bool(self.containers) and self.containers[-1] == _OBJECT

    @property
    def value_open(self) -> bool:
        """Whether a string value is open with its own brackets balanced: where a closing bracket
        would end it rather than close one of its own."""
        return self.in_string and not self.key and self.inner == 0

    def copy(self) -> JsonScan:
        return JsonScan(list(self.containers), self.in_string, self.key, self.escaped, self.inner, self.key_next,
                        self.fed)


@dataclass(frozen=True)
class StringTokens:
    """A vocabulary's closing quote and the tokens that open with a closing bracket."""

    quote: int
    closers: torch.Tensor
    closers_np: np.ndarray = field(repr=False)


def string_tokens(vocabulary: TokenVocabulary) -> StringTokens | None:
    """``StringTokens`` of ``vocabulary`` (built once), or None where it has no ``"`` token of its own."""

    def build(vocab: TokenVocabulary) -> StringTokens | None:
        skipped = set(vocab.special_ids) | set(vocab.eos_token_ids)
        quote = next((t for t, raw in enumerate(vocab.token_bytes) if raw == b'"' and t not in skipped), None)
        closers = [t for t in _holding(vocab.token_bytes, rb"[}\]]")
                   if t not in skipped and vocab.token_bytes[t].lstrip(b" \t\r\n")[:1] in (b"}", b"]")]
        if quote is None or not closers:
            return None
        return StringTokens(quote, torch.tensor(closers, dtype=torch.long), np.array(closers, dtype=np.int64))

    return vocabulary.engine_object("string-guard", build)


def _holding(token_bytes: Sequence[bytes], pattern: bytes) -> list[int]:
    """The tokens whose bytes hold a match of ``pattern`` (one byte long), found in one pass over all of
    them joined (a loop over SmolLM2's 49,152 tokens in Python took 12 ms, on the first JSON request)."""
    ends = np.cumsum(np.fromiter(map(len, token_bytes), dtype=np.int64, count=len(token_bytes)))
    hits = [match.start() for match in re.finditer(pattern, b"".join(token_bytes))]
    return sorted(set(np.searchsorted(ends, hits, side="right").tolist()))


def guarded(session: Any) -> bool:
    """Whether the string guard reads ``session``'s output: the answer of a ``JsonSchema``, JSON from
    its first byte."""
    return isinstance(session.compiled.spec, JsonSchema)


def string_moves(session: Any, tokens: Sequence[int], start: int) -> list[int]:
    """The rows of a step's logits (``start`` on: the positions after ``session.output`` and each of
    ``tokens``) where a string value is open (``JsonScan.value_open``)."""
    vocab = session.compiled.vocabulary
    scan = session.json_scan
    if scan is None or scan.fed > len(session.output):
        scan = session.json_scan = JsonScan()
    for token in session.output[scan.fed:]:
        _feed_token(scan, vocab, token)
    scan.fed = len(session.output)
    rows = []
    walk = scan.copy() if tokens else scan
    for offset in range(len(tokens) + 1):
        if walk.value_open:
            rows.append(start + offset)
        if offset < len(tokens):
            _feed_token(walk, vocab, tokens[offset])
    return rows


def _feed_token(scan: JsonScan, vocab: TokenVocabulary, token: int) -> None:
    if token not in vocab.eos_token_ids and token not in vocab.special_ids:
        scan.feed(vocab.token_bytes[token])


def move_to_quote(logits: torch.Tensor | np.ndarray, rows: Sequence[int], tokens: StringTokens) -> None:
    """At each of ``rows`` of masked ``logits`` whose quote is allowed, move the closers' probability
    onto the quote, in place (numpy rows where the logits are host memory)."""
    if not rows:
        return
    if isinstance(logits, np.ndarray):
        at = np.asarray(rows, dtype=np.int64)
        at = at[np.isfinite(logits[at, tokens.quote])]
        if not len(at):
            return
        closers = logits[at[:, None], tokens.closers_np]
        logits[at, tokens.quote] = np.logaddexp(logits[at, tokens.quote], np.logaddexp.reduce(closers, axis=1))
        logits[at[:, None], tokens.closers_np] = -np.inf
        return
    at = torch.tensor(rows, dtype=torch.long).to(logits.device, non_blocking=True)
    closers_index = tokens.closers.to(logits.device, non_blocking=True)
    quote = logits[at, tokens.quote]
    allowed = torch.isfinite(quote)
    closers = logits[at[:, None], closers_index]
    logits[at, tokens.quote] = torch.where(allowed, torch.logaddexp(quote, torch.logsumexp(closers, dim=1)), quote)
    logits[at[:, None], closers_index] = torch.where(allowed[:, None], float("-inf"), closers)


def guard_strings(session: Any, tokens: Sequence[int], masked: torch.Tensor, last_only: bool = False) -> None:
    """The string guard on a step program's masked logits, in place: ``masked`` holds the positions after
    ``session.output`` and each of ``tokens`` (``last_only``: one row, the position after all of them).
    Nothing where the session's answer is not a ``JsonSchema``'s."""
    if not guarded(session):
        return
    tokens_of = string_tokens(session.compiled.vocabulary)
    rows = string_moves(session, tokens, 0) if tokens_of is not None else []
    if last_only:
        rows = [0] if rows and rows[-1] == len(tokens) else []
    move_to_quote(masked.view(-1, masked.shape[-1]), rows, tokens_of)
