"""A KV cache whose layers grow in place: a decode step writes its keys and values into spare
capacity instead of copying the whole cache.

transformers' ``DynamicLayer`` appends a step's keys with ``torch.cat``, which copies every row's
every cached position of every layer at every step: at 16 rows of ~150 positions that was 12% of
a CPU decode step (``aten::cat`` in the profile of docs/benchmarks/2026-11-25-model-layer.md). ``GrowingLayer`` keeps
each tensor in a buffer with spare positions along the sequence axis and hands attention a view
of the used part; appending copies only the new positions, and the buffer is reallocated (with a
quarter of its length spare) only when it runs out. ``BatchRunner`` rewrites ``keys``/``values``
freely (rows leave, fork, are padded, compacted): assigning a tensor adopts it as the new buffer,
except a leading slice of the current one (a crop, a trim on the right), which keeps the buffer
and only shortens the used part.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: spare positions a reallocated buffer gets: a quarter of what it holds, at least this many
MIN_SPARE = 16


class _Growing:
    """One of a layer's two tensors: a buffer ``[rows, heads, capacity, dim]`` and its used length."""

    __slots__ = ("buffer", "length")

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.length = 0

    def view(self) -> torch.Tensor | None:
        if self.buffer is None or self.buffer.dim() != 4:
            return self.buffer
        return self.buffer[:, :, :self.length]

    def adopt(self, tensor: torch.Tensor | None) -> None:
        buffer = self.buffer
        if (tensor is not None and buffer is not None and tensor.dim() == 4 and buffer.dim() == 4
                and tensor.data_ptr() == buffer.data_ptr() and tensor.stride() == buffer.stride()
                and tensor.shape[:2] == buffer.shape[:2] and tensor.shape[3] == buffer.shape[3]
                and tensor.shape[2] <= buffer.shape[2]):
            self.length = tensor.shape[2]  # a leading slice of the buffer: keep the spare room
            return
        self.buffer = tensor
        self.length = tensor.shape[2] if tensor is not None and tensor.dim() == 4 else 0

    def append(self, states: torch.Tensor) -> torch.Tensor:
        buffer, new = self.buffer, states.shape[2]
        fits = (buffer is not None and buffer.dim() == 4 and buffer.shape[:2] == states.shape[:2]
                and buffer.shape[3] == states.shape[3] and buffer.dtype == states.dtype
                and self.length + new <= buffer.shape[2])
        if not fits:
            used = self.length if buffer is not None and buffer.dim() == 4 else 0
            total = used + new
            # zeros, not empty: decode attention reads the spare positions (masked), and masked
            # garbage could still be NaN times a zero weight
            grown = states.new_zeros((states.shape[0], states.shape[1], total + max(MIN_SPARE, total // 4),
                                      states.shape[3]))
            if used:
                grown[:, :, :used] = buffer[:, :, :used]
            self.buffer, self.length = grown, used
        self.buffer[:, :, self.length:self.length + new] = states
        self.length += new
        return self.buffer[:, :, :self.length]


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends in place into spare capacity (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        self._keys, self._values = _Growing(), _Growing()
        super().__init__(**kwargs)

    @property
    def keys(self) -> torch.Tensor | None:
        return self._keys.view()

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._keys.adopt(tensor)

    @property
    def values(self) -> torch.Tensor | None:
        return self._values.view()

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values.adopt(tensor)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self._keys.append(key_states), self._values.append(value_states)


def growing_cache() -> DynamicCache:
    """An empty ``DynamicCache`` whose layers, made as the model first writes them, are ``GrowingLayer``s."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache
