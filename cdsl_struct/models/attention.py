"""Attention for the decode and speculation steps of a bfloat16 batch on the CPU, registered with transformers.

transformers' SDPA path runs a decode step (one query per row, or a few under speculation)
through ``scaled_dot_product_attention``; in bfloat16 on the CPU that dispatches to the flash
kernel, which splits the work into tasks of one row and one key/value head and, at 16-32 rows of a
few hundred positions, spends ~0.5-1.2 ms a layer on a few MFLOPs with one query (30-45% of the
step) and 1.6-5 ms with 2-8 (more than the rest of the step). With a few queries per row the
attention is two small batched matmuls, a half to a quarter of that cost (below ``MIN_WORK`` rows
x queries x positions SDPA's kernel is the cheaper one and stays), when they read contiguous
keys and values: the query heads sharing a key/value head are the rows of one matmul (no
``repeat_kv`` copy), padding is masked, softmax runs in float32 (as transformers' eager attention
does). A ``GrowingLayer`` hands attention a leading slice of a buffer with spare positions, which
the matmuls would copy; so the step reads the whole buffer, its spare positions masked (they hold
zeros or a rolled-back row's old keys, never garbage).

Every other call goes to transformers' own SDPA function unchanged: float32 (the exactness tests'
dtype, where the kernels cost the same), more than ``MAX_QUERIES`` queries (prompts), dropout,
soft-capped logits, attention sinks, non-CPU devices. ``use_decode_attention(model)`` switches a
loaded model over; masks are built as for SDPA.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

#: the name the attention function and its mask function are registered under in transformers
DECODE_ATTENTION = "cdsl_decode_sdpa"

#: rows x queries x positions below which SDPA stays, its fixed cost being lower there. Tuned on
#: single steps of SmolLM2 on a 2-core Zen 4 (1-12 rows of 120-500 positions: SDPA 1-4% faster;
#: 8 x 525, 16 x 225, 24 x 220: these matmuls 4-10% faster); reported on the serve bench instead.
MIN_WORK = 3000
#: queries per row up to which the matmuls replace SDPA (speculation's widths; prompts stay on SDPA)
MAX_QUERIES = 16


#: set by ``models.ragged`` on its thread for the length of a ragged step: ``attend`` (its attention
#: function) and ``plan``; any layer calling ``decode_attention`` then attends the ragged way (a
#: self-draft's layers are the target's, and keep the target's attention implementation)
ragged_step = threading.local()


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query`` (batch, heads, q, dim), ``key``/``value``
    (batch, kv_heads, length, dim), a boolean ``attention_mask`` (batch, 1, q, length), True where a
    query attends, or None; returns (batch, q, heads, dim)."""
    attend = getattr(ragged_step, "attend", None)
    if attend is not None:
        return attend(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    batch, heads, q_length, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    keys = values = None
    if (q_length <= MAX_QUERIES and batch * q_length * length >= MIN_WORK and query.dtype == torch.bfloat16
            and query.device.type == "cpu" and not dropout and not kwargs.get("softcap") and heads % kv_heads == 0
            and getattr(module, "sinks", None) is None and _plain_mask(attention_mask, q_length, length)):
        keys, values = _whole_buffer(key), _whole_buffer(value)
    if keys is None or values is None or keys.shape[2] != values.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    capacity, group = keys.shape[2], heads // kv_heads
    attend = torch.zeros((attention_mask.shape[0] if attention_mask is not None else 1, 1, q_length, capacity),
                         dtype=torch.bool)
    attend[..., :length] = attention_mask if attention_mask is not None else True
    # head h = kv * group + g, as repeat_kv: a key/value head's queries are the rows of one matmul
    grouped = query.reshape(batch, kv_heads, group * q_length, dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)) * (dim ** -0.5 if scaling is None else scaling)
    scores = scores.view(batch, kv_heads, group, q_length, capacity)
    scores = scores.masked_fill(~attend.unsqueeze(2), torch.finfo(scores.dtype).min)  # finite: no NaN for an empty row
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    out = torch.matmul(probs.view(batch, kv_heads, group * q_length, capacity), values)
    return out.view(batch, heads, q_length, dim).transpose(1, 2).contiguous(), None


def _plain_mask(mask: torch.Tensor | None, q_length: int, length: int) -> bool:
    """A boolean (rows, 1, queries, positions) mask, or none for a single query (nothing to hide:
    several queries without a mask mean SDPA's implicit causal mask, left to SDPA)."""
    if mask is None:
        return q_length == 1
    return mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[-2:] == (q_length, length)


def _whole_buffer(states: torch.Tensor) -> torch.Tensor | None:
    """``states`` itself when contiguous; when it is a leading slice (along the positions) of a
    contiguous ``[rows, heads, capacity, dim]`` buffer, that buffer, read from its strides (views made
    under inference mode do not keep their ``_base``); else None."""
    if states.is_contiguous():
        return states
    rows, heads, length, dim = states.shape
    row_stride, head_stride, position_stride, dim_stride = states.stride()
    if dim_stride != 1 or position_stride != dim or head_stride % dim:
        return None
    capacity = head_stride // dim
    if capacity < length or row_stride != heads * head_stride:
        return None
    needed = (states.storage_offset() + rows * row_stride) * states.element_size()
    if states.untyped_storage().nbytes() < needed:
        return None
    return states.as_strided((rows, heads, capacity, dim), states.stride())


def within_window(causal: torch.Tensor, window: int | None) -> torch.Tensor | None:
    """A row's ``causal`` mask (``[count, length]``: its last ``count`` queries over its ``length``
    positions) with what a sliding window of ``window`` positions hides hidden too (a query at
    position q sees q - window < p <= q, as transformers' sliding layers); None where it hides nothing."""
    count, length = causal.shape
    if not window or length <= window:
        return None
    return causal & ~torch.ones_like(causal).tril(length - count - window)


def row_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, causal: torch.Tensor,
                  scale: float, group: int, masked_gqa: bool, windowed: bool = False) -> torch.Tensor:
    """One row's attention: ``query`` ``[1, heads, count, dim]`` (its last ``count`` positions) over
    ``keys``/``values`` ``[1, kv_heads, length, dim]``, ``causal`` its ``[count, length]`` mask.

    ``masked_gqa``: SDPA with the mask and ``enable_gqa`` (the CPU's path). Elsewhere that pairing is
    not safe: on CUDA it crashed (``output with shape [1, 9, 1, 1] doesn't match the broadcast shape
    [1, 9, 1, 45]``, torch 2.11), and transformers never sends a mask with ``enable_gqa`` there
    either. So without it a mask goes only where one is needed: one query sees every position (no
    mask), a prompt with nothing before it is plain causal (``is_causal``), and only queries after
    held positions get the mask, over key/value heads expanded to the query heads. ``windowed``:
    ``causal`` hides keys a sliding window leaves out (``within_window``), so it always applies."""
    count, length = query.shape[2], keys.shape[2]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if masked_gqa:
        # one query sees every position: no mask, which SDPA would otherwise turn into a float mask
        # every call (bitwise the same: a mask of zeros adds nothing); most draft rows are such rows
        mask = None if count == 1 and not windowed else causal
        return sdpa(query, keys, values, attn_mask=mask, scale=scale, enable_gqa=group > 1)
    if not windowed and (count == 1 or count == length):
        return sdpa(query, keys, values, is_causal=count > 1, scale=scale, enable_gqa=group > 1)
    if group > 1:
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    return sdpa(query, keys, values, attn_mask=causal.view(1, 1, count, length), scale=scale)


def register_decode_attention() -> None:
    """Register ``decode_attention`` (and SDPA's mask function under the same name); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


def use_decode_attention(model: Any) -> bool:
    """Switch ``model`` to ``decode_attention`` where it runs transformers' SDPA now; whether it did."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    register_decode_attention()
    model.set_attn_implementation(DECODE_ATTENTION)
    return True
