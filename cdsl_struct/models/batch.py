"""``BatchRunner``: one model, one padded KV cache shared by many rows, one forward per step.

Layout: the cache holds ``[rows, heads, L, dim]`` per layer; every row owns all ``L`` physical
positions, and a boolean ``valid[row, position]`` says which of them hold the row's tokens. A
row that feeds fewer tokens than the longest feed of a step is left-padded with invalid
positions; a rejected speculation is cropped by marking its positions invalid (a hole). Holes
and padding are excluded by the attention mask, and each row's position ids count only its
valid positions, so a row sees exactly what it would see alone. Holes cost memory, not
correctness: when they outgrow the valid tokens, ``compact`` gathers every row's valid
positions to the right end.

Rows join (their prompts prefilled together in one padded pass, then merged into the batch)
and leave between steps. Sliding-window attention layers are treated as full layers: exact
while rows stay within the window, which holds for the prompts and outputs this library
decodes with the shipped models (Gemma-3-270M: 512 tokens).
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CdslError
from .compat import cache_keyword, returned_cache
from .device import model_device
from .growing_cache import growing_cache
from .prefix_cache import PrefixCache

#: padding columns a batch may carry beyond twice its longest row before ``compact`` drops them
COMPACT_SLACK = 32


@dataclass
class Feed:
    """What a row wants from one step: logits of the last ``keep`` positions of ``sequence``.

    ``parent``: a row this one starts from when it is new (its cache is copied, not prefilled):
    how a decoder branches one sequence into several, e.g. CDLH's roll-outs of each candidate.
    """

    row: Hashable
    sequence: list[int]
    keep: int = 1
    parent: Hashable | None = None


def check_feeds(feeds: Sequence[Feed]) -> None:
    """Refuse a step's feeds that feed a row twice or keep more logits than they feed."""
    if len({f.row for f in feeds}) != len(feeds):
        raise CdslError("a row can be fed once per pass")
    for feed in feeds:
        if feed.keep < 1 or len(feed.sequence) < feed.keep:
            raise CdslError(f"row {feed.row!r}: keep must be in [1, len(sequence)]")


def reusable_prefix(held: Sequence[int], feed: Feed) -> int:
    """How many of the ``held`` tokens a row keeps for ``feed``: the prefix they share with its
    sequence, leaving at least ``keep`` tokens to feed."""
    common, limit = 0, min(len(held), len(feed.sequence) - feed.keep)
    if held[:limit] == feed.sequence[:limit]:  # the usual case, compared in C
        return limit
    while common < limit and held[common] == feed.sequence[common]:
        common += 1
    return common


def padded_reserve(sequences: int, longest: int) -> int:
    """Positions a padded cache may hold for ``sequences`` rows of at most ``longest`` tokens: every
    row at the physical length, which holes may stretch to twice the longest (plus the slack)
    before ``BatchRunner`` compacts."""
    return sequences * (2 * longest + COMPACT_SLACK)


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of keys and values one position of ``model`` costs, over all layers."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * heads * head_dim * element


class BatchRunner:
    """Batched forward passes over many growing sequences with one padded KV cache.

    ``run(feeds)`` reuses each row's cached prefix, crops what the row no longer holds (rejected
    speculation), feeds the rest of every row in ONE forward pass (new rows are prefilled in one
    pass before it) and returns each row's logits on the model's device: views of one
    ``[rows x keep, vocab]`` tensor, the caller's to change in place (``last_flat``: that tensor and
    where each feed's rows start in it). ``release(row)`` drops
    a row. Counters: ``passes``, ``positions`` (real tokens fed), ``padded_positions`` (fed
    including padding), ``prefilled_positions`` (prompt positions computed), ``seconds``.
    """

    #: rows are padded to the step's widest feed, and joining rows are prefilled in a pass of their own
    ragged = False
    #: why the engine runs this runner where the ragged one was wanted (its load-time self-check
    #: failed: ``models.self_check``), or None
    fallback_reason: str | None = None

    def __init__(self, model: Any, name: str = "target", pad_token_id: int = 0,
                 prefix_cache_bytes: int = 256 * 2**20) -> None:
        self.model = model
        self.cache_keyword = cache_keyword(model)
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.name = name
        self.device = model_device(model)
        self.pad_token_id = pad_token_id
        self.cache: Any = None
        self.order: list[Hashable] = []  # batch index -> row
        self.slots: dict[Hashable, list[int]] = {}  # physical positions holding the row's tokens, in order
        self.tokens: dict[Hashable, list[int]] = {}
        self.valid = torch.zeros((0, 0), dtype=torch.bool)  # on the CPU; copied once per pass
        self.passes = 0
        self.positions = 0
        self.padded_positions = 0
        self.prefilled_positions = 0  # prompt positions computed (not copied from the prefix cache)
        self.attended_slots = 0  # rows x cache length over the step passes: what attention reads
        self.attended_valid = 0  # of those, slots holding a row's own token (the rest: padding, holes)
        self.seconds = 0.0
        self.last_prefill_seconds = 0.0
        self.last_positions = 0  # padded positions of the last step's pass (prefill excluded)
        self.last_fed: dict[Hashable, int] = {}  # real positions each row fed in the last run's step pass
        self.last_flat: tuple[torch.Tensor, list[int]] | None = None  # the last run's logits, feeds' starts
        self.last_prefilled: dict[Hashable, int] = {}  # positions the last run prefilled for its new rows

    # --- state --------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        return len(self.order)

    @property
    def physical_length(self) -> int:
        return int(self.valid.shape[1])

    def held(self, row: Hashable) -> list[int]:
        """The tokens the cache holds for ``row`` (empty for an unknown row)."""
        return list(self.tokens.get(row, []))

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one position costs, over all layers."""
        return kv_bytes_per_token(self.model)

    @staticmethod
    def reserved_positions(sequences: int, longest: int) -> int:
        """Positions the cache may hold for ``sequences`` rows of at most ``longest`` tokens."""
        return padded_reserve(sequences, longest)

    # --- rows joining and leaving -------------------------------------------------------------

    def release(self, *rows: Hashable) -> None:
        """Forget ``rows`` (unknown ones are ignored) and free their part of the cache, in one copy."""
        gone = {row for row in rows if row in self.slots}
        if not gone:
            return
        keep = [i for i, row in enumerate(self.order) if row not in gone]
        self.order = [self.order[i] for i in keep]
        for row in gone:
            del self.slots[row], self.tokens[row]
        if not self.order:
            self.cache, self.valid = None, torch.zeros((0, 0), dtype=torch.bool)
            return
        chosen = torch.tensor(keep, device=self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, chosen)
            layer.values = layer.values.index_select(0, chosen)
        self.valid = self.valid[keep]
        self._trim_left()

    def fork(self, pairs: Sequence[tuple[Hashable, Hashable]]) -> None:
        """Add a row per ``(parent, child)`` pair holding a copy of the parent's cache (its tokens,
        keys and values at the same physical positions)."""
        for _, child in pairs:
            if child in self.slots:
                raise CdslError(f"row {child!r} already exists")
        indices = [self.order.index(parent) for parent, _ in pairs]
        chosen = torch.tensor(indices, device=self.device)
        for layer in self.cache.layers:
            layer.keys = torch.cat([layer.keys, layer.keys.index_select(0, chosen)])
            layer.values = torch.cat([layer.values, layer.values.index_select(0, chosen)])
        self.valid = torch.cat([self.valid, self.valid[indices]])
        for parent, child in pairs:
            self.order.append(child)
            self.slots[child] = list(self.slots[parent])
            self.tokens[child] = list(self.tokens[parent])

    def crop(self, row: Hashable, length: int) -> None:
        """Keep only the first ``length`` tokens of ``row`` (the rest become holes)."""
        slots = self.slots[row]
        if length >= len(slots):
            return
        index = self.order.index(row)
        self.valid[index, slots[length:]] = False
        del slots[length:]
        del self.tokens[row][length:]

    # --- forward ------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, feeds: Sequence[Feed]) -> list[torch.Tensor]:
        """Float32 logits ``[keep, vocab]`` for each feed, from one forward over every row.

        Each row's cache is cropped to the longest prefix it shares with its sequence while
        leaving at least ``keep`` tokens to feed. Rows of the batch that are not fed this step
        take padding only.
        """
        if not feeds:
            return []
        check_feeds(feeds)
        forks = [f for f in feeds if f.row not in self.slots and f.parent in self.slots]
        if forks:
            self.fork([(f.parent, f.row) for f in forks])
        new = [f for f in feeds if f.row not in self.slots]
        self.last_prefill_seconds = 0.0
        self.last_prefilled = {f.row: len(f.sequence) - f.keep for f in new}
        if new:
            started = time.perf_counter()
            self._prefill(new)
            self.last_prefill_seconds = time.perf_counter() - started
        tails: dict[Hashable, list[int]] = {}
        for feed in feeds:
            common = reusable_prefix(self.tokens[feed.row], feed)
            self.crop(feed.row, common)
            tails[feed.row] = feed.sequence[common:]
        self._trim_right()
        width = max(len(t) for t in tails.values())
        keep = max(f.keep for f in feeds)
        logits = self._forward([tails.get(row, []) for row in self.order], width, keep)
        self.last_positions = self.rows * width
        self.last_fed = {row: len(tail) for row, tail in tails.items()}
        starts = [self.order.index(feed.row) * keep + keep - feed.keep for feed in feeds]
        flat = logits.reshape(-1, logits.shape[-1])  # the views below are of this tensor, whichever it is
        self.last_flat = (flat, starts)
        self._maybe_compact()
        return [flat[start:start + feed.keep] for start, feed in zip(starts, feeds, strict=True)]

    def _forward(self, tails: list[list[int]], width: int, keep: int) -> torch.Tensor:
        """Feed every row its tail, right-aligned in ``width`` columns; logits of the last ``keep``."""
        start = time.perf_counter()
        rows, base = self.rows, self.physical_length
        ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        fresh = torch.zeros((rows, width), dtype=torch.bool)
        positions = torch.zeros((rows, width), dtype=torch.long)
        for index, tail in enumerate(tails):
            if not tail:
                continue
            row, pad = self.order[index], width - len(tail)
            ids[index, pad:] = torch.tensor(tail, dtype=torch.long)
            fresh[index, pad:] = True
            held = len(self.slots[row])
            positions[index, pad:] = torch.arange(held, held + len(tail))
            self.slots[row].extend(range(base + pad, base + width))
            self.tokens[row].extend(tail)
        self.valid = torch.cat([self.valid, fresh], dim=1)
        if bool(self.valid.all()):  # no padding and no holes: every row's positions are its physical ones
            mask = position_ids = None
        else:
            mask, position_ids = self.valid.to(self.device, torch.long), positions.to(self.device)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask, position_ids=position_ids,
                         **{self.cache_keyword: self.cache}, use_cache=True, logits_to_keep=keep)
        self.cache = returned_cache(out)
        self.passes += 1
        self.positions += sum(len(t) for t in tails)
        self.padded_positions += rows * width
        self.attended_slots += self.valid.numel()
        self.attended_valid += int(self.valid.sum())
        self.seconds += time.perf_counter() - start
        return out.logits.float()

    def _prefill(self, feeds: list[Feed]) -> None:
        """Add the rows of ``feeds``: each starts from the longest stored prefix of its sequence (but
        the last ``keep`` tokens), the rest is fed in one padded pass of the new rows alone, and the
        result is merged into the batch (the shorter side padded on the left)."""
        bodies = [f.sequence[:len(f.sequence) - f.keep] for f in feeds]
        if self.prefixes is not None and len(bodies) > 1:
            self._store_shared_prefix(bodies)
        seeds = [self.prefixes.lookup(body) if self.prefixes else (0, None) for body in bodies]
        child = BatchRunner(self.model, self.name, self.pad_token_id, prefix_cache_bytes=0)
        child._seed([f.row for f in feeds], bodies, seeds)
        rest = [body[reused:] for body, (reused, _) in zip(bodies, seeds, strict=True)]
        self.prefilled_positions += sum(len(r) for r in rest)
        width = max(len(r) for r in rest)
        if width:
            child._forward(rest, width, 1)
        if self.prefixes is not None:
            for feed, body, (reused, _) in zip(feeds, bodies, seeds, strict=True):
                if len(body) > reused:
                    self.prefixes.store(body, child.row_kv(feed.row))
        self._count(child)
        self._absorb(child)

    def _store_shared_prefix(self, bodies: list[list[int]], least: int = 8) -> None:
        """Prefill the prefix all ``bodies`` share once (one row) and store it, so that rows joining
        together copy it instead of each computing it."""
        shared = os.path.commonprefix(bodies)
        if len(shared) < least or self.prefixes.lookup(shared)[0] == len(shared):
            return
        child = BatchRunner(self.model, self.name, self.pad_token_id, prefix_cache_bytes=0)
        child._seed([0], [shared], [self.prefixes.lookup(shared)])
        reused = len(child.tokens[0])
        child._forward([shared[reused:]], len(shared) - reused, 1)
        self.prefilled_positions += len(shared) - reused
        self.prefixes.store(shared, child.row_kv(0))
        self._count(child)

    def _count(self, child: BatchRunner) -> None:
        """Add the passes a helper runner made for this one to its counters."""
        self.passes += child.passes
        self.positions += child.positions
        self.padded_positions += child.padded_positions
        self.seconds += child.seconds

    def _seed(self, rows: list[Hashable], bodies: list[list[int]], seeds: list[tuple[int, Any]]) -> None:
        """Start an empty runner with ``rows`` holding their reused prefixes (left-padded to the longest)."""
        length = max(reused for reused, _ in seeds)
        self.order = list(rows)
        self.valid = torch.zeros((len(rows), length), dtype=torch.bool)
        self.cache = growing_cache()
        for index, (row, body, (reused, _)) in enumerate(zip(rows, bodies, seeds, strict=True)):
            self.slots[row] = list(range(length - reused, length))
            self.tokens[row] = list(body[:reused])
            self.valid[index, length - reused:] = True
        if length == 0:
            return
        model_kv = next(kv for _, kv in seeds if kv is not None)
        for layer, (like, _) in enumerate(model_kv):
            padded = [_seed_rows(kv, layer, length, like) for _, kv in seeds]
            self.cache.update(torch.cat([k for k, _ in padded]), torch.cat([v for _, v in padded]), layer)

    def row_kv(self, row: Hashable) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of ``row``'s keys and values, per layer ``[1, heads, tokens, dim]``, in token order."""
        index = self.order.index(row)
        slots = torch.tensor(self.slots[row], device=self.device)
        return [(layer.keys[index:index + 1].index_select(2, slots),
                 layer.values[index:index + 1].index_select(2, slots)) for layer in self.cache.layers]

    def _absorb(self, child: BatchRunner) -> None:
        """Append ``child``'s rows (a runner on the same model) to this batch."""
        if not self.order:
            self.cache, self.valid, self.order = child.cache, child.valid, child.order
            self.slots, self.tokens = child.slots, child.tokens
            return
        length = max(self.physical_length, child.physical_length)
        if length > self.physical_length:
            self._pad_left(length - self.physical_length)
        shift = length - child.physical_length
        child_layers = child.cache.layers if child.cache is not None else []
        for index, layer in enumerate(self.cache.layers):
            if index < len(child_layers) and child_layers[index].keys is not None and child_layers[index].keys.numel():
                keys = _pad_positions(child_layers[index].keys, shift)
                values = _pad_positions(child_layers[index].values, shift)
            else:
                shape = (child.rows, layer.keys.shape[1], length, layer.keys.shape[-1])
                keys, values = layer.keys.new_zeros(shape), layer.values.new_zeros(shape)
            layer.keys = torch.cat([layer.keys, keys], dim=0)
            layer.values = torch.cat([layer.values, values], dim=0)
        pad = torch.zeros((child.rows, shift), dtype=torch.bool)
        self.valid = torch.cat([self.valid, torch.cat([pad, child.valid], dim=1)], dim=0)
        for row in child.order:
            self.order.append(row)
            self.slots[row] = [p + shift for p in child.slots[row]]
            self.tokens[row] = child.tokens[row]

    def _pad_left(self, count: int) -> None:
        """Prepend ``count`` invalid positions to every row."""
        for layer in self.cache.layers:
            layer.keys, layer.values = _pad_positions(layer.keys, count), _pad_positions(layer.values, count)
        self.valid = torch.cat([torch.zeros((self.rows, count), dtype=torch.bool), self.valid], dim=1)
        for row in self.order:
            self.slots[row] = [p + count for p in self.slots[row]]

    def _trim_left(self) -> None:
        """Drop leading positions no row uses."""
        used = self.valid.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else self.physical_length
        if first == 0:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        self.valid = self.valid[:, first:]
        for row in self.order:
            self.slots[row] = [p - first for p in self.slots[row]]

    def _trim_right(self) -> None:
        """Drop trailing positions no row uses (a lone row's rejected speculation leaves no hole)."""
        used = self.valid.any(dim=0).nonzero()
        end = int(used[-1]) + 1 if len(used) else 0
        if end == self.physical_length or self.cache is None:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, :end], layer.values[:, :, :end]
        self.valid = self.valid[:, :end]

    def _maybe_compact(self) -> None:
        longest = max((len(s) for s in self.slots.values()), default=0)
        if self.physical_length > 2 * longest + COMPACT_SLACK:
            self.compact()

    def compact(self) -> None:
        """Gather every row's valid positions to the right end; the cache shrinks to the longest row."""
        if not self.order:
            return
        length = max(len(s) for s in self.slots.values())
        index = torch.zeros((self.rows, length), dtype=torch.long)
        valid = torch.zeros((self.rows, length), dtype=torch.bool)
        for b, row in enumerate(self.order):
            slots = self.slots[row]
            if slots:
                index[b, length - len(slots):] = torch.tensor(slots)
                valid[b, length - len(slots):] = True
            self.slots[row] = list(range(length - len(slots), length))
        index = index.to(self.device)
        for layer in self.cache.layers:
            gather = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, gather)
            layer.values = layer.values.gather(2, gather)
        self.valid = valid


def _seed_rows(kv: Any, layer: int, length: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's reused keys and values of ``layer`` left-padded to ``length`` (zeros without a prefix)."""
    if kv is None:
        shape = (1, like.shape[1], length, like.shape[3])
        return like.new_zeros(shape), like.new_zeros(shape)
    keys, values = kv[layer]
    return _pad_positions(keys, length - keys.shape[2]), _pad_positions(values, length - values.shape[2])


def _pad_positions(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """``tensor`` ``[rows, heads, L, dim]`` with ``count`` zero positions prepended."""
    if count == 0:
        return tensor
    shape = (tensor.shape[0], tensor.shape[1], count, tensor.shape[3])
    return torch.cat([tensor.new_zeros(shape), tensor], dim=2)
