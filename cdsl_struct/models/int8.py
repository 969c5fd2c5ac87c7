"""int8 linear layers whose rows do not depend on their batch: the CPU self-draft's matmuls.

torch's dynamic quantisation (fbgemm's ``quantized::linear_dynamic``) measures one range over its
whole input and quantises every activation on it, so a token's output depends on the tokens
batched with it. A draft built that way had to run each row alone, one forward per row.

``TokenScaledInt8Linear`` divides each token's activations by their own largest magnitude, so they
lie in [-1, 1], and appends two constant activations, -1 and 1, that meet zero weights: the range
fbgemm measures is then exactly [-1, 1] in every batch. Each token is quantised on its own scale,
the integer matmul is exact, and the output is multiplied back by the token's scale: a row's
output is bitwise the same alone or beside any other rows. Weights are quantised per output
channel. Accuracy matches dynamic quantisation of one token at a time (SmolLM2's first q
projection, 7-bit activations: mean error 0.021 against 0.018 for fbgemm on each token alone,
0.022 on 16 tokens). Activations keep all 8 bits where fbgemm adds their products exactly
(``full_range``: AVX-512 VNNI, not AVX2).

Sibling projections of one input (``packed.SIBLINGS``: q/k/v, gate/up) share one int8 matrix: the
first of them to see an input computes all their outputs, the others take their columns.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .packed import SIBLINGS, PackedLinear, unpack_linears

#: the smallest scale a token is divided by (an all-zero token stays zero)
_TINY = 1e-12
#: the activations' saturating values and the weights' largest: a pair of their products fills 16 bits
_SATURATING = (255, 127)


@functools.cache
def full_range() -> bool:
    """Whether fbgemm's dynamic int8 product is exact with activations on all 8 bits here.

    fbgemm's AVX2 kernels add pairs of u8 x s8 products in 16 bits (``vpmaddubsw``), which saturate
    past 32,767: there activations keep 7 bits (``reduce_range``). AVX-512 VNNI's ``vpdpbusd``
    accumulates in 32 bits, so all 8 bits are exact. Checked, not read off the CPU's flags: a row
    of the largest weights against the largest activations, whose pairs saturate 16 bits, gives
    its exact sum only where nothing saturates. With 8 bits, SmolLM2's int8 self-draft agreed with
    its bf16 target on 0.867 of CDSL's tokens (60 ``tune`` sentences, teacher-forced), against
    0.761 with 7 (AVX-512 EPYC). ``CDSL_INT8_BITS=7`` keeps 7 bits anyway (read once)."""
    if os.environ.get("CDSL_INT8_BITS", "") == "7":
        return False
    width = 64
    weight = torch.full((1, width), float(_SATURATING[1]))
    scales = torch.ones(1, dtype=torch.double)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantised = torch.quantize_per_channel(weight, scales, torch.zeros(1, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(quantised, None)
    activations = torch.full((1, width), float(_SATURATING[0]))
    activations[0, 0] = 0.0  # the range [0, 255]: every other activation quantises to 255 exactly
    out = torch.ops.quantized.linear_dynamic(activations, packed, False)
    pair = _SATURATING[0] * _SATURATING[1]
    return abs(float(out[0, 0]) - (width - 1) * pair) < 1e-3 * width * pair  # saturated: about half


class Int8Matrix:
    """One int8 matrix (a projection's, or its siblings' side by side) with the token scaling."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        weight = weight.detach().float()
        rows, self.width = weight.shape
        # per output channel, the largest magnitude as max(max, -min): no |weight| copy of the matrix
        largest = torch.maximum(weight.amax(1), weight.amin(1).neg())
        scales = (largest / 127).clamp_min(_TINY).double()
        zeros = torch.zeros(rows, dtype=torch.long)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notice on quantised tensors; fbgemm's kernels take them
            integers = torch.zeros(rows, self.width + 2, dtype=torch.int8)  # the anchors' columns: zero weights
            integers[:, :self.width] = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8).int_repr()
            quantised = torch._make_per_channel_quantized_tensor(integers, scales, zeros, 0)
        self.packed = torch.ops.quantized.linear_prepack(quantised, None)
        self.bias = None if bias is None else bias.detach().float()
        self.anchors = torch.tensor([-1.0, 1.0])
        self.float_weight: torch.Tensor | None = None  # set inside ``dequantised``
        self.out_features = rows
        self.last = threading.local()  # (input, output, members served): one forward per thread

    def __call__(self, x: torch.Tensor, padded: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T (+ bias)``; ``padded``: a buffer of ``x``'s shape plus two columns that already
        holds the anchors in them (``padded_like``), reused instead of a new one."""
        if self.float_weight is not None:
            return torch.nn.functional.linear(x, self.float_weight, self.bias)
        # the largest magnitude (a max is exact). Not vector_norm(inf): one op, but a scalar loop per
        # token here, 15-25x slower than these two at 16-40 tokens (AVX-512 EPYC, torch 2.13)
        scale = x.abs().amax(-1, keepdim=True).clamp_min_(_TINY)
        if padded is None:
            padded = self.padded_like(x)
        torch.div(x, scale, out=padded[..., :self.width])
        out = torch.ops.quantized.linear_dynamic(padded, self.packed, not full_range()).mul_(scale)
        return out if self.bias is None else out.add_(self.bias)

    def padded_like(self, x: torch.Tensor) -> torch.Tensor:
        """An input buffer for ``x``: its shape plus the two anchor columns, anchors written."""
        padded = x.new_empty(*x.shape[:-1], self.width + 2)
        padded[..., self.width:] = self.anchors
        return padded

    def member_output(self, index: int, members: int, x: torch.Tensor) -> torch.Tensor:
        """The whole matrix's output for ``x``, computed once for the ``members`` siblings that read it."""
        last = getattr(self.last, "value", None)
        if last is None or last[0] is not x or index in last[2]:
            last = (x, self(x), set())
        last[2].add(index)
        self.last.value = None if len(last[2]) == members else last  # all served: let go
        return last[1]


class TokenScaledInt8Linear(nn.Module):
    """A linear layer on int8 weights whose activations are scaled per token (module docstring):
    the columns ``span`` of ``matrix``, member ``index`` of ``members`` siblings."""

    def __init__(self, matrix: Int8Matrix, span: tuple[int, int], index: int = 0, members: int = 1) -> None:
        super().__init__()
        self.matrix, self.span, self.index, self.members = matrix, span, index, members
        self.in_features, self.out_features = matrix.width, span[1] - span[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.members == 1:
            return self.matrix(x)
        start, end = self.span
        return self.matrix.member_output(self.index, self.members, x)[..., start:end]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, token-scaled int8"


def quantise_linears(model: Any) -> Any:
    """A float32 copy of ``model`` whose linear layers are ``TokenScaledInt8Linear`` (CPU only);
    ``model`` itself is unchanged."""
    plain = _copy_but_linears(model)
    unpack_linears(plain)
    done: set[int] = set()
    for module in list(plain.modules()):
        for names in SIBLINGS:
            members = [getattr(module, name, None) for name in names]
            if all(type(m) is nn.Linear for m in members) and _can_share(members):
                _replace(module, names, members)
                done.update(id(m) for m in members)
    for module in list(plain.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and id(child) not in done:
                setattr(module, name, TokenScaledInt8Linear(Int8Matrix(child.weight, child.bias),
                                                            (0, child.out_features)))
    # the int8 kernels take float32 activations (a bf16 target too); no parameter is shared with
    # ``model`` any more, so converting in place cannot reach it
    return plain.float().eval()


def _copy_but_linears(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose linear layers hold ``model``'s own weights and biases, not
    copies: they are replaced by int8 matrices next, so copying them would only cost time and
    memory. A parameter a linear layer shares with another module (tied input embeddings) is copied."""
    replaced = [m for m in model.modules() if type(m) in (nn.Linear, PackedLinear)]
    elsewhere = {id(p) for m in model.modules() if type(m) not in (nn.Linear, PackedLinear)
                 for p in m.parameters(recurse=False)}
    memo = {id(p): p for m in replaced for p in m.parameters(recurse=False) if id(p) not in elsewhere}
    return copy.deepcopy(model, memo)


@contextlib.contextmanager
def dequantised(model: Any) -> Iterator[None]:
    """Run ``model``'s ``TokenScaledInt8Linear`` layers in float32 on their dequantised weights while
    inside: a self-check of the forward's plumbing against the model's own forward, where int8
    rounding would turn float summation-order differences into different logits. Holds a float32
    copy of those weights meanwhile."""
    matrices = {id(m.matrix): m.matrix for m in model.modules() if isinstance(m, TokenScaledInt8Linear)}
    try:
        for matrix in matrices.values():
            weight, _ = torch.ops.quantized.linear_unpack(matrix.packed)
            scales = weight.q_per_channel_scales().float().unsqueeze(1)  # zero points are all zero
            matrix.float_weight = weight.int_repr()[:, :matrix.width].float().mul_(scales)  # one float copy
        yield
    finally:
        for matrix in matrices.values():
            matrix.float_weight = None


def token_scaled(model: Any) -> bool:
    """Whether ``model`` has ``TokenScaledInt8Linear`` layers."""
    return any(isinstance(m, TokenScaledInt8Linear) for m in model.modules())


def _can_share(members: list[nn.Linear]) -> bool:
    first = members[0]
    return all(m.in_features == first.in_features and (m.bias is None) == (first.bias is None) for m in members)


def _replace(module: nn.Module, names: tuple[str, ...], members: list[nn.Linear]) -> None:
    biases = [m.bias for m in members]
    matrix = Int8Matrix(torch.cat([m.weight.detach() for m in members]),
                         None if biases[0] is None else torch.cat([b.detach() for b in biases]))
    start = 0
    for index, (name, member) in enumerate(zip(names, members, strict=True)):
        span = (start, start + member.out_features)
        setattr(module, name, TokenScaledInt8Linear(matrix, span, index, len(members)))
        start = span[1]
