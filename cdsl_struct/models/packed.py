"""Linear layers on prepacked oneDNN weights: the CPU decode step's matmuls, 1.7-3.6x faster.

A decode step multiplies a few rows of activations by every weight matrix of the model. Stock
``torch.nn.functional.linear`` on the CPU hands that to a generic GEMM that re-reads the weight
in its plain row-major layout each call; oneDNN can reorder a weight once into the blocked
layout its small-batch kernels stream best (what vLLM's CPU build and inductor's CPU freezing
do). Measured here (2 AVX-512 cores, SmolLM2's LM head, 576 x 49152, fp32): 21.5 ms -> 5.9 ms
at 16 rows, 10.5 ms -> 5.1 ms at one; 1.7x on the decoder layers' shapes at 16 rows.

``pack_linears(model)`` switches the model's ``nn.Linear`` modules, in place, to
``PackedLinear``: same parameters, same state dict, same module tree (tied weights stay tied);
only ``forward`` changes. The packed copy is made on the first CPU forward and remade when the
weight changes (its storage, version or dtype: ``model.to(torch.bfloat16)`` repacks), so it
costs one more copy of the weights in memory. Anything the packed kernel does not serve (a GPU,
float16, autograd) runs the stock ``nn.Linear`` path. Results stay float32 (or bfloat16)
matmuls, summed in a different order than MKL's GEMM: equal to ~1e-4 absolute, not bitwise.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

_PACKED_DTYPES = (torch.float32, torch.bfloat16)
#: the batch size oneDNN is told to expect when it picks the packed layout (rows x positions of a step)
_ROWS_HINT = 16
_packed: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int, torch.dtype], torch.Tensor]] = \
    weakref.WeakKeyDictionary()


def packing_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear kernels."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return all(callable(op) for op in (torch.ops.mkldnn._reorder_linear_weight,
                                           torch.ops.mkldnn._linear_pointwise))
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose CPU forward multiplies by a prepacked copy of its weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (x.device.type != "cpu" or x.dtype not in _PACKED_DTYPES or x.dtype != weight.dtype
                or torch.is_grad_enabled() or weight.device.type != "cpu"):
            return super().forward(x)
        key = (weight.data_ptr(), weight._version, weight.dtype)
        entry = _packed.get(self)
        if entry is None or entry[0] != key:
            entry = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT))
            _packed[self] = entry
        shape = x.shape
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), entry[1], self.bias, "none", [None], "")
        return out.reshape(*shape[:-1], out.shape[-1])


def pack_linears(model: Any) -> int:
    """Switch every plain ``nn.Linear`` of ``model`` to ``PackedLinear`` in place; how many.

    Does nothing (returns 0) where this torch build lacks the kernels."""
    if not packing_available():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            count += 1
    return count


def unpack_linears(model: Any) -> int:
    """Switch ``model``'s ``PackedLinear`` modules back to ``nn.Linear`` (e.g. before a transform
    that matches modules by exact type, such as torch's dynamic quantisation); how many."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            _packed.pop(module, None)
            count += 1
    return count
