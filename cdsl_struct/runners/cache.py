"""``StaticCache``: a ``SlotCache`` allocated once at its full size, whose buffers never move (a
captured graph holds their addresses): ``slots`` rows plus one spare slot that padded positions
write to, each of ``capacity`` positions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import CdslError
from ..models.slot_cache import SlotCache


class StaticCache(SlotCache):
    """Keys and values per layer ``[slots + 1, kv_heads, capacity, dim]`` (views of one tensor
    ``kv``), zeroed (attention may read a position no step wrote: it must be finite), allocated at
    once. ``fixed`` (the default) refuses to grow (a ``CdslError``: its runner leaves the static
    steps first); once cleared it grows as a ``SlotCache`` (its graphs are then stale)."""

    def __init__(self, layers: int, slots: int, capacity: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: Any) -> None:
        super().__init__(layers)
        self.rows, self.length = slots + 1, capacity
        self.spare = slots
        self.fixed = True
        # one tensor for every layer's keys and values, so that a row moved, forked, stored in or
        # restored from the prefix cache is one copy instead of two per layer (60 launches for SmolLM2)
        self.kv = torch.zeros((layers, 2, self.rows, kv_heads, capacity, head_dim), dtype=dtype, device=device)
        self.keys = [self.kv[layer, 0] for layer in range(layers)]
        self.values = [self.kv[layer, 1] for layer in range(layers)]

    @classmethod
    def for_model(cls, model: Any, slots: int, capacity: int) -> StaticCache:
        """A cache shaped for ``model``'s layers, in its dtype and on its device."""
        config = getattr(model.config, "get_text_config", lambda: model.config)()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        weight = model.get_output_embeddings().weight
        return cls(config.num_hidden_layers, slots, capacity, getattr(config, "num_key_value_heads", None) or heads,
                   head_dim, weight.dtype, weight.device)

    def fits(self, rows: int, length: int) -> bool:
        """Whether ``rows`` rows of up to ``length`` positions fit without growing."""
        return rows <= self.spare and length <= self.length

    def reserve(self, rows: int, length: int) -> None:
        if not self.fixed:
            return super().reserve(rows, length)
        if not self.fits(rows, length):
            raise CdslError(f"{rows} rows of {length} positions do not fit the static cache's "
                                f"{self.spare} slots of {self.length}")
        return None

    def copy_row(self, source: int, target: int, length: int) -> None:
        if not self.fixed:
            return super().copy_row(source, target, length)
        if length:
            self.kv[:, :, target, :, :length] = self.kv[:, :, source, :, :length]
        return None

    def write_row(self, slot: int, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if not self.fixed:
            return super().write_row(slot, kv)
        length = kv[0][0].shape[2]
        stacked = torch.stack([t[0] for pair in kv for t in pair])  # [layers * 2, heads, length, dim]
        self.kv[:, :, slot, :, :length] = stacked.view(len(kv), 2, *stacked.shape[1:])
        return None

    def read_row(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if not self.fixed:
            return super().read_row(slot, length)
        block = self.kv[:, :, slot:slot + 1, :, :length].clone()  # [layers, 2, 1, heads, length, dim]
        return [(block[layer, 0], block[layer, 1]) for layer in range(block.shape[0])]

    def bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()
