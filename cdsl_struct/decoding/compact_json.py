"""Compact JSON for an answer near its budget: no whitespace outside strings.

Whitespace between JSON tokens is free to leave out and costs tokens (``{ "a": 1 }`` is 6 of
SmolLM2's tokens, ``{"a":1}`` 4). A row whose budget closer is watching (``decoding.budget``)
therefore writes compact JSON from there on: its mask loses the tokens that would put whitespace
outside a string (``whitespace_keep``), and the ending the closer writes is re-spelled compactly
(``strip_outside_strings``). Where a string starts and ends is read from the bytes written so far
by a three-state lexer (outside a string, inside one, just after a backslash inside one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from ..constraints import TokenVocabulary

OUTSIDE, INSIDE, ESCAPED = 0, 1, 2
_WHITESPACE = frozenset(b" \t\n\r")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def lex(data: bytes, state: int = OUTSIDE) -> int:
    """The lexer state after ``data`` from ``state``."""
    for byte in data:
        state = _step(state, byte)
    return state


def _step(state: int, byte: int) -> int:
    if state == ESCAPED:
        return INSIDE
    if state == INSIDE:
        return OUTSIDE if byte == _QUOTE else ESCAPED if byte == _BACKSLASH else INSIDE
    return INSIDE if byte == _QUOTE else OUTSIDE


def strip_outside_strings(data: bytes, state: int = OUTSIDE) -> bytes:
    """``data`` without its whitespace outside strings, read from lexer state ``state``."""
    kept = bytearray()
    for byte in data:
        if not (state == OUTSIDE and byte in _WHITESPACE):
            kept.append(byte)
        state = _step(state, byte)
    return bytes(kept)


def whitespace_keep(vocabulary: TokenVocabulary, size: int) -> dict[int, torch.Tensor]:
    """Per lexer state, a packed mask (``size`` tokens wide) of the tokens that put no whitespace
    outside a string when written from that state (special tokens kept: the constraint's mask
    decides those). Made once per vocabulary and width."""
    def build(vocab: TokenVocabulary) -> dict[int, torch.Tensor]:
        import torch

        words = -(-size // 32)
        keep = {}
        for state in (OUTSIDE, INSIDE, ESCAPED):
            bits = np.ones(words * 32, dtype=np.uint8)
            for token, raw in enumerate(vocab.token_bytes[:size]):
                if token not in vocab.special_ids and _puts_whitespace_outside(raw, state):
                    bits[token] = 0
            keep[state] = torch.from_numpy(np.packbits(bits, bitorder="little").view(np.int32).copy())
        return keep

    return vocabulary.engine_object(f"compact_json_keep/{size}", build)


def _puts_whitespace_outside(raw: bytes, state: int) -> bool:
    for byte in raw:
        if state == OUTSIDE and byte in _WHITESPACE:
            return True
        state = _step(state, byte)
    return False


def quote_merges(vocabulary: TokenVocabulary) -> dict[int, int]:
    """Structural tokens that end in ``{``, ``,`` or ``:`` (``{``, ``",``, ``":``), each with the
    token that is it and a ``"`` (``{"``, ``","``, ``":"``), where the vocabulary has one. Made once
    per vocabulary."""
    def build(vocab: TokenVocabulary) -> dict[int, int]:
        ids = {raw: token for token, raw in enumerate(vocab.token_bytes) if token not in vocab.special_ids}
        return {token: ids[raw + b'"'] for raw, token in ids.items()
                if raw and raw[-1:] in (b"{", b",", b":") and set(raw) <= _STRUCTURAL and raw + b'"' in ids}

    return vocabulary.engine_object("compact_json_quote_merges", build)


def starts_with_quote(vocabulary: TokenVocabulary) -> np.ndarray:
    """Per token id, whether its bytes start with ``"``. Made once per vocabulary."""
    return vocabulary.engine_object("compact_json_quote_starts", lambda vocab: np.array(
        [raw[:1] == b'"' for raw in vocab.token_bytes], dtype=bool))


_STRUCTURAL = frozenset(b'{}[],:"')
