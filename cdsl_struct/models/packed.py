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
float16, bfloat16 on a CPU without oneDNN's bfloat16 path such as an AVX2-only one:
``packable_dtypes``, autograd) runs the stock ``nn.Linear`` path. Traced by ``torch.compile``, a
layer multiplies by the copy ``prepack`` made, through the opaque op ``packed_linear``
(``models.compiled``). Results stay float32 (or bfloat16) matmuls, summed in a different order than
MKL's GEMM: equal to ~1e-4 absolute, not bitwise.

Sibling projections of one input (``q_proj``/``k_proj``/``v_proj`` of an attention block,
``gate_proj``/``up_proj`` of a gated MLP: the names of Llama, Mistral, Qwen, Gemma and most HF
decoders) are packed as one matrix: the first of them to see an input computes all their outputs
in one matmul, the others take their columns of it (one call instead of three: at a few rows a
oneDNN call's fixed cost is most of it; SmolLM2's q/k/v 100 -> 41 us, gate/up 96 -> 62 us at
one row, bf16). A sibling called with another input, or twice with one, computes afresh.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

#: the batch size oneDNN is told to expect when it picks the packed layout (rows x positions of a step)
_ROWS_HINT = 16
#: child names of sibling projections that read one input, packed as one matrix
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_packed: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int, torch.dtype], torch.Tensor]] = \
    weakref.WeakKeyDictionary()
_fused: weakref.WeakKeyDictionary[nn.Module, tuple[_FusedSiblings, int]] = weakref.WeakKeyDictionary()


def packing_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear kernels."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return all(callable(op) for op in (torch.ops.mkldnn._reorder_linear_weight,
                                           torch.ops.mkldnn._linear_pointwise))
    except (AttributeError, RuntimeError):
        return False


def packable_dtypes() -> frozenset[torch.dtype]:
    """The weight dtypes oneDNN's prepacked kernels serve on this CPU (empty: pack nothing).

    float32 wherever the kernels exist (``packing_available``); bfloat16 only where oneDNN has a
    bfloat16 path on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: ``torch.ops.mkldnn.
    _is_mkldnn_bf16_supported``); an AVX2-only CPU refuses to reorder a bfloat16 weight, and its
    bfloat16 linears take the stock path. ``CDSL_PACK=0`` packs nothing (the stock path
    everywhere, e.g. to test it on a CPU that packs). A function so tests can pose as another CPU."""
    return _packable_dtypes(os.environ.get("CDSL_PACK", "") == "0")


@functools.cache
def _packable_dtypes(off: bool) -> frozenset[torch.dtype]:
    if off or not packing_available():
        return frozenset()
    dtypes = {torch.float32}
    try:
        if torch.ops.mkldnn._is_mkldnn_bf16_supported():
            dtypes.add(torch.bfloat16)
    except (AttributeError, RuntimeError):
        pass
    return frozenset(dtypes)


_refused: set[torch.dtype] = set()
"""dtypes whose weight oneDNN refused to reorder though ``packable_dtypes`` named them: stock path from then on"""


def _reorder(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's prepacked copy of ``weight``, or None where oneDNN refuses its dtype on this CPU
    (logged once; that dtype's linears take the stock path from then on, never a failed request)."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT)
    except RuntimeError as exc:
        if weight.dtype not in _refused:
            _refused.add(weight.dtype)
            logger.warning("oneDNN cannot prepack %s weights on this CPU (%s); those linear layers run "
                           "unpacked", weight.dtype, exc)
        return None


def _packs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a linear of ``weight`` on input ``x`` runs on prepacked weights (else the stock path)."""
    return (x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype == weight.dtype
            and x.dtype in packable_dtypes() and x.dtype not in _refused and not torch.is_grad_enabled())


@torch.library.custom_op("cdsl_struct::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` ([n, in]) times a weight oneDNN prepacked (``_reorder_linear_weight``), plus ``bias``: [n, out].
    An opaque op to ``torch.compile``: a compiled graph takes the packed weight as an input, so it holds
    no weights and inductor's caches keep it across processes (``models.compiled``)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], packed.shape[0]))


#: the attribute of a ``PackedLinear`` that ``prepack`` sets for traced forwards: (packed weight, bias,
#: first and last output column taken: a fused sibling's span of its group's matrix)
TRACED = "_cdsl_traced"


def prepack(model: Any) -> int:
    """Pack every ``PackedLinear`` of ``model`` now and keep the packed weight where a traced forward
    (``torch.compile``) reads it, so the compiled graph multiplies by it through ``packed_linear``
    instead of inlining a plain matmul; how many. The weights are read once: a compiled graph does not
    see weights changed afterwards (call it again, and recompile)."""
    count = 0
    for module in model.modules():
        if type(module) is not PackedLinear or module.weight.device.type != "cpu" \
                or module.weight.dtype not in packable_dtypes():
            continue
        module.__dict__.pop(TRACED, None)
        fused = _fused.get(module)
        if fused is not None:
            group, index = fused
            if group.prepare() is None:
                continue
            start, end = group.spans[index]
            module.__dict__[TRACED] = (group.packed, group.bias, start, end)
        else:
            entry = module.packed()
            if entry is None:
                continue
            module.__dict__[TRACED] = (entry, module.bias, 0, module.out_features)
        count += 1
    return count


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose CPU forward multiplies by a prepacked copy of its weight (where this
    CPU packs its dtype: ``packable_dtypes``; elsewhere the stock ``nn.Linear`` forward)."""

    def packed(self) -> torch.Tensor | None:
        """The prepacked copy of this layer's own weight (made or remade now where it changed); None
        where oneDNN refused its dtype."""
        weight = self.weight
        key = (weight.data_ptr(), weight._version, weight.dtype)
        entry = _packed.get(self)
        if entry is None or entry[0] != key:
            packed = _reorder(weight.detach())
            if packed is None:
                return None
            entry = (key, packed)
            _packed[self] = entry
        return entry[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if torch.compiler.is_dynamo_compiling():
            return self._traced(x)
        if not _packs(x, weight):
            return super().forward(x)
        fused = _fused.get(self)
        if fused is not None:
            out = fused[0].forward(fused[1], x)
            return super().forward(x) if out is None else out
        packed = self.packed()
        if packed is None:
            return super().forward(x)
        shape = x.shape
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), packed, self.bias, "none", [None], "")
        return out.reshape(*shape[:-1], out.shape[-1])

    def _traced(self, x: torch.Tensor) -> torch.Tensor:
        """The forward as ``torch.compile`` traces it: ``packed_linear`` on what ``prepack`` kept (a fused
        sibling multiplies by its group's whole matrix and takes its columns; the compiler's
        ``DedupePackedLinears`` pass leaves one product for the group); the stock path without it."""
        traced = getattr(self, TRACED, None)
        if traced is None or x.dtype != traced[0].dtype or x.device.type != "cpu" or torch.is_grad_enabled():
            return super().forward(x)
        packed, bias, start, end = traced
        shape = x.shape
        out = packed_linear(x.reshape(-1, shape[-1]), packed, bias)
        if end - start != out.shape[-1]:
            out = out[:, start:end]
        return out.reshape(*shape[:-1], end - start)


class _FusedSiblings:
    """Sibling ``PackedLinear``s of one input as one packed matrix (see the module docstring)."""

    def __init__(self, members: list[nn.Linear]) -> None:
        self.members = [weakref.ref(m) for m in members]
        self.key: tuple[Any, ...] | None = None
        self.packed: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        bounds = [0]
        for member in members:
            bounds.append(bounds[-1] + member.out_features)
        self.spans = list(zip(bounds, bounds[1:], strict=False))
        self.last = threading.local()  # (input, output, members served): one forward per thread

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor | None:
        """Member ``index``'s output for ``x``; None where oneDNN refused to pack the weights."""
        last = getattr(self.last, "value", None)
        if last is None or last[0] is not x or index in last[2]:
            out = self._all(x)
            if out is None:
                return None
            last = (x, out, set())
        last[2].add(index)
        self.last.value = None if len(last[2]) == len(self.members) else last  # all served: let go
        start, end = self.spans[index]
        return last[1][..., start:end]

    def prepare(self) -> torch.Tensor | None:
        """The group's packed matrix (made or remade now where a member's weight changed; ``bias``
        beside it); None where oneDNN refused its dtype."""
        members = [ref() for ref in self.members]
        if any(m is None for m in members):
            raise RuntimeError("a fused projection's sibling was deleted")
        weights = [m.weight for m in members]
        key = tuple((w.data_ptr(), w._version, w.dtype) for w in weights)
        if key != self.key:
            self.packed = _reorder(torch.cat([w.detach() for w in weights]))
            if self.packed is None:
                return None
            biases = [m.bias for m in members]
            self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            self.key = key
        return self.packed

    def _all(self, x: torch.Tensor) -> torch.Tensor | None:
        packed = self.prepare()
        if packed is None:
            return None
        shape = x.shape
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), packed, self.bias, "none", [None], "")
        return out.reshape(*shape[:-1], out.shape[-1])


def _fuse_siblings(model: Any) -> int:
    """Group each module's sibling ``PackedLinear``s (``SIBLINGS``) that can share a matrix: same
    input width, dtype and device, all with a bias or none. How many groups."""
    groups = 0
    for module in model.modules():
        for names in SIBLINGS:
            members = [getattr(module, name, None) for name in names]
            if not all(type(m) is PackedLinear for m in members):
                continue
            first = members[0]
            if any(m.in_features != first.in_features or m.weight.dtype != first.weight.dtype
                   or m.weight.device != first.weight.device or (m.bias is None) != (first.bias is None)
                   or m in _fused for m in members):
                continue
            group = _FusedSiblings(members)
            for index, member in enumerate(members):
                _fused[member] = (group, index)
            groups += 1
    return groups


def pack_linears(model: Any) -> int:
    """Switch every plain ``nn.Linear`` of ``model`` to ``PackedLinear`` in place; how many.

    Does nothing (returns 0) where this CPU packs no dtype (``packable_dtypes``). A model of a
    dtype this CPU does not pack (bfloat16 without AVX-512) is switched all the same and runs the
    stock path: cast to float32 later, it packs."""
    if not packable_dtypes():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            count += 1
    _fuse_siblings(model)
    return count


def unpack_linears(model: Any) -> int:
    """Switch ``model``'s ``PackedLinear`` modules back to ``nn.Linear`` (e.g. before a transform
    that matches modules by exact type, such as torch's dynamic quantisation); how many."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            _packed.pop(module, None)
            _fused.pop(module, None)
            module.__dict__.pop(TRACED, None)
            count += 1
    return count
