"""Attention of a ragged step: the grouped rows in a few batched matmuls (or SDPA), each long row
on its own (``ragged_attention``), the custom op a compiled step calls it through
(``ragged_attend``), the attention implementation a ragged runner's model is switched to
(``RAGGED_ATTENTION``: ``attention``) and which models can take it (``supports_ragged``)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import CdslError
from .attention import DECODE_ATTENTION, decode_attention, ragged_step, row_attention, within_window
from .ragged_plan import StepPlan

#: model types whose attention runs through the attention interface and the cache's ``update``,
#: each checked against solo runs (tests/models/test_ragged.py)
RAGGED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")

#: the attention implementation a ragged runner's model runs under: ragged attention inside a
#: ragged step, ``decode_attention`` (transformers' SDPA for most calls) outside one
RAGGED_ATTENTION = "cdsl_ragged"

#: the keyword under which a static step (``runners``) hands each layer's attention its device-side
#: metadata, through the model's forward (transformers passes unknown keywords down to attention)
STATIC_STEP = "cdsl_static"

_step = ragged_step  # ``plan``, ``attend`` and ``cache`` while a ragged step runs on this thread


def ragged_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     scaling: float | None, window: int | None = None) -> torch.Tensor:
    """Attention of a ragged step: ``query`` ``[1, heads, N, dim]``, ``key``/``value`` a layer's
    ``SlotCache`` buffers (this step's tokens already written); returns ``[1, N, heads, dim]``.
    ``window``: the layer's sliding window (a query at position q sees q - window < p <= q), or None."""
    plan: StepPlan = _step.plan
    if (key.shape[0], key.shape[2]) != plan.cache_shape:
        # checked on the host before any index op: on CUDA an out-of-range index is a device-side
        # assert that ends every later CUDA call of the process, past any fallback
        raise CdslError(f"ragged attention got keys of {key.shape[0]} rows x {key.shape[2]} positions where the "
                        f"runner's cache holds {plan.cache_shape[0]} x {plan.cache_shape[1]}: the model's layers "
                        "did not write through the runner's cache")
    heads, tokens, dim = query.shape[1], query.shape[2], query.shape[3]
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    out = query.new_empty((tokens, heads, dim))
    if plan.grouped_rows:
        rows, width = plan.grouped_rows, plan.grouped_width
        if plan.grouped_queries is None:  # [heads, rows * width, dim]
            queries = query[0, :, :rows * width]
        else:
            queries = query[0].index_select(1, plan.grouped_queries)
        # head h = kv * group + g, as repeat_kv: a key/value head's queries are the rows of one matmul
        grouped = queries.view(kv_heads, group, rows, width, dim).permute(2, 0, 1, 3, 4)
        grouped = grouped.reshape(rows * kv_heads, group * width, dim)
        # whole rows of the buffer, spare positions masked: a slice along the positions would be copied
        if plan.grouped_slots is None:
            keys, values = key[:rows], value[:rows]
        else:
            keys, values = key.index_select(0, plan.grouped_slots), value.index_select(0, plan.grouped_slots)
        length = keys.shape[2]
        bias = _grouped_bias(plan, kv_heads, group, grouped.dtype, window)
        keys, values = keys.view(rows * kv_heads, length, dim), values.view(rows * kv_heads, length, dim)
        if grouped_by_sdpa(query.device):
            # one "head" per (row, key/value head): a mask, and no ``enable_gqa`` beside it
            attended = torch.nn.functional.scaled_dot_product_attention(
                grouped.unsqueeze(1), keys.unsqueeze(1), values.unsqueeze(1), attn_mask=bias.unsqueeze(1),
                scale=scale).squeeze(1)
        else:
            # the mask as an additive bias and the scale folded into the matmul: one op instead of four
            scores = torch.baddbmm(bias, grouped, keys.transpose(1, 2), alpha=scale)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
            attended = torch.bmm(probs, values)
        attended = attended.view(rows, heads, width, dim).transpose(1, 2).reshape(rows * width, heads, dim)
        real = attended if plan.grouped_real is None else attended.index_select(0, plan.grouped_real)
        if plan.grouped_tokens is None:
            out = real
        else:
            out[plan.grouped_tokens] = real
    for slot, first, count, length, causal in plan.long_rows:
        sliding = within_window(causal, window)
        row_query, row_keys = query[:, :, first:first + count], key[slot:slot + 1, :, :length]
        row_values = value[slot:slot + 1, :, :length]
        if count == 1 and query.dtype == torch.bfloat16 and query.device.type == "cpu":
            # one bfloat16 query takes a slow SDPA kernel on the CPU (164 us against 29 us in float32
            # at 270 positions)
            row_query, row_keys, row_values = row_query.float(), row_keys.float(), row_values.float()
        attended = row_attention(row_query, row_keys, row_values, causal if sliding is None else sliding, scale,
                                 group, masked_gqa=masked_gqa_safe(query.device), windowed=sliding is not None)
        out[first:first + count] = attended[0].transpose(0, 1).to(out.dtype)
    return out.unsqueeze(0)


def grouped_by_sdpa(device: torch.device) -> bool:
    """Whether the grouped rows attend through SDPA rather than the scores matmul with the mask
    folded in (the CPU's: faster there). The matmul writes its scores in the model's dtype: in
    bfloat16 on an H100 the ragged runner's logits were 1.28 from the model's own forward, over
    twice what the model's own cached decoding differs by, and it failed its self-check; SDPA's
    kernels keep the scores in float32."""
    return device.type != "cpu"


def masked_gqa_safe(device: torch.device) -> bool:
    """Whether SDPA takes a mask together with ``enable_gqa`` on ``device`` (the CPU: checked by the
    tests against solo runs; see ``row_attention``)."""
    return device.type == "cpu"


#: the attribute of an attention module holding its layer's index as a tensor (``layer_number``)
LAYER_NUMBER = "_cdsl_layer"


def layer_number(module: Any) -> torch.Tensor:
    """``module.layer_idx`` as a 0-d tensor kept on the module: a compiled layer (``models.compiled``
    compiles one decoder layer for all) takes it as an input, so one graph serves every layer."""
    number = getattr(module, LAYER_NUMBER, None)
    if number is None:
        number = torch.tensor(int(module.layer_idx))
        module.__dict__[LAYER_NUMBER] = number
    return number


@torch.library.custom_op("cdsl_struct::ragged_attend", mutates_args=())
def ragged_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: torch.Tensor,
                  scaling: float, window: int = 0) -> torch.Tensor:
    """Write layer ``layer``'s new keys and values into the running step's ``SlotCache`` and attend by its
    plan (``ragged_attention``; ``window``: its sliding window, 0 for none): ``[1, heads, N, dim]``
    queries -> ``[1, N, heads, dim]``. Opaque to the compiler (``models.compiled``): the cache and the
    plan are read from the step's thread-local state."""
    keys, values = _step.cache.update(key, value, int(layer))
    return ragged_attention(None, query, keys, values, scaling, window or None)


@ragged_attend.register_fake
def _ragged_attend_shape(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: torch.Tensor,
                         scaling: float, window: int = 0) -> torch.Tensor:
    return query.new_empty((1, query.shape[2], query.shape[1], query.shape[3]))


def _grouped_bias(plan: StepPlan, kv_heads: int, group: int, dtype: torch.dtype,
                  window: int | None = None) -> torch.Tensor:
    """The step's grouped mask as a ``[A * kv_heads, group * W, capacity]`` additive bias (cached on the
    plan), with what a sliding ``window`` hides hidden too."""
    window = window if window and plan.grouped_length > window else 0
    bias = plan.grouped_bias.get((kv_heads, group, dtype, window))
    if bias is None:
        mask = plan.grouped_mask  # [A, 1, W, capacity]
        if window:
            positions = torch.arange(mask.shape[-1], device=mask.device)
            mask = mask & (positions[None, None, :] > plan.grouped_limit[:, :, None] - window).unsqueeze(1)
        rows, width, length = mask.shape[0], mask.shape[2], mask.shape[3]
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
        bias = bias.unsqueeze(2).expand(rows, kv_heads, group, width, length).reshape(rows * kv_heads,
                                                                                       group * width, length)
        plan.grouped_bias[(kv_heads, group, dtype, window)] = bias
    return bias


def supports_ragged(model: Any) -> bool:
    """Whether ``model`` can run ragged steps: a decoder of a checked family, no soft-capping, and
    every layer's attention through SDPA or this package's functions (layers shared with another
    model, as a self-draft's are, keep that model's config: it must be one of ours too)."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    if getattr(config, "model_type", None) not in RAGGED_MODEL_TYPES:
        return False
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
        return False
    ours = (DECODE_ATTENTION, RAGGED_ATTENTION)
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", *ours):
        return False
    return all(getattr(module.config, "_attn_implementation", None) in ours
               for module in model.modules() if module is not model and hasattr(module, "config")
               and module.config is not model.config and module.config is not config)


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The ``RAGGED_ATTENTION`` implementation (transformers' signature): ``static_attention`` in a
    static step (``runners``), ``ragged_attention`` in a ragged step, ``decode_attention`` otherwise."""
    static = kwargs.get(STATIC_STEP)
    window = kwargs.get("sliding_window") or None  # what the model's sliding layers hand their attention
    if static is not None:  # a static step's own attention (``runners.attention.StaticAttention``)
        return static.attend(module, query, key, value, scaling, window), None
    # a compiled step's forward (``models.compiled``): traced, or any part of it dynamo runs eagerly
    compiling = torch.compiler.is_dynamo_compiling() or getattr(_step, "cache", None) is not None
    if not compiling and getattr(_step, "plan", None) is None:  # a forward outside a ragged step
        return decode_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)
    if dropout or kwargs.get("softcap") or getattr(module, "sinks", None) is not None:
        raise CdslError("ragged attention does not do dropout, soft-capping or attention sinks")
    if not torch.compiler.is_dynamo_compiling() and getattr(_step, "cache", None) is not None:
        _step.ran_eagerly = True  # a compiled step that no graph fitted (``CompiledForward.misses``)
    if compiling:  # the cache write and the attention, opaque to the compiler
        scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
        return ragged_attend(query, key, value, layer_number(module), scale, int(window or 0)), None
    return ragged_attention(module, query, key, value, scaling, window), None


def use_ragged_attention(model: Any) -> None:
    """Register ``attention`` (with SDPA's mask function for calls outside a ragged step) and switch
    ``model`` to it; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(RAGGED_ATTENTION, attention)
    AttentionMaskInterface.register(RAGGED_ATTENTION, sdpa_mask)
    for module in model.modules():
        if isinstance(getattr(module, "layer_idx", None), int):
            layer_number(module)  # made now, outside any trace
    if model.config._attn_implementation != RAGGED_ATTENTION:
        model.set_attn_implementation(RAGGED_ATTENTION)
