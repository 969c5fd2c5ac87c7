"""``RaggedRunner``: one forward per step over every row's new tokens, with no padding anywhere but attention.

The padded ``BatchRunner`` feeds a ``[rows, width]`` block: a row with one token to feed is padded
to the widest feed of the step, a joining row's prompt is prefilled in a pass of its own, and the
cache aligns rows on the right, so rows joining and leaving copy the whole cache and shorter rows
are left-padded in it. Under a mixed load that was a separate forward for ~40% of the steps (118
prefill passes of ~11 new positions each in a 200-request run) and half of the KV slots attention
read were padding.

Here every row's new tokens are laid end to end in one ``[1, N]`` sequence, as vLLM and
transformers' continuous batching do: the linear layers (most of the step) see only real tokens,
and a joining row's prompt rides in the same pass as the decoding rows. Each row owns one slot of a
``SlotCache`` (per layer ``[slots, kv_heads, capacity, dim]``), its tokens at positions ``0..len``
(left-aligned): a step writes each new token's keys and values at its row's next positions, a
rejected speculation is cropped by shortening the row (no holes), a row leaving moves the last
slot into its place (one row's copy), a fork copies one row. Attention (``ragged_attention``,
through transformers' attention interface) gathers the queries of the rows that feed a few tokens
into ``[rows, width]``, attends over their slots (whole rows of the buffer, each masked to its
row's length), and runs each row that feeds a long prompt on its own.

The model must call its attention through transformers' ``AttentionInterface`` and its cache
through ``cache.update``; the families checked (Llama, Mistral, Qwen 2 and 3, Gemma 3) are listed
in ``RAGGED_MODEL_TYPES`` (``supports_ragged``); others use ``BatchRunner``. Sliding-window layers
are treated as full layers, as in ``BatchRunner``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CdslError
from .attention import DECODE_ATTENTION, decode_attention, ragged_step, row_attention
from .batch import Feed, check_feeds, kv_bytes_per_token, reusable_prefix
from .compat import cache_keyword
from .compiled import CompiledForward, warm
from .device import model_device
from .prefix_cache import PrefixCache

#: queries a row may feed and still share the step's grouped attention; longer feeds (prompts)
#: attend on their own
GROUPED_QUERIES = 16
#: a step of at most this many rows attends row by row (SDPA on each row's slot): at one or two
#: rows that is cheaper than the grouped matmuls' fixed cost
SOLO_ROWS = 2
#: spare positions a grown ``SlotCache`` gets (an eighth of what it needs, at least this many: the
#: grouped attention reads them all) and spare rows (a quarter, at least this many)
MIN_SPARE_POSITIONS = 16
MIN_SPARE_ROWS = 4
#: model types whose attention runs through the attention interface and the cache's ``update``,
#: each checked against solo runs (tests/models/test_ragged.py)
RAGGED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")

#: the attention implementation a ragged runner's model runs under: ragged attention inside a
#: ragged step, ``decode_attention`` (transformers' SDPA for most calls) outside one
RAGGED_ATTENTION = "cdsl_ragged"

_step = ragged_step  # ``plan``, ``attend`` and ``cache`` while a ragged step runs on this thread


@dataclass
class StepPlan:
    """Where a ragged step's tokens go: their slots and positions, and how attention groups them."""

    slots: torch.Tensor
    """``[N]`` the slot of each fed token."""
    positions: torch.Tensor
    """``[N]`` its position in its row."""
    grouped_slots: torch.Tensor | None
    """``[A]`` slots of the rows that feed at most ``GROUPED_QUERIES`` tokens (None: slots ``0..A-1``)."""
    grouped_rows: int
    grouped_queries: torch.Tensor | None
    """``[A * W]`` the flat token each padded query reads (padding reads token 0; None: tokens
    ``0..A*W-1`` in order)."""
    grouped_width: int
    grouped_length: int
    """The longest grouped row after this step."""
    grouped_valid: int
    """Positions the grouped rows hold after this step (of the ``rows x capacity`` attention reads)."""
    grouped_mask: torch.Tensor | None
    """``[A, 1, W, capacity]`` True where a query attends (the cache's capacity: attention reads
    whole rows of the buffer)."""
    grouped_real: torch.Tensor | None
    """Indices into the ``A * W`` padded queries of the real ones, in flat-token order (None: all of them)."""
    grouped_tokens: torch.Tensor | None
    """The flat tokens of the grouped rows, in order (None: all of them)."""
    long_rows: list[tuple[int, int, int, int, torch.Tensor]]
    """``(slot, first flat token, tokens, row length after the step, causal mask)`` of each row that
    attends on its own (a prompt, or every row of a step of at most ``SOLO_ROWS`` rows)."""
    cache_shape: tuple[int, int] = (0, 0)
    """The ``SlotCache``'s (slots, capacity) this step: what each layer's keys must have."""
    grouped_bias: dict[tuple[int, int, torch.dtype], torch.Tensor] = field(default_factory=dict)
    """``grouped_mask`` as the additive bias of the scores matmul (0 or the dtype's lowest), made
    by the first layer that attends and shared by the rest: ``(kv_heads, group, dtype)`` -> ``[A * kv_heads,
    group * W, capacity]``."""


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
        plan: StepPlan = _step.plan
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


def ragged_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     scaling: float | None) -> torch.Tensor:
    """Attention of a ragged step: ``query`` ``[1, heads, N, dim]``, ``key``/``value`` a layer's
    ``SlotCache`` buffers (this step's tokens already written); returns ``[1, N, heads, dim]``."""
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
        bias = _grouped_bias(plan, kv_heads, group, grouped.dtype)
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
        row_query, row_keys = query[:, :, first:first + count], key[slot:slot + 1, :, :length]
        row_values = value[slot:slot + 1, :, :length]
        if count == 1 and query.dtype == torch.bfloat16 and query.device.type == "cpu":
            # one bfloat16 query takes a slow SDPA kernel on the CPU (164 us against 29 us in float32
            # at 270 positions)
            row_query, row_keys, row_values = row_query.float(), row_keys.float(), row_values.float()
        attended = row_attention(row_query, row_keys, row_values, causal, scale, group,
                                 masked_gqa=masked_gqa_safe(query.device))
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


@torch.library.custom_op("cdsl_struct::ragged_attend", mutates_args=())
def ragged_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: int,
                  scaling: float) -> torch.Tensor:
    """Write a layer's new keys and values into the running step's ``SlotCache`` and attend by its
    plan (``ragged_attention``): ``[1, heads, N, dim]`` queries -> ``[1, N, heads, dim]``.
    Opaque to the compiler (``models.compiled``): the cache and the plan are read from the step's
    thread-local state."""
    keys, values = _step.cache.update(key, value, layer)
    return ragged_attention(None, query, keys, values, scaling)


@ragged_attend.register_fake
def _ragged_attend_shape(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: int,
                         scaling: float) -> torch.Tensor:
    return query.new_empty((1, query.shape[2], query.shape[1], query.shape[3]))


def _grouped_bias(plan: StepPlan, kv_heads: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    """The step's grouped mask as a ``[A * kv_heads, group * W, capacity]`` additive bias (cached on the plan)."""
    bias = plan.grouped_bias.get((kv_heads, group, dtype))
    if bias is None:
        mask = plan.grouped_mask  # [A, 1, W, capacity]
        rows, width, length = mask.shape[0], mask.shape[2], mask.shape[3]
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
        bias = bias.unsqueeze(2).expand(rows, kv_heads, group, width, length).reshape(rows * kv_heads,
                                                                                       group * width, length)
        plan.grouped_bias[(kv_heads, group, dtype)] = bias
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
    """The ``RAGGED_ATTENTION`` implementation (transformers' signature): ``ragged_attention`` in a
    ragged step, ``decode_attention`` otherwise."""
    # a compiled step's forward (``models.compiled``): traced, or any part of it dynamo runs eagerly
    compiling = torch.compiler.is_compiling() or getattr(_step, "cache", None) is not None
    if not compiling and getattr(_step, "plan", None) is None:  # a forward outside a ragged step
        return decode_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)
    if dropout or kwargs.get("softcap") or getattr(module, "sinks", None) is not None:
        raise CdslError("ragged attention does not do dropout, soft-capping or attention sinks")
    if compiling:  # the cache write and the attention, opaque to the compiler
        scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
        return ragged_attend(query, key, value, module.layer_idx, scale), None
    return ragged_attention(module, query, key, value, scaling), None


def use_ragged_attention(model: Any) -> None:
    """Register ``attention`` (with SDPA's mask function for calls outside a ragged step) and switch
    ``model`` to it; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(RAGGED_ATTENTION, attention)
    AttentionMaskInterface.register(RAGGED_ATTENTION, sdpa_mask)
    if model.config._attn_implementation != RAGGED_ATTENTION:
        model.set_attn_implementation(RAGGED_ATTENTION)


class RaggedRunner:
    """Batched forward passes over many growing sequences, no padding: the ``BatchRunner`` interface
    (``run``, ``release``, ``fork``, ``crop``, ``held``, the counters) on a ``SlotCache``.

    ``run(feeds)`` reuses each row's cached prefix, crops what the row no longer holds, and feeds
    every row's rest, new rows' prompts included, in ONE forward pass. Its logits are views of one
    ``[kept positions, vocab]`` tensor, the caller's to change in place; ``last_flat`` holds that
    tensor and where each feed's rows start in it. Counters: ``passes``,
    ``positions`` (tokens fed; ``padded_positions`` equals it), ``prefilled_positions`` (prompt
    positions computed, not copied from the prefix cache), ``seconds``, ``attended_slots``
    and ``attended_valid`` (KV slots attention read, and those holding a row's token).
    """

    #: no padding in the fed tokens, and a joining row's prompt rides in the step's own pass
    ragged = True

    def __init__(self, model: Any, name: str = "target", pad_token_id: int = 0,
                 prefix_cache_bytes: int = 256 * 2**20) -> None:
        if not supports_ragged(model):
            raise CdslError(f"{type(model).__name__} cannot run ragged steps; use BatchRunner")
        use_ragged_attention(model)
        self.model = model
        self.cache_keyword = cache_keyword(model)
        self.name = name
        self.pad_token_id = pad_token_id
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.device = model_device(model)
        self.cache = SlotCache(getattr(model.config, "get_text_config", lambda: model.config)().num_hidden_layers)
        self.order: list[Hashable] = []  # slot -> row
        self.tokens: dict[Hashable, list[int]] = {}
        self.passes = 0
        self.positions = 0
        self.padded_positions = 0
        self.prefilled_positions = 0  # prompt positions computed (not copied from the prefix cache)
        self.attended_slots = 0
        self.attended_valid = 0
        self.seconds = 0.0
        self.last_prefill_seconds = 0.0
        self.last_positions = 0
        self.last_fed: dict[Hashable, int] = {}
        self.last_flat: tuple[torch.Tensor, list[int]] | None = None  # the last run's logits, feeds' starts
        self.last_prefilled: dict[Hashable, int] = {}
        self.compiled: CompiledForward | None = None
        self.vocab_size: int = getattr(model.config, "get_text_config", lambda: model.config)().vocab_size

    def compile(self, warm_up: bool = True) -> float:
        """Run this runner's steps through ``torch.compile`` from now on (``models.compiled``), and
        with ``warm_up`` compile them now, on throw-away rows; seconds the warm-up took."""
        if self.compiled is None:
            self.compiled = CompiledForward(self.model)
        return warm(self) if warm_up else 0.0

    # --- state --------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        return len(self.order)

    @property
    def physical_length(self) -> int:
        """The longest row: how far the grouped attention reads."""
        return max((len(t) for t in self.tokens.values()), default=0)

    def held(self, row: Hashable) -> list[int]:
        """The tokens the cache holds for ``row`` (empty for an unknown row)."""
        return list(self.tokens.get(row, []))

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one position costs, over all layers."""
        return kv_bytes_per_token(self.model)

    @staticmethod
    def reserved_positions(sequences: int, longest: int) -> int:
        """Positions the slot cache may hold for ``sequences`` rows of at most ``longest`` tokens: a
        slot per row and the spare ones, each as long as the longest row and its spare room
        (``SlotCache.reserve``), not the padded cache's twice the longest."""
        return SlotCache.grown(sequences, MIN_SPARE_ROWS) * SlotCache.grown(longest, MIN_SPARE_POSITIONS, 8)

    # --- rows joining and leaving -------------------------------------------------------------

    @torch.inference_mode()
    def release(self, *rows: Hashable) -> None:
        """Forget ``rows`` (unknown ones are ignored); the last slots move into the freed ones."""
        for row in rows:
            if row not in self.tokens:
                continue
            slot, last = self.order.index(row), len(self.order) - 1
            if slot != last:
                moved = self.order[last]
                self.cache.copy_row(last, slot, len(self.tokens[moved]))
                self.order[slot] = moved
            self.order.pop()
            del self.tokens[row]
        if not self.order:  # an idle runner holds no cache
            self.cache = SlotCache(len(self.cache.keys))

    @torch.inference_mode()
    def fork(self, pairs: Sequence[tuple[Hashable, Hashable]]) -> None:
        """Add a row per ``(parent, child)`` pair holding a copy of the parent's cache."""
        for _, child in pairs:
            if child in self.tokens:
                raise CdslError(f"row {child!r} already exists")
        self._reserve(self.rows + len(pairs), 0)
        for parent, child in pairs:
            self.order.append(child)
            self.tokens[child] = list(self.tokens[parent])
            self.cache.copy_row(self.order.index(parent), len(self.order) - 1, len(self.tokens[child]))

    def crop(self, row: Hashable, length: int) -> None:
        """Keep only the first ``length`` tokens of ``row``."""
        del self.tokens[row][length:]

    def _reserve(self, rows: int, length: int) -> None:
        """Size the cache for ``rows`` rows and positions up to ``length`` or the longest row held."""
        self.cache.reserve(rows, max(length, self.physical_length))

    def row_kv(self, row: Hashable) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of ``row``'s keys and values, per layer ``[1, heads, tokens, dim]``."""
        return self.cache.read_row(self.order.index(row), len(self.tokens[row]))

    # --- forward ------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, feeds: Sequence[Feed]) -> list[torch.Tensor]:
        """Float32 logits ``[keep, vocab]`` for each feed, from one forward over every fed row's tokens."""
        if not feeds:
            return []
        check_feeds(feeds)
        forks = [f for f in feeds if f.row not in self.tokens and f.parent in self.tokens]
        if forks:
            self.fork([(f.parent, f.row) for f in forks])
        new = [f for f in feeds if f.row not in self.tokens]
        self.last_prefill_seconds = 0.0
        joined = self._join(new) if new else []  # may run a pass for a shared prefix: last_prefill_seconds
        tails: dict[Hashable, list[int]] = {}
        for feed in feeds:
            common = reusable_prefix(self.tokens[feed.row], feed)
            self.crop(feed.row, common)
            tails[feed.row] = feed.sequence[common:]
        keeps = {f.row: f.keep for f in feeds}
        self.last_prefilled = {f.row: len(tails[f.row]) - f.keep for f in new}
        self.prefilled_positions += sum(self.last_prefilled.values())
        self.last_fed = {row: len(tail) - self.last_prefilled.get(row, 0) for row, tail in tails.items()}
        logits, offsets = self._forward(tails, keeps)
        self.last_positions = sum(len(t) for t in tails.values())
        if self.prefixes is not None:
            for row, body, reused in joined:
                if len(body) > reused:
                    self.prefixes.store(body, self.cache.read_row(self.order.index(row), len(body)))
        self.last_flat = (logits, [offsets[f.row] for f in feeds])
        return [logits[offsets[f.row]:offsets[f.row] + f.keep] for f in feeds]

    def _forward(self, tails: dict[Hashable, list[int]], keeps: dict[Hashable, int]) -> tuple[torch.Tensor, dict]:
        """Feed each row of ``tails`` its tokens in one ``[1, N]`` pass; the kept logits (float32,
        ``[sum of keeps, vocab]``) and where each row's start in them."""
        start = time.perf_counter()
        plan, ids, positions, kept, offsets = self._plan(tails, keeps)
        _step.plan, _step.attend = plan, attention
        inputs = {"input_ids": ids.to(self.device), "position_ids": positions,
                  "attention_mask": _NO_MASK.get(self.device), "logits_to_keep": kept}
        try:
            out = None
            # the model gets no cache: its layers write ours in ``ragged_attend``; an id past the
            # vocabulary would abort the process in a compiled embedding, eager raises IndexError
            if self.compiled is not None and (not ids.numel() or int(ids.max()) < self.vocab_size):
                _step.cache = self.cache  # out None: the compiled forward failed, run eagerly
                out = self.compiled(**{self.cache_keyword: None}, use_cache=False, **inputs)
                _step.cache = None
            if out is None:
                out = self.model(**{self.cache_keyword: self.cache}, use_cache=True, **inputs)
        finally:
            _step.plan = _step.attend = _step.cache = None
        for row, tail in tails.items():
            self.tokens[row].extend(tail)
        fed = sum(len(t) for t in tails.values())
        self.passes += 1
        self.positions += fed
        self.padded_positions += fed
        solo = sum(length for _, _, _, length, _ in plan.long_rows)
        self.attended_slots += plan.grouped_rows * self.cache.length + solo
        self.attended_valid += plan.grouped_valid + solo
        self.seconds += time.perf_counter() - start
        return out.logits[0].float(), offsets

    def _plan(self, tails: dict[Hashable, list[int]], keeps: dict[Hashable, int]) -> tuple[Any, ...]:
        """The step's flat inputs and its ``StepPlan``, rows in slot order."""
        ids: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        kept: list[int] = []
        offsets: dict[Hashable, int] = {}
        grouped: list[tuple[int, int, int, int]] = []  # slot, first flat token, count, held before
        long_rows = []
        longest = 0
        solo = sum(1 for tail in tails.values() if tail) <= SOLO_ROWS
        for slot, row in enumerate(self.order):
            tail = tails.get(row)
            if not tail:
                continue
            held, first = len(self.tokens[row]), len(ids)
            ids.extend(tail)
            slots.extend([slot] * len(tail))
            positions.extend(range(held, held + len(tail)))
            offsets[row] = len(kept)
            kept.extend(range(len(ids) - keeps[row], len(ids)))
            longest = max(longest, held + len(tail))
            if len(tail) <= GROUPED_QUERIES and not solo:
                grouped.append((slot, first, len(tail), held))
            else:
                length = held + len(tail)
                causal = torch.ones((len(tail), length), dtype=torch.bool).tril(held).to(self.device)
                long_rows.append((slot, first, len(tail), length, causal))
        self._reserve(self.rows, longest)
        device = self.device
        width = max((count for _, _, count, _ in grouped), default=0)
        length = max((held + count for _, _, count, held in grouped), default=0)
        queries, real = [], []
        for index, (_, first, count, _) in enumerate(grouped):
            queries.extend(range(first, first + count))
            queries.extend([0] * (width - count))
            real.extend(range(index * width, index * width + count))
        mask = None
        if grouped:
            held = torch.tensor([h for *_, h in grouped])
            limit = held[:, None] + torch.arange(width)[None, :]  # query w of a row sees positions <= held + w
            mask = (torch.arange(self.cache.length)[None, None, :] <= limit[:, :, None]).unsqueeze(1).to(device)
        in_order = all(slot == index for index, (slot, *_) in enumerate(grouped))
        grouped_tokens = None
        if long_rows and grouped:
            grouped_tokens = torch.tensor([t for _, first, count, _ in grouped for t in range(first, first + count)],
                                          device=device)
        plan = StepPlan(
            slots=torch.tensor(slots, device=device), positions=torch.tensor(positions, device=device),
            grouped_slots=None if in_order else torch.tensor([s for s, *_ in grouped], device=device),
            grouped_rows=len(grouped), grouped_queries=_unless_in_order(queries, device, len(queries)),
            grouped_width=width, grouped_length=length, grouped_valid=sum(h + c for _, _, c, h in grouped),
            grouped_mask=mask,
            grouped_real=_unless_in_order(real, device, len(queries)), grouped_tokens=grouped_tokens,
            long_rows=long_rows, cache_shape=(self.cache.rows, self.cache.length))
        return (plan, torch.tensor([ids]), torch.tensor([positions], device=device),
                torch.tensor(kept, device=device), offsets)

    # --- joining --------------------------------------------------------------------------------

    def _join(self, feeds: list[Feed]) -> list[tuple[Hashable, list[int], int]]:
        """Give each new row a slot holding the longest stored prefix of its sequence (but the last
        ``keep`` tokens); the rest it feeds in the step's pass. Each row's (row, prompt body, reused)."""
        bodies = [f.sequence[:len(f.sequence) - f.keep] for f in feeds]
        if self.prefixes is not None and len(bodies) > 1:
            self._store_shared_prefix(bodies)
        self._reserve(self.rows + len(feeds), max(len(f.sequence) for f in feeds))
        joined = []
        for feed, body in zip(feeds, bodies, strict=True):
            reused, kv = self.prefixes.lookup(body) if self.prefixes is not None else (0, None)
            self.order.append(feed.row)
            self.tokens[feed.row] = list(body[:reused])
            if kv is not None:
                self.cache.write_row(len(self.order) - 1, kv)
            joined.append((feed.row, body, reused))
        return joined

    def _store_shared_prefix(self, bodies: list[list[int]], least: int = 8) -> None:
        """Compute the prefix all ``bodies`` share once (in a runner and a pass of its own, so this
        batch never holds a row that is not a caller's) and store it, so that rows joining together
        copy it instead of each computing it."""
        shared = os.path.commonprefix(bodies)
        if len(shared) < least or self.prefixes.cached_length(shared) == len(shared):
            return
        started = time.perf_counter()
        child = RaggedRunner(self.model, self.name, self.pad_token_id, prefix_cache_bytes=0)
        child.compiled = self.compiled
        child.tokens[0], child.order = [], [0]
        reused, kv = self.prefixes.lookup(shared)
        if kv is not None:
            child._reserve(1, len(shared))
            child.cache.write_row(0, kv)
            child.tokens[0] = list(shared[:reused])
        child.run([Feed(0, list(shared), 1)])
        self.prefixes.store(shared, child.row_kv(0))
        for counter in ("passes", "positions", "padded_positions", "prefilled_positions", "seconds"):
            setattr(self, counter, getattr(self, counter) + getattr(child, counter))
        self.prefilled_positions += len(shared) - reused - child.prefilled_positions
        self.last_prefill_seconds = time.perf_counter() - started


def _unless_in_order(indices: list[int], device: Any, total: int) -> torch.Tensor | None:
    """``indices`` as a tensor, or None when they are all of ``0..total-1`` in order (an index_select saved)."""
    if indices == list(range(total)):
        return None
    return torch.tensor(indices, dtype=torch.long, device=device)


class _NoMask:
    """A 4-D placeholder mask per device: transformers returns a 4-D mask as it is instead of
    building one, and ``ragged_attention`` masks by its plan."""

    def __init__(self) -> None:
        self.masks: dict[Any, torch.Tensor] = {}

    def get(self, device: Any) -> torch.Tensor:
        if device not in self.masks:
            self.masks[device] = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
        return self.masks[device]


_NO_MASK = _NoMask()
