"""Where a ragged step's tokens go (``StepPlan``, built by ``plan_step``): every row's new tokens
laid end to end, each token's slot and position in the ``SlotCache``, and how attention groups the
rows (the short feeds padded into one ``[rows, width]`` block, long ones on their own)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .slot_cache import SlotCache

#: queries a row may feed and still share the step's grouped attention; longer feeds (prompts)
#: attend on their own
GROUPED_QUERIES = 16
#: a step of at most this many rows attends row by row (SDPA on each row's slot): at one or two
#: rows that is cheaper than the grouped matmuls' fixed cost
SOLO_ROWS = 2
#: the multiple of positions a ``rows_alone`` step's one-token rows read their keys in
#: (``AlignedDecodes``), and so the multiple its ``SlotCache`` holds
DECODE_ALIGN = 64


@dataclass
class AlignedDecodes:
    """The rows of a ``rows_alone`` step that feed one token: they attend in one batched matmul over
    the slots ``first_slot .. first_slot + slots - 1`` (``ragged_attention.decode_rows_attention``),
    each over its keys padded with masked positions to ``length``, a multiple of ``DECODE_ALIGN``.

    So a row's result does not depend on its batch, and a row alone is one of these batches too.
    SDPA's blocks and its sums' tails follow the length it is given: a padded batch through SDPA
    did not give the bits each row gave alone (nearly every row of 200 random batches differed).
    With the scores' matmul, the softmax and the values' matmul over a multiple of 64 positions,
    the masked padding only adds exact zeros after whole vectors: every row of 150 random batches
    of 2-16 rows of 1-900 positions was bitwise the row alone, at one thread and at two (AVX-512
    EPYC, torch 2.13; ``tests/models/test_int8.py`` holds it on the int8 self-draft).
    """

    first_slot: int
    slots: int
    """How many slots are read; a slot in that range that does not decode reads position 0 only."""
    lengths: list[int]
    """Positions each read slot sees (its row's length after the step; 1 for a slot not decoding)."""
    rows: torch.Tensor
    """``[D]`` each decoding row's index among the read slots, in flat-token order."""
    tokens: torch.Tensor
    """``[D]`` its flat token."""
    contiguous: tuple[int, int] | None
    """``(first token, D)`` where the read slots all decode, in order, their tokens consecutive
    (a slice instead of the index ops), else None."""
    length: int
    """Positions read: the longest decoding row's length rounded up to ``DECODE_ALIGN``."""
    valid: int
    """Positions the decoding rows hold after the step."""
    members: list[tuple[int, int, int]] = field(default_factory=list)
    """``(slot, flat token, length after the step)`` of each decoding row, in slot order."""
    bias: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    """The additive float32 mask per ``(kv_heads, sliding window or 0)``, ``[slots * kv_heads, 1,
    length]``: made by the first layer that attends, shared by the rest."""


@dataclass
class StepPlan:
    """Where a ragged step's tokens go: their slots and positions, and how attention groups them."""

    slots: torch.Tensor
    """``[N]`` the slot of each fed token."""
    positions: torch.Tensor
    """``[N]`` its position in its row."""
    grouped_slots: torch.Tensor | None
    """``[A]`` slots of the rows that feed at most ``GROUPED_QUERIES`` tokens (None: slots ``0..A-1``)."""
    grouped_rows: int
    grouped_queries: torch.Tensor | None
    """``[A * W]`` the flat token each padded query reads (padding reads token 0; None: tokens
    ``0..A*W-1`` in order)."""
    grouped_width: int
    grouped_length: int
    """The longest grouped row after this step."""
    grouped_valid: int
    """Positions the grouped rows hold after this step (of the ``rows x capacity`` attention reads)."""
    grouped_mask: torch.Tensor | None
    """``[A, 1, W, capacity]`` True where a query attends (the cache's capacity: attention reads
    whole rows of the buffer)."""
    grouped_limit: torch.Tensor | None
    """``[A, W]`` the position each grouped query stands at (what it sees up to)."""
    grouped_real: torch.Tensor | None
    """Indices into the ``A * W`` padded queries of the real ones, in flat-token order (None: all of them)."""
    grouped_tokens: torch.Tensor | None
    """The flat tokens of the grouped rows, in order (None: all of them)."""
    long_rows: list[tuple[int, int, int, int, torch.Tensor]]
    """``(slot, first flat token, tokens, row length after the step, causal mask)`` of each row that
    attends on its own (a prompt, or every row of a step of at most ``SOLO_ROWS`` rows; in a
    ``rows_alone`` step, every row feeding more than one token)."""
    decodes: AlignedDecodes | None = None
    """A ``rows_alone`` step's rows that feed one token, or None."""
    cache_shape: tuple[int, int] = (0, 0)
    """The ``SlotCache``'s (slots, capacity) this step: what each layer's keys must have."""
    grouped_bias: dict[tuple[int, int, torch.dtype, int], torch.Tensor] = field(default_factory=dict)
    """``grouped_mask`` as the additive bias of the scores matmul (0 or the dtype's lowest), made
    by the first layer that attends and shared by the rest: ``(kv_heads, group, dtype, sliding window
    or 0)`` -> ``[A * kv_heads, group * W, capacity]``."""


def plan_step(order: Sequence[Hashable], tokens: dict[Hashable, list[int]], tails: dict[Hashable, list[int]],
              keeps: dict[Hashable, int], cache: SlotCache, device: Any,
              rows_alone: bool = False, aligned: bool = True) -> tuple[Any, ...]:
    """A ragged step's flat inputs and its ``StepPlan``, rows in slot order: ``order`` the rows by
    slot, ``tokens`` what the cache holds of each, ``tails`` what each feeds this step and ``keeps``
    how many of its last positions' logits it keeps. Sizes ``cache`` for the step first (the plan's
    mask spans its capacity). ``rows_alone``: every row attends on its own, whatever the step's size
    (with ``aligned``, the rows feeding one token in ``AlignedDecodes``; the cache's capacity then a
    multiple of ``DECODE_ALIGN``). Returns ``(plan, ids, positions, kept, offsets)``."""
    ids: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    kept: list[int] = []
    offsets: dict[Hashable, int] = {}
    grouped: list[tuple[int, int, int, int]] = []  # slot, first flat token, count, held before
    long_rows = []
    decodes: list[tuple[int, int, int]] = []  # slot, flat token, length after the step
    longest = 0
    solo = rows_alone or sum(1 for tail in tails.values() if tail) <= SOLO_ROWS
    for slot, row in enumerate(order):
        tail = tails.get(row)
        if not tail:
            continue
        held, first = len(tokens[row]), len(ids)
        ids.extend(tail)
        slots.extend([slot] * len(tail))
        positions.extend(range(held, held + len(tail)))
        offsets[row] = len(kept)
        kept.extend(range(len(ids) - keeps[row], len(ids)))
        longest = max(longest, held + len(tail))
        if len(tail) <= GROUPED_QUERIES and not solo:
            grouped.append((slot, first, len(tail), held))
        elif rows_alone and aligned and len(tail) == 1:
            decodes.append((slot, first, held + 1))
        else:
            length = held + len(tail)
            causal = torch.ones((len(tail), length), dtype=torch.bool).tril(held).to(device)
            long_rows.append((slot, first, len(tail), length, causal))
    cache.reserve(len(order), max([longest, *(len(t) for t in tokens.values())]))
    width = max((count for _, _, count, _ in grouped), default=0)
    length = max((held + count for _, _, count, held in grouped), default=0)
    queries, real = [], []
    for index, (_, first, count, _) in enumerate(grouped):
        queries.extend(range(first, first + count))
        queries.extend([0] * (width - count))
        real.extend(range(index * width, index * width + count))
    mask = limit = None
    if grouped:
        held = torch.tensor([h for *_, h in grouped])
        limit = held[:, None] + torch.arange(width)[None, :]  # query w of a row sees positions <= held + w
        mask = (torch.arange(cache.length)[None, None, :] <= limit[:, :, None]).unsqueeze(1).to(device)
        limit = limit.to(device)
    in_order = all(slot == index for index, (slot, *_) in enumerate(grouped))
    grouped_tokens = None
    if long_rows and grouped:
        grouped_tokens = torch.tensor([t for _, first, count, _ in grouped for t in range(first, first + count)],
                                      device=device)
    plan = StepPlan(
        slots=torch.tensor(slots, device=device), positions=torch.tensor(positions, device=device),
        grouped_slots=None if in_order else torch.tensor([s for s, *_ in grouped], device=device),
        grouped_rows=len(grouped), grouped_queries=_unless_in_order(queries, device, len(queries)),
        grouped_width=width, grouped_length=length, grouped_valid=sum(h + c for _, _, c, h in grouped),
        grouped_mask=mask, grouped_limit=limit,
        grouped_real=_unless_in_order(real, device, len(queries)), grouped_tokens=grouped_tokens,
        long_rows=long_rows, cache_shape=(cache.rows, cache.length),
        decodes=aligned_decodes(decodes, device) if decodes else None)
    return (plan, torch.tensor([ids]), torch.tensor([positions], device=device),
            torch.tensor(kept, device=device), offsets)


def _unless_in_order(indices: list[int], device: Any, total: int) -> torch.Tensor | None:
    """``indices`` as a tensor, or None when they are all of ``0..total-1`` in order (an index_select saved)."""
    if indices == list(range(total)):
        return None
    return torch.tensor(indices, dtype=torch.long, device=device)


def aligned_decodes(decodes: list[tuple[int, int, int]], device: Any) -> AlignedDecodes:
    """``AlignedDecodes`` of the one-token rows ``(slot, flat token, length after the step)``, in slot order."""
    first_slot, last_slot = decodes[0][0], decodes[-1][0]
    lengths = [1] * (last_slot + 1 - first_slot)
    for slot, _, length in decodes:
        lengths[slot - first_slot] = length
    longest = max(length for *_, length in decodes)
    tokens = [token for _, token, _ in decodes]
    contiguous = len(decodes) == len(lengths) and tokens == list(range(tokens[0], tokens[0] + len(tokens)))
    return AlignedDecodes(
        first_slot=first_slot, slots=len(lengths), lengths=lengths,
        rows=torch.tensor([slot - first_slot for slot, *_ in decodes], device=device),
        tokens=torch.tensor(tokens, device=device), contiguous=(tokens[0], len(tokens)) if contiguous else None,
        length=-(-longest // DECODE_ALIGN) * DECODE_ALIGN, valid=sum(length for *_, length in decodes),
        members=decodes)
