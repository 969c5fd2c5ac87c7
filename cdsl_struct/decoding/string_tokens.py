"""The string guard's tokens of a vocabulary: the closing quote and the tokens each rule moves.

Built once per vocabulary (``TokenVocabulary.engine_object``) by ``string_tokens``; read by
``strings.move_to_quote``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..constraints.vocabulary import TokenVocabulary

NUMBER_BYTES = frozenset(b"0123456789.eE+-")
"""The bytes that go on with a JSON number."""


@dataclass(frozen=True)
class StringTokens:
    """A vocabulary's closing quote, the tokens that open with a closing bracket (``closers``) and those
    that open with ``</`` (``tags``, moved after markers only), each after any whitespace."""

    quote: int
    closers: torch.Tensor
    closers_np: np.ndarray = field(repr=False)
    tags: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    tags_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))
    opens: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    """The tokens that open a string with a closing bracket (``"]``, ``"}``, ``"},``)."""
    opens_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))
    digits: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    """The tokens that go on with a number: they open with a digit, ``.``, ``e``, ``E`` or a sign."""
    digits_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))
    bracket: int | None = None
    """The closing square bracket's own token."""
    commas: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    """The tokens that open with a comma (after any whitespace)."""
    commas_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))
    quote_commas: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    """The tokens that close a string and go on with a comma (``",``, ``", "``)."""
    quote_commas_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))
    quote_starts: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    """The tokens that open with a quote (``"``, ``",``, ``"}``): inside a string, those that end it."""
    quote_starts_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))
    brace: int | None = None
    """The closing brace's own token."""
    brace_commas: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    """The tokens that close an object and go on with a comma (``},``, `` },``)."""
    brace_commas_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))
    quote_brace: int | None = None
    """The token that closes a string and then an object, ``"}``."""
    quote_brace_commas: torch.Tensor = field(repr=False, default_factory=lambda: torch.zeros(0, dtype=torch.long))
    """The tokens that close a string and an object and go on with a comma (``"},``)."""
    quote_brace_commas_np: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))


def string_tokens(vocabulary: TokenVocabulary) -> StringTokens | None:
    """``StringTokens`` of ``vocabulary`` (built once), or None where it has no ``"`` token of its own."""

    def build(vocab: TokenVocabulary) -> StringTokens | None:
        skipped = set(vocab.special_ids) | set(vocab.eos_token_ids)
        quote = next((t for t, raw in enumerate(vocab.token_bytes) if raw == b'"' and t not in skipped), None)
        found = [t for t in _holding(vocab.token_bytes, rb"[}\]<]") if t not in skipped]
        closers = [t for t in found if vocab.token_bytes[t].lstrip(b" \t\r\n")[:1] in (b"}", b"]")]
        tags = [t for t in found if vocab.token_bytes[t].lstrip(b" \t\r\n").startswith(b"</")]
        opens = [t for t in found if _opens_with_closer(vocab.token_bytes[t])]
        digits = [t for t in _starting(vocab.token_bytes, NUMBER_BYTES) if t not in skipped]
        bracket = next((t for t, raw in enumerate(vocab.token_bytes) if raw == b"]" and t not in skipped), None)
        commas = [t for t in _holding(vocab.token_bytes, rb",") if t not in skipped]
        quote_commas = [t for t in commas if _opens_with(vocab.token_bytes[t], b'"', b",")]
        commas = [t for t in commas if vocab.token_bytes[t].lstrip(b" \t\r\n")[:1] == b","]
        quote_starts = [t for t in _starting(vocab.token_bytes, frozenset(b'"')) if t not in skipped]
        brace = next((t for t, raw in enumerate(vocab.token_bytes) if raw == b"}" and t not in skipped), None)
        brace_commas = [t for t in closers if _opens_with(vocab.token_bytes[t], b"}", b",")]
        quote_brace = next((t for t in opens if vocab.token_bytes[t] == b'"}'), None)
        quote_brace_commas = [t for t in opens if _opens_with(vocab.token_bytes[t].lstrip(b" \t\r\n")[1:], b"}", b",")]
        if quote is None or not closers:
            return None
        return StringTokens(quote, *_both(closers), *_both(tags), *_both(opens), *_both(digits), bracket,
                            *_both(commas), *_both(quote_commas), *_both(quote_starts), brace,
                            *_both(brace_commas), quote_brace, *_both(quote_brace_commas))

    return vocabulary.engine_object("string-guard", build)


def _opens_with_closer(raw: bytes) -> bool:
    """``"]``, ``"}``, `` "},``: a quote, then a closing bracket (whitespace around either)."""
    return _opens_with(raw, b'"', b"}") or _opens_with(raw, b'"', b"]")


def _opens_with(raw: bytes, first: bytes, second: bytes) -> bool:
    """Whether ``raw`` opens with ``first`` then ``second`` (whitespace around either)."""
    rest = raw.lstrip(b" \t\r\n")
    return rest[:1] == first and rest[1:].lstrip(b" \t\r\n")[:1] == second


def _starting(token_bytes: Sequence[bytes], first: frozenset[int]) -> list[int]:
    """The tokens whose first byte is one of ``first``."""
    return [t for t, raw in enumerate(token_bytes) if raw and raw[0] in first]


def _both(ids: list[int]) -> tuple[torch.Tensor, np.ndarray]:
    return torch.tensor(ids, dtype=torch.long), np.array(ids, dtype=np.int64)


def _holding(token_bytes: Sequence[bytes], pattern: bytes) -> list[int]:
    """The tokens whose bytes hold a match of ``pattern`` (one byte long), found in one pass over all of
    them joined (a loop over SmolLM2's 49,152 tokens in Python took 12 ms, on the first JSON request)."""
    ends = np.cumsum(np.fromiter(map(len, token_bytes), dtype=np.int64, count=len(token_bytes)))
    hits = [match.start() for match in re.finditer(pattern, b"".join(token_bytes))]
    return sorted(set(np.searchsorted(ends, hits, side="right").tolist()))
