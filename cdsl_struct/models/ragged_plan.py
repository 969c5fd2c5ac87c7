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
    attends on its own (a prompt, or every row of a step of at most ``SOLO_ROWS`` rows)."""
    cache_shape: tuple[int, int] = (0, 0)
    """The ``SlotCache``'s (slots, capacity) this step: what each layer's keys must have."""
    grouped_bias: dict[tuple[int, int, torch.dtype, int], torch.Tensor] = field(default_factory=dict)
    """``grouped_mask`` as the additive bias of the scores matmul (0 or the dtype's lowest), made
    by the first layer that attends and shared by the rest: ``(kv_heads, group, dtype, sliding window
    or 0)`` -> ``[A * kv_heads, group * W, capacity]``."""


def plan_step(order: Sequence[Hashable], tokens: dict[Hashable, list[int]], tails: dict[Hashable, list[int]],
              keeps: dict[Hashable, int], cache: SlotCache, device: Any,
              rows_alone: bool = False) -> tuple[Any, ...]:
    """A ragged step's flat inputs and its ``StepPlan``, rows in slot order: ``order`` the rows by
    slot, ``tokens`` what the cache holds of each, ``tails`` what each feeds this step and ``keeps``
    how many of its last positions' logits it keeps. Sizes ``cache`` for the step first (the plan's
    mask spans its capacity). ``rows_alone``: every row attends on its own, whatever the step's size.
    Returns ``(plan, ids, positions, kept, offsets)``."""
    ids: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    kept: list[int] = []
    offsets: dict[Hashable, int] = {}
    grouped: list[tuple[int, int, int, int]] = []  # slot, first flat token, count, held before
    long_rows = []
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
        long_rows=long_rows, cache_shape=(cache.rows, cache.length))
    return (plan, torch.tensor([ids]), torch.tensor([positions], device=device),
            torch.tensor(kept, device=device), offsets)


def _unless_in_order(indices: list[int], device: Any, total: int) -> torch.Tensor | None:
    """``indices`` as a tensor, or None when they are all of ``0..total-1`` in order (an index_select saved)."""
    if indices == list(range(total)):
        return None
    return torch.tensor(indices, dtype=torch.long, device=device)
