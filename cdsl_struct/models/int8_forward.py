"""``Int8Forward``: the int8 self-draft's ragged step in a few hundred tensor ops, bitwise the model's own.

A draft pass of the token-scaled int8 self-draft (``models.int8``) on one row of SmolLM2 took
~50 ms on one core, of which fbgemm's int8 products were under half: the rest was the ~2,000
small ops of transformers' decoder layers and the Python around them (modules, keyword plumbing,
the attention interface, the siblings' shared-output bookkeeping). CDSL's wall is draft passes
and target passes, so a draft pass saved is wall saved (docs/benchmarks/2026-11-28-cdsl-cost-and-verdicts.md).

This runs the same arithmetic with less around it, for Llama-shaped decoders (Llama, Mistral,
Qwen 2: pre-norm RMSNorm, rotary embedding of the default kind, grouped-query attention, a gated
SiLU MLP) whose linear layers ``quantise_linears`` made token-scaled int8:

- q/k/v and gate/up are one int8 product each, read by column range;
- the padded input with its two anchors is a buffer kept per shape, anchors written once;
- the rotary embedding is applied to queries and keys together,
  ``rotate_half(x) * sin`` as ``roll(x) * sin`` with the first half of ``sin`` negated;
- residual adds are in place; a row's keys and values are written by slice.

Every one of these is exact: the same values in the same order of operations, so a row's logits
are bitwise those of the model's own forward through the ragged runner (held by
``tests/models/test_int8_forward.py``), and CDSL writes the same text, only sooner. The attention
is the ragged runner's own per-row SDPA (``rows_alone``: the int8 draft's rows attend alone).

``int8_forward(model)`` gives one where the model qualifies, else None (the model's own forward
runs). ``CDSL_INT8_FORWARD=0`` turns it off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from .attention import row_attention, within_window
from .int8 import Int8Matrix, TokenScaledInt8Linear
from .ragged_attention import masked_gqa_safe
from .ragged_plan import StepPlan

#: model types whose decoder layers this forward reproduces
INT8_FORWARD_MODEL_TYPES = ("llama", "mistral", "qwen2")
#: rotary embeddings that are ``inv_freq`` alone (their scaling is folded into it at load)
_PLAIN_ROPE = ("default", "llama3", "linear")
#: token counts a product keeps an input buffer for (a prompt's count is seen once; decoding's, often)
_SHAPES_KEPT = 4
#: the most tokens an input buffer is kept for (30 layers of SmolLM2 hold ~0.4 MB a token)
_TOKENS_KEPT = 64


@dataclass
class _Layer:
    """One decoder layer's weights: the norms, and the int8 products with their column splits."""

    attention_norm: torch.Tensor
    attention_eps: float
    qkv: _Matmul
    out: _Matmul
    mlp_norm: torch.Tensor
    mlp_eps: float
    gate_up: _Matmul
    down: _Matmul
    window: int | None
    """The layer's sliding window (a query at q sees q - window < p <= q), or None."""


class _Matmul:
    """An ``Int8Matrix``'s product with its padded inputs kept for the last ``_SHAPES_KEPT`` token
    counts it saw up to ``_TOKENS_KEPT`` (the anchors written once: CDSL's draft passes alternate
    between a few small counts)."""

    def __init__(self, matrix: Int8Matrix) -> None:
        self.matrix = matrix
        self.padded: dict[torch.Size, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        if shape.numel() > _TOKENS_KEPT:  # a prompt: its buffer would hold memory for nothing
            return self.matrix(x)
        padded = self.padded.pop(shape, None)
        if padded is None:
            padded = self.matrix.padded_like(x)
            if len(self.padded) >= _SHAPES_KEPT:
                del self.padded[next(iter(self.padded))]  # the least recently used
        self.padded[shape] = padded
        return self.matrix(x, padded)


class Int8Forward:
    """A ragged step of a token-scaled int8 Llama-shaped model: ``__call__(ids, positions, kept,
    plan, cache)`` writes each layer's keys and values into ``cache`` at the plan's slots and
    positions and returns the kept positions' logits ``[1, kept, vocab]``."""

    def __init__(self, model: Any) -> None:
        inner, config = model.model, _text_config(model)
        self.embedding = inner.embed_tokens.weight
        self.layers = [_layer(layer) for layer in inner.layers[:config.num_hidden_layers]]
        self.norm, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.head = _Matmul(model.lm_head.matrix)
        self.inv_freq = inner.rotary_emb.inv_freq
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = float(inner.layers[0].self_attn.scaling)
        self.intermediate = config.intermediate_size

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, kept: torch.Tensor, plan: StepPlan,
                 cache: Any) -> torch.Tensor:
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        tokens = ids.shape[1]
        queries, keys_end = heads * dim, (heads + kv_heads) * dim
        cos, sin = self._rotary(positions)
        masked_gqa = masked_gqa_safe(ids.device)
        hidden = torch.nn.functional.embedding(ids, self.embedding)
        for index, layer in enumerate(self.layers):
            x = _rms_norm(hidden, layer.attention_norm, layer.attention_eps)
            qkv = layer.qkv(x)
            rotated = qkv[..., :keys_end].view(1, tokens, heads + kv_heads, dim).transpose(1, 2)
            rotated = rotated * cos + rotated.roll(dim // 2, -1) * sin
            query, key = rotated[:, :heads], rotated[:, heads:]
            value = qkv[..., keys_end:].view(1, tokens, kv_heads, dim).transpose(1, 2)
            attended = self._attend(index, layer.window, query, key, value, plan, cache, masked_gqa)
            hidden.add_(layer.out(attended.view(1, tokens, queries)))
            x = _rms_norm(hidden, layer.mlp_norm, layer.mlp_eps)
            gate_up = layer.gate_up(x)
            gated = torch.nn.functional.silu(gate_up[..., :self.intermediate]) * gate_up[..., self.intermediate:]
            hidden.add_(layer.down(gated))
        hidden = _rms_norm(hidden[:, kept], self.norm, self.norm_eps)
        return self.head(hidden)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and ``sin`` of ``positions`` ``[1, N]`` as the model's rotary embedding makes them,
        ``[1, 1, N, dim]``, the first half of ``sin`` negated (``rotate_half`` folded into it)."""
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos() * self.rope_scaling, angles.sin() * self.rope_scaling
        sin[..., :sin.shape[-1] // 2].neg_()
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def _attend(self, index: int, window: int | None, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                plan: StepPlan, cache: Any, masked_gqa: bool) -> torch.Tensor:
        """Write layer ``index``'s new keys and values, attend each row on its own; ``[N, heads * dim]``."""
        keys, values = cache.layer(index, key)
        rows = plan.long_rows
        if len(rows) <= 2:
            for slot, first, count, length, _ in rows:
                keys[slot, :, length - count:length] = key[0, :, first:first + count]
                values[slot, :, length - count:length] = value[0, :, first:first + count]
        else:
            keys[plan.slots, :, plan.positions] = key[0].transpose(0, 1)
            values[plan.slots, :, plan.positions] = value[0].transpose(0, 1)
        group = self.heads // self.kv_heads
        parts = []
        for slot, first, count, length, causal in rows:
            sliding = within_window(causal, window)
            parts.append(row_attention(query[:, :, first:first + count], keys[slot:slot + 1, :, :length],
                                       values[slot:slot + 1, :, :length], causal if sliding is None else sliding,
                                       self.scale, group, masked_gqa, windowed=sliding is not None)[0].transpose(0, 1))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.reshape(out.shape[0], -1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm of a float32 ``x``, op for op (``torch.rms_norm`` may fuse them on
    another CPU or torch, and a fused sum rounds otherwise)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def int8_forward(model: Any) -> Int8Forward | None:
    """An ``Int8Forward`` for ``model`` where it qualifies (module docstring), else None."""
    if os.environ.get("CDSL_INT8_FORWARD", "") == "0" or not _qualifies(model):
        return None
    return Int8Forward(model)


def _qualifies(model: Any) -> bool:
    config = _text_config(model)
    if getattr(config, "model_type", None) not in INT8_FORWARD_MODEL_TYPES:
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") not in _PLAIN_ROPE or getattr(config, "hidden_act", None) != "silu":
        return False
    inner = getattr(model, "model", None)
    if inner is None or not isinstance(getattr(model, "lm_head", None), TokenScaledInt8Linear):
        return False
    try:
        for layer in inner.layers[:config.num_hidden_layers]:
            _layer(layer)
        return float(inner.layers[0].self_attn.scaling) > 0 and inner.rotary_emb.inv_freq is not None
    except (AttributeError, IndexError, ValueError):
        return False


def _layer(layer: Any) -> _Layer:
    attention, mlp = layer.self_attn, layer.mlp
    return _Layer(layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon),
                  _shared(attention.q_proj, attention.k_proj, attention.v_proj), _shared(attention.o_proj),
                  layer.post_attention_layernorm.weight, float(layer.post_attention_layernorm.variance_epsilon),
                  _shared(mlp.gate_proj, mlp.up_proj), _shared(mlp.down_proj), _window(attention))


def _window(attention: Any) -> int | None:
    """An attention module's sliding window, as its forward hands it to the attention function: its
    own ``sliding_window`` (Qwen 2: None on full layers), else its config's (Mistral)."""
    if hasattr(attention, "sliding_window"):
        return attention.sliding_window or None
    return getattr(attention.config, "sliding_window", None) or None


def _shared(*members: Any) -> _Matmul:
    """The one int8 matrix ``members`` read side by side, in order; ValueError when they do not."""
    if not all(isinstance(m, TokenScaledInt8Linear) for m in members):
        raise ValueError("not token-scaled int8 layers")
    matrix, start = members[0].matrix, 0
    for member in members:
        if member.matrix is not matrix or member.span[0] != start:
            raise ValueError("projections not side by side in one int8 matrix")
        start = member.span[1]
    if start != matrix.out_features:
        raise ValueError("the int8 matrix holds more than these projections")
    return _Matmul(matrix)


def _text_config(model: Any) -> Any:
    return getattr(model.config, "get_text_config", lambda: model.config)()
