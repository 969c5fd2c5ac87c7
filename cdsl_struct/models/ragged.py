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
``SlotCache`` (``models.slot_cache``; per layer ``[slots, kv_heads, capacity, dim]``), its tokens at
positions ``0..len`` (left-aligned): a step writes each new token's keys and values at its row's next positions, a
rejected speculation is cropped by shortening the row (no holes), a row leaving moves the last
slot into its place (one row's copy), a fork copies one row. Attention (``ragged_attention``,
through transformers' attention interface) gathers the queries of the rows that feed a few tokens
into ``[rows, width]``, attends over their slots (whole rows of the buffer, each masked to its
row's length), and runs each row that feeds a long prompt on its own (``models.ragged_attention``;
where each token goes and how the rows group: a ``StepPlan``, ``models.ragged_plan``).

The model must call its attention through transformers' ``AttentionInterface`` and its cache
through ``cache.update``; the families checked (Llama, Mistral, Qwen 2 and 3, Gemma 3) are listed
in ``RAGGED_MODEL_TYPES`` (``supports_ragged``); others use ``BatchRunner``. A sliding-window layer
(Gemma 3's local layers, Mistral's, Qwen's where set) attends within its window, as the model's own
forward does: its masks hide what the window leaves out (the cache still holds every position).
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ..errors import CdslError
from .attention import ragged_step
from .batch import Feed, check_feeds, kv_bytes_per_token, reusable_prefix
from .compat import cache_keyword
from .compiled import CompiledForward, warm
from .device import model_device
from .int8 import token_scaled
from .int8_forward import int8_forward
from .prefix_cache import PrefixCache
from .ragged_attention import (
    RAGGED_ATTENTION,
    RAGGED_MODEL_TYPES,
    attention,
    grouped_by_sdpa,
    masked_gqa_safe,
    ragged_attend,
    ragged_attention,
    supports_ragged,
    use_ragged_attention,
)
from .ragged_plan import GROUPED_QUERIES, SOLO_ROWS, StepPlan, plan_step
from .slot_cache import MIN_SPARE_POSITIONS, MIN_SPARE_ROWS, SlotCache

__all__ = ["GROUPED_QUERIES", "MIN_SPARE_POSITIONS", "MIN_SPARE_ROWS", "RAGGED_ATTENTION", "RAGGED_MODEL_TYPES",
           "SOLO_ROWS", "Feed", "RaggedRunner", "SlotCache", "StepPlan", "attention", "grouped_by_sdpa",
           "masked_gqa_safe", "plan_step", "ragged_attend", "ragged_attention", "supports_ragged",
           "use_ragged_attention"]

_step = ragged_step  # ``plan``, ``attend`` and ``cache`` while a ragged step runs on this thread


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

    ``rows_alone``: every row attends on its own in every step (``plan_step``), as it would in a step
    of its own; by default, where the model's linear layers are token-scaled int8 (``models.int8``),
    whose rows do not depend on their batch either: a row's logits are then bitwise the same in any
    batch (int8 rounding would turn the grouped attention's float-order differences into different
    drafts). Elsewhere the grouped attention is cheaper.
    """

    #: no padding in the fed tokens, and a joining row's prompt rides in the step's own pass
    ragged = True

    def __init__(self, model: Any, name: str = "target", pad_token_id: int = 0,
                 prefix_cache_bytes: int = 256 * 2**20, rows_alone: bool | None = None) -> None:
        if not supports_ragged(model):
            raise CdslError(f"{type(model).__name__} cannot run ragged steps; use BatchRunner")
        use_ragged_attention(model)
        self.model = model
        self.cache_keyword = cache_keyword(model)
        self.name = name
        self.pad_token_id = pad_token_id
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.rows_alone = token_scaled(model) if rows_alone is None else rows_alone
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
        self.int8 = int8_forward(model) if self.rows_alone and token_scaled(model) else None
        """The int8 self-draft's own step (``models.int8_forward``), or None: the model's forward."""
        self.shared: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        """Prefixes prefilled in a pass of their own (``share_prefix``) and their keys and values."""

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
        if not self.order:
            self._idle()

    def _idle(self) -> None:
        """The last row left: an idle runner holds no cache."""
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
        plan, ids, positions, kept, offsets = plan_step(self.order, self.tokens, tails, keeps,
                                                        self.cache, self.device, self.rows_alone)
        if self.int8 is not None and self.compiled is None and not plan.grouped_rows:
            logits = self.int8(ids.to(self.device), positions, kept, plan, self.cache)
        else:
            logits = self._model_forward(plan, ids, positions, kept)
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
        return logits[0].float(), offsets

    def _model_forward(self, plan: StepPlan, ids: torch.Tensor, positions: torch.Tensor,
                       kept: torch.Tensor) -> torch.Tensor:
        """The model's own forward (compiled where ``compile`` was called) over a planned step: the
        kept logits ``[1, kept, vocab]``."""
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
        return out.logits

    # --- joining --------------------------------------------------------------------------------

    @torch.inference_mode()
    def share_prefix(self, tokens: Sequence[int]) -> None:
        """Prefill ``tokens`` once, in a pass of their own: a row whose prompt starts with them then
        copies their keys and values whole and feeds only the rest.

        For a runner without a prefix cache, the int8 self-draft's: a prompt's keys depend by float
        rounding on the chunk they were computed in (SDPA's blocks follow its length), which int8
        rounding turns into other drafts, so that runner reuses no prompt another request computed.
        Keys of a prefix always computed alone are the same for every row, in any order or batch,
        so rows that share it stay as deterministic as before. A runner with a prefix cache finds
        shared prefixes by itself: there this does nothing."""
        key = tuple(tokens)
        if self.prefixes is not None or len(key) < 2 or key in self.shared:
            return
        child = RaggedRunner(self.model, self.name, self.pad_token_id, prefix_cache_bytes=0,
                             rows_alone=self.rows_alone)
        child.run([Feed(0, list(key), 1)])
        self.shared[key] = child.row_kv(0)
        for counter in ("passes", "positions", "padded_positions", "prefilled_positions", "seconds"):
            setattr(self, counter, getattr(self, counter) + getattr(child, counter))

    def _shared_prefix(self, body: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest of ``shared`` that ``body`` starts with: its length and keys and values, or (0, None)."""
        best = max((key for key in self.shared if len(key) <= len(body) and tuple(body[:len(key)]) == key),
                   key=len, default=None)
        return (0, None) if best is None else (len(best), self.shared[best])

    def _join(self, feeds: list[Feed]) -> list[tuple[Hashable, list[int], int]]:
        """Give each new row a slot holding the longest stored prefix of its sequence (but the last
        ``keep`` tokens); the rest it feeds in the step's pass. Each row's (row, prompt body, reused)."""
        bodies = [f.sequence[:len(f.sequence) - f.keep] for f in feeds]
        if self.prefixes is not None and len(bodies) > 1:
            self._store_shared_prefix(bodies)
        self._reserve(self.rows + len(feeds), max(len(f.sequence) for f in feeds))
        joined = []
        for feed, body in zip(feeds, bodies, strict=True):
            reused, kv = self.prefixes.lookup(body) if self.prefixes is not None else self._shared_prefix(body)
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
        child = RaggedRunner(self.model, self.name, self.pad_token_id, prefix_cache_bytes=0,
                             rows_alone=self.rows_alone)
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
