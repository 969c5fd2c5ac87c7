"""What the engine does to a step's logits before the masks and the choices, row by row: a row's
penalties, the loop guard's bans (``decoding.loops``) and the string guard's moves (``decoding.strings``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .loops import loop_bans, penalise
from .strings import StringMoves, StringTokens, guarded, string_moves, string_tokens


def adjust_logits(rows: Sequence[tuple[Any, Any, int]], spans: Sequence[tuple[int, int]],
                  logits: torch.Tensor) -> tuple[StringMoves, StringTokens] | None:
    """Apply each row's penalties and loop bans to its positions of ``logits`` (``spans``: each row's
    ``[start, end)``), in place; return the string guard's moves for after the masks (the positions,
    and the vocabulary's tokens), or None. A closing row is not loop-guarded: its mask may allow one
    token, which nothing may ban. Its string may still end: the guard only weighs the tokens a mask
    allows, and moves nothing where the quote is not one of them."""
    bans: list[tuple[int, int]] = []
    moves = StringMoves()
    tokens: StringTokens | None = None
    for (row, proposal, _), (start, end) in zip(rows, spans, strict=True):
        request, session = row.request, row.session
        if request.penalties is not None and request.penalties.active:
            request.penalties.apply(logits[start:end], session.output, proposal.tokens)
        if request.loop_guard and not proposal.closing:
            row_bans = loop_bans(session.output, proposal.tokens, end - start)
            session.stats.loop_guarded += len(row_bans)
            bans += [(start + i, token) for i, token in row_bans]
        if request.string_guard and guarded(session):
            tokens = tokens or string_tokens(session.compiled.vocabulary)
            if tokens is not None:
                moves += string_moves(session, proposal.tokens, start)
    penalise(logits, bans)
    return (moves, tokens) if moves and tokens is not None else None
