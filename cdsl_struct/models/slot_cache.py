"""``SlotCache``: a ragged runner's keys and values, one left-aligned slot per row, written by the
model's layers during a ragged step at the positions its ``StepPlan`` gives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .attention import ragged_step

#: spare positions a grown ``SlotCache`` gets (an eighth of what it needs, at least this many: the
#: grouped attention reads them all) and spare rows (a quarter, at least this many)
MIN_SPARE_POSITIONS = 16
MIN_SPARE_ROWS = 4

_step = ragged_step  # ``plan``, ``attend`` and ``cache`` while a ragged step runs on this thread


class SlotCache:
    """Keys and values per layer, ``[slots, kv_heads, capacity, dim]``; what the model's layers
    write through ``update`` during a ragged step (not a transformers ``Cache``: it lives in one
    ``RaggedRunner``, which sizes it and moves rows in it)."""

    def __init__(self, layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.rows = 0
        self.length = 0

    def reserve(self, rows: int, length: int) -> None:
        """Make every layer hold at least ``rows`` slots of ``length`` positions; shrink the positions
        when they are more than twice what is needed (the grouped attention reads all of them)."""
        shrink = self.length > 2 * (length + MIN_SPARE_POSITIONS)
        if rows <= self.rows and length <= self.length and not shrink:
            return
        if rows > self.rows:
            self.rows = self.grown(rows, MIN_SPARE_ROWS)
        if length > self.length or shrink:
            self.length = self.grown(length, MIN_SPARE_POSITIONS, 8)
        for index, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            if keys is not None:
                self.keys[index], self.values[index] = self._resized(keys), self._resized(values)

    @staticmethod
    def grown(need: int, least: int, share: int = 4) -> int:
        """What a dimension grows to for ``need``: a ``share``-th more, at least ``least`` more."""
        return need + max(least, need // share)

    def _resized(self, buffer: torch.Tensor) -> torch.Tensor:
        if buffer.shape[0] == self.rows and buffer.shape[2] == self.length:
            return buffer
        # zeros: attention reads masked positions, and masked garbage could be NaN times a zero weight
        resized = buffer.new_zeros((self.rows, buffer.shape[1], self.length, buffer.shape[3]))
        rows, length = min(self.rows, buffer.shape[0]), min(self.length, buffer.shape[2])
        resized[:rows, :, :length] = buffer[:rows, :, :length]
        return resized

    def layer(self, index: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s buffers, allocated like ``like`` (``[.., kv_heads, .., dim]``) on first use."""
        if self.keys[index] is None:
            shape = (self.rows, like.shape[-3], self.length, like.shape[-1])
            self.keys[index] = like.new_zeros(shape)
            self.values[index] = like.new_zeros(shape)
        return self.keys[index], self.values[index]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a step's ``[1, kv_heads, N, dim]`` keys and values at their rows' positions; the layer's buffers."""
        plan = _step.plan  # the running step's ``ragged_plan.StepPlan``
        keys, values = self.layer(layer_idx, key_states)
        keys[plan.slots, :, plan.positions] = key_states[0].transpose(0, 1)
        values[plan.slots, :, plan.positions] = value_states[0].transpose(0, 1)
        return keys, values

    def copy_row(self, source: int, target: int, length: int) -> None:
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                if buffer is not None and length:
                    buffer[target, :, :length] = buffer[source, :, :length]

    def write_row(self, slot: int, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy per-layer ``[1, heads, n, dim]`` keys and values into positions ``0..n`` of ``slot``."""
        for index, (keys, values) in enumerate(kv):
            layer_keys, layer_values = self.layer(index, keys)
            layer_keys[slot, :, :keys.shape[2]] = keys[0]
            layer_values[slot, :, :values.shape[2]] = values[0]

    def read_row(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of ``slot``'s first ``length`` positions, per layer ``[1, heads, length, dim]``."""
        return [(keys[slot:slot + 1, :, :length].clone(), values[slot:slot + 1, :, :length].clone())
                for keys, values in zip(self.keys, self.values, strict=True) if keys is not None]
