"""Buckets and the host's side of a static step: which fixed shape a step runs at, and its inputs
packed into one int64 buffer (pure data: no torch, no device).

A step is a ``Bucket``: ``rows`` x ``width`` fed positions, attending over the first ``length``
positions of each row's slot. Two kinds: a *decode* bucket (``gather=False``) covers slots
``0..rows-1`` in order (row = slot, so a layer's keys are a view), every running row in it, those
with nothing to feed padded; a *prefill* bucket (``gather=True``) holds a few rows of long feeds (a
joining row's prompt, in chunks of at most the widest prefill width) that read their slots by index.
Padded positions write their keys to a spare slot and see at least their row's first position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: rows a decode step is padded up to (SGLang's and vLLM's spacing: every size up to 8, then steps of 8-16)
DECODE_ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
#: positions a decode or verify row feeds (1: plain decode; wider: drafts, forced tokens)
DECODE_WIDTHS = (1, 4, 8, 16)
#: rows and positions of a prefill step (longer prompts run in chunks of the widest)
PREFILL_ROWS = (1, 4, 8)
PREFILL_WIDTHS = (64, 256)
#: the shortest span attention reads; each length bucket doubles it up to the cache's capacity
MIN_LENGTH = 256

#: the sections of a packed step, each ``rows * width`` long but ``row_slots`` (``rows``)
SECTIONS = ("ids", "positions", "write_slots", "write_positions", "kept", "row_slots")


@dataclass(frozen=True, order=True)
class Bucket:
    """One static shape: ``rows`` x ``width`` fed positions over ``length`` cached ones; ``gather``:
    rows read their slots by index (a prefill bucket) rather than being slots ``0..rows-1``."""

    rows: int
    width: int
    length: int
    gather: bool = False

    @property
    def tokens(self) -> int:
        return self.rows * self.width

    @property
    def size(self) -> int:
        """Int64 values a packed step of this bucket takes (``SECTIONS``)."""
        return 5 * self.tokens + self.rows


@dataclass(frozen=True)
class Buckets:
    """Every bucket a ``GraphRunner`` captures: decode rows x widths and prefill rows x widths, each
    at every length bucket up to ``capacity`` (the positions a slot holds)."""

    capacity: int = 2048
    decode_rows: tuple[int, ...] = DECODE_ROWS
    decode_widths: tuple[int, ...] = DECODE_WIDTHS
    prefill_rows: tuple[int, ...] = PREFILL_ROWS
    prefill_widths: tuple[int, ...] = PREFILL_WIDTHS

    @classmethod
    def up_to(cls, rows: int, capacity: int) -> Buckets:
        """The default buckets for at most ``rows`` rows (``DECODE_ROWS`` below it, then ``rows``)."""
        decode_rows = tuple(r for r in DECODE_ROWS if r < rows) + (rows,)
        prefill_rows = tuple(sorted({min(r, rows) for r in PREFILL_ROWS}))
        return cls(capacity=capacity, decode_rows=decode_rows, prefill_rows=prefill_rows)

    @property
    def lengths(self) -> tuple[int, ...]:
        lengths, length = [], min(MIN_LENGTH, self.capacity)
        while length < self.capacity:
            lengths.append(length)
            length *= 2
        return (*lengths, self.capacity)

    @property
    def max_rows(self) -> int:
        return self.decode_rows[-1]

    @property
    def max_width(self) -> int:
        """The widest feed a decode step takes; a row feeding more goes to a prefill step."""
        return self.decode_widths[-1]

    @property
    def chunk(self) -> int:
        """The most positions one prefill step feeds a row."""
        return self.prefill_widths[-1]

    def all(self) -> list[Bucket]:
        """Every bucket, largest first (the order to capture them in: later ones reuse the pool)."""
        shapes = [(r, w, False) for r in self.decode_rows for w in self.decode_widths]
        shapes += [(r, w, True) for r in self.prefill_rows for w in self.prefill_widths]
        buckets = [Bucket(r, w, length, gather) for r, w, gather in shapes for length in self.lengths]
        return sorted(buckets, key=lambda b: (b.tokens * b.length, b.tokens, b.rows), reverse=True)

    def decode(self, rows: int, width: int, length: int) -> Bucket | None:
        """The smallest decode bucket holding ``rows`` slots fed ``width`` positions each over
        ``length`` positions; None when none does."""
        return _fit(self.decode_rows, self.decode_widths, self.lengths, rows, width, length, False)

    def prefill(self, rows: int, width: int, length: int) -> Bucket | None:
        """The smallest prefill bucket for ``rows`` rows fed up to ``width`` positions each."""
        return _fit(self.prefill_rows, self.prefill_widths, self.lengths, rows, width, length, True)


def _fit(rows_by: Sequence[int], widths: Sequence[int], lengths: Sequence[int], rows: int, width: int,
         length: int, gather: bool) -> Bucket | None:
    r = next((r for r in rows_by if r >= rows), None)
    w = next((w for w in widths if w >= width), None)
    n = next((n for n in lengths if n >= length), None)
    return None if r is None or w is None or n is None else Bucket(r, w, n, gather)


@dataclass(frozen=True)
class FedRow:
    """One row of a static step: its index in the bucket, its slot, the positions its slot holds
    before the step (``held``), what it feeds, and how many of its last fed positions to keep."""

    index: int
    slot: int
    held: int
    tokens: Sequence[int]
    keep: int


def pack(bucket: Bucket, rows: Sequence[FedRow], spare: int, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """A static step's inputs, ``SECTIONS`` one after another in ``out`` (or a new buffer): ids,
    positions (for rotary embeddings and the mask: a query sees its slot up to its own position),
    the slot and position each fed key is written to, the flat index of each kept position in
    ``rows`` order, and each row's slot. Padding feeds token 0, writes to the ``spare`` slot and sees
    position 0 (a padded position in a real row: its row's last real one). Returns the buffer and how
    many positions are kept."""
    n, width = bucket.tokens, bucket.width
    buffer = np.zeros(bucket.size, dtype=np.int64) if out is None else out[:bucket.size]
    ids, positions, write_slots, write_positions, kept = (buffer[i * n:(i + 1) * n] for i in range(5))
    row_slots = buffer[5 * n:]
    if out is not None:
        ids.fill(0)
        positions.fill(0)
    write_slots.fill(spare)
    write_positions[:] = np.tile(np.arange(width, dtype=np.int64), bucket.rows)
    row_slots.fill(spare)
    at = 0
    for row in rows:
        count = len(row.tokens)
        start = row.index * width
        ids[start:start + count] = row.tokens
        fed = np.arange(row.held, row.held + count, dtype=np.int64)
        positions[start:start + count] = fed
        positions[start + count:start + width] = row.held + count - 1
        write_slots[start:start + count] = row.slot
        write_positions[start:start + count] = fed
        kept[at:at + row.keep] = np.arange(start + count - row.keep, start + count)
        at += row.keep
        row_slots[row.index] = row.slot
    return buffer, at
