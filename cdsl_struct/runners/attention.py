"""Attention of a static step, driven by device tensors only (no Python plan, no host read), so
that a step can be compiled with ``fullgraph=True`` and captured in a CUDA graph.

Each layer writes its new keys and values into the ``StaticCache`` at the slots and positions the
step's inputs give (padding into the spare slot), then attends over the first ``length`` positions
of each row's slot with the step's mask. The query heads that share a key/value head are the
queries of one SDPA "head" (``[rows, kv_heads, group * width, dim]``): no ``repeat_kv`` copy of
the cache, and no mask beside ``enable_gqa`` (a pairing that crashed CUDA's SDPA in torch 2.11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..models.ragged_attention import STATIC_STEP as STEP_KEYWORD

__all__ = ["STEP_KEYWORD", "StaticAttention", "static_attention", "step_mask"]


@dataclass
class StaticAttention:
    """What every layer of one static step reads: the cache's buffers, where the step's keys go,
    which slot each row reads (None: row b reads slot b) and the mask ``[rows, 1, group * width,
    length]``, True where a query attends."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    write_slots: torch.Tensor
    write_positions: torch.Tensor
    row_slots: torch.Tensor | None
    mask: torch.Tensor
    length: int
    positions: torch.Tensor | None = None
    """``[rows, width]`` each query's position: what a sliding layer's mask is made from."""
    group: int = 1

    def attend(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float | None, window: int | None = None) -> torch.Tensor:
        """What the model's attention function calls in a static step (``static_attention``);
        ``window``: the layer's sliding window, or None."""
        return static_attention(module, query, key, value, self, scaling, window)

    def mask_for(self, window: int | None) -> torch.Tensor:
        """The step's mask for a layer with sliding ``window`` (None: the full-attention mask)."""
        if not window or window >= self.length or self.positions is None:
            return self.mask
        return step_mask(self.positions, self.length, self.group, window)


def static_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     step: StaticAttention, scaling: float | None, window: int | None = None) -> torch.Tensor:
    """``query`` ``[rows, heads, width, dim]``, ``key``/``value`` ``[rows, kv_heads, width, dim]`` (the
    step's own) -> ``[rows, width, heads, dim]`` (transformers' layout of an attention output)."""
    rows, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    layer_keys, layer_values = step.keys[module.layer_idx], step.values[module.layer_idx]
    layer_keys[step.write_slots, :, step.write_positions] = key.transpose(1, 2).reshape(rows * width, kv_heads, dim)
    layer_values[step.write_slots, :, step.write_positions] = value.transpose(1, 2).reshape(rows * width, kv_heads,
                                                                                             dim)
    length = step.length
    if step.row_slots is None:
        keys, values = layer_keys[:rows, :, :length], layer_values[:rows, :, :length]
    else:
        keys = layer_keys[:, :, :length].index_select(0, step.row_slots)
        values = layer_values[:, :, :length].index_select(0, step.row_slots)
    grouped = query.reshape(rows, kv_heads, group * width, dim)
    scale = dim ** -0.5 if scaling is None else scaling
    attended = torch.nn.functional.scaled_dot_product_attention(grouped, keys, values, attn_mask=step.mask_for(window),
                                                                scale=scale)
    return attended.view(rows, kv_heads, group, width, dim).reshape(rows, heads, width, dim).transpose(1, 2)


def step_mask(positions: torch.Tensor, length: int, group: int, window: int | None = None) -> torch.Tensor:
    """``[rows, 1, group * width, length]``: query (g, w) of row b sees positions ``<= positions[b, w]``,
    and with a sliding ``window`` only those ``> positions[b, w] - window``."""
    rows, width = positions.shape
    every = torch.arange(length, device=positions.device)[None, None, :]
    seen = every <= positions[:, :, None]
    if window:
        seen = seen & (every > positions[:, :, None] - window)
    return seen[:, None].expand(rows, group, width, length).reshape(rows, 1, group * width, length)
