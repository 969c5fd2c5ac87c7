"""Choosing tokens from masked logits: greedy, temperature, top-p, and the distributions that
speculative sampling compares."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import torch

from ..constraints.mask import apply_bitmask

#: temperatures below this are greedy: dividing logits by less overflows them to inf (and the
#: distribution to nan), and the sample is the argmax in all but name (vLLM draws the line here too)
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` below ``MIN_TEMPERATURE`` (0 included) means greedy. ``top_p`` keeps the
    smallest nucleus of that mass (always at least the most likely token). ``seed``: any integer
    (OpenAI does not bound it); it is taken modulo 2**64, the range of torch's generators, so
    every seed gives its own reproducible stream."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    def generator(self, device: Any = "cpu") -> torch.Generator:
        """A generator of this request's own on ``device``: seeded by ``seed``, else from the OS's
        entropy. The global RNG is never read or reseeded."""
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed % 2**64 if self.seed is not None else secrets.randbits(63))
        return gen


def masked_logits(logits: torch.Tensor, mask_row: torch.Tensor) -> torch.Tensor:
    """A masked copy of 1-D ``logits`` (disallowed -> -inf)."""
    return apply_bitmask(logits.clone(), mask_row)


def distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature and top-p, from already-masked logits."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        outside[..., 0] = False  # a top_p below float32's smallest number would drop even the first
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs /= probs.sum()
    return probs


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Argmax when greedy, else a sample from ``distribution``."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(distribution(logits, params), 1, generator=generator))
