"""``PrefixCache``: keys and values of recently prefilled prompts, reused by rows that start the same way.

Requests to one model share long prefixes (the chat template's system prompt, a tool list, an
instruction); a causal model's keys and values at a position depend only on the tokens up to
it, so a new row copies the longest prefix it shares with a stored prompt and prefills only the
rest. Entries are whole prompt bodies; a lookup takes the longest common prefix over all of them
(any length, not only blocks). Least recently used entries go first once ``max_bytes`` is
exceeded.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence

import torch

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values ``[1, heads, positions, dim]``."""


class PrefixCache:
    """Stored prompt prefixes and their per-layer keys and values."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], LayerKV] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.reused_positions = 0

    def lookup(self, tokens: Sequence[int]) -> tuple[int, LayerKV | None]:
        """The longest stored prefix of ``tokens``: its length and its keys and values (sliced)."""
        best, best_key = 0, None
        tokens = tuple(tokens)
        for key in self.entries:
            common = len(os.path.commonprefix([key, tokens]))
            if common > best:
                best, best_key = common, key
        if best_key is None:
            return 0, None
        self.entries.move_to_end(best_key)
        self.hits += 1
        self.reused_positions += best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in self.entries[best_key]]

    def cached_length(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` a lookup would reuse (no side effects: not counted as a hit)."""
        key = tuple(tokens)
        return max((len(os.path.commonprefix([stored, key])) for stored in self.entries), default=0)

    def store(self, tokens: Sequence[int], kv: LayerKV) -> None:
        """Keep ``kv`` (the keys and values of ``tokens``, tensors of their own) unless a stored entry
        already covers it."""
        key = tuple(tokens)
        if not key or self.max_bytes <= 0:
            return
        for stored in list(self.entries):
            if stored[:len(key)] == key:
                return  # an entry at least as long holds this prefix
            if key[:len(stored)] == stored:
                self._drop(stored)  # superseded by the longer prompt
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if size > self.max_bytes:
            return
        self.entries[key] = kv
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def clear(self) -> None:
        """Forget every stored prefix (the hit counters keep running)."""
        self.entries.clear()
        self.bytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        kv = self.entries.pop(key)
        self.bytes -= sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
