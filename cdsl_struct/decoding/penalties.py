"""Presence and frequency penalties (OpenAI's), applied to a row's logits before its mask.

For every position the target scores, a token already in the output (the committed tokens and
the proposed ones before that position) loses ``presence`` once and ``frequency`` per use. The
constraint's mask is applied after, so a penalty never admits a token the constraint forbids;
speculative verification compares the penalised distributions, so it stays exact for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Penalties:
    """``presence`` and ``frequency`` penalties, each in [-2, 2] as in OpenAI's API."""

    presence: float = 0.0
    frequency: float = 0.0

    def __post_init__(self) -> None:
        for name in ("presence", "frequency"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name}_penalty must be in [-2, 2], got {value}")

    @property
    def active(self) -> bool:
        return bool(self.presence or self.frequency)

    def apply(self, logits: torch.Tensor, output: Sequence[int], proposed: Sequence[int]) -> None:
        """Penalise ``logits`` in place: row ``i`` scores the position after ``proposed[:i]``."""
        counts = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        if output:
            ids = torch.tensor(list(output), device=logits.device)
            counts.index_add_(0, ids, torch.ones(len(output), dtype=logits.dtype, device=logits.device))
        for i in range(logits.shape[0]):
            if i:
                counts[proposed[i - 1]] += 1
            logits[i] -= self.frequency * counts + self.presence * (counts > 0).to(logits.dtype)
