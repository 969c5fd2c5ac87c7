"""Choosing tokens from masked logits: greedy, temperature, top-p, and the distributions that
speculative sampling compares."""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
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


def any_allowed(row: torch.Tensor) -> bool:
    """Whether masked logits ``row`` hold a finite value (a token the mask allows), as
    ``torch.isfinite(row).any()`` says, from the row's maximum where that settles it: a vocabulary's
    ``isfinite(...).any()`` took 70 us on one core, ``amax`` 3 us, and guards and roll-outs ask it of
    every position they touch."""
    top = float(row.amax())
    if math.isfinite(top):
        return True
    if top == -math.inf:
        return False
    return bool(torch.isfinite(row).any())  # +inf or NaN at the top: look at every value


def allowed_top(logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest of masked log-probabilities ``logp`` and their indices, less those the mask
    leaves out (fewer than ``k`` where fewer are allowed; none where none is), as ``torch.topk`` of
    ``min(k, allowed)`` gives them, without counting the allowed tokens of the whole vocabulary."""
    top = torch.topk(logp, min(k, logp.shape[-1]))
    kept = int(torch.isfinite(top.values).sum())
    return top.values[:kept], top.indices[:kept]


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


def speculative_verdict(masked: torch.Tensor, tokens: Sequence[int], draft_probs: Sequence[torch.Tensor | None],
                        params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Speculative sampling's verdict on a sampling row's proposed ``tokens``, computed where the logits
    are with no read back (the engine reads it with the step's choices, in its one transfer).

    ``masked``: the target's masked logits at each proposed position (``[len(tokens), vocab]``). Token
    ``i`` is accepted when ``u_i * q_i(x_i) < p_i(x_i)``, ``u_i`` uniform from the row's generator,
    ``p_i`` the target's distribution (temperature, top-p) and ``q_i`` the draft's (``draft_probs[i]``;
    a point mass where None: a token forced, looked up or drafted greedily), the test ``loop.verify``
    makes token by token. At the first rejected position a token is drawn, by Gumbel-max, from the
    normalised residual ``max(p - q, 0)`` (``p`` where that is empty); the position is picked on the
    device, so no draw waits for a read. Returns an int64 pair: how many tokens were accepted, and that
    draw (-1 where the position allows nothing; meaningless when all were accepted: the token after
    them is the step's own draw, ``draw_tokens``). The same distribution as ``loop.verify``'s, not the
    same draws."""
    count, device = len(tokens), masked.device
    scaled = masked[:count].float() / params.temperature
    if params.top_p < 1.0:
        scaled = _nucleus(scaled, params.top_p)
    ids = torch.tensor(tokens, dtype=torch.long).to(device, non_blocking=True)[:, None]
    # p_i(x_i) from the log-normaliser: no distribution over the vocabulary at every position
    p_tokens = torch.nan_to_num(torch.exp(scaled.gather(1, ids)[:, 0] - torch.logsumexp(scaled, dim=-1)), nan=0.0)
    q_tokens = torch.ones(count, device=device)
    drafted = [i for i, q in enumerate(draft_probs) if q is not None]
    if drafted:
        index = torch.tensor(drafted, dtype=torch.long).to(device, non_blocking=True)
        q_rows = torch.zeros((count, scaled.shape[-1]), device=device)
        q_rows[index] = torch.stack([draft_probs[i] for i in drafted]).to(device, torch.float32)
        q_tokens[index] = q_rows.gather(1, ids)[index, 0]
        sampled = torch.zeros(count, dtype=torch.bool, device=device)
        sampled[index] = True
    uniforms = torch.rand(count, generator=generator, device=device)
    accepted = torch.cumprod((uniforms * q_tokens < p_tokens).long(), 0).sum()
    at = accepted.clamp(max=count - 1)[None]  # the first rejected position (any, when none was)
    p = torch.nan_to_num(torch.softmax(scaled.index_select(0, at), dim=-1), nan=0.0)[0]
    residual = p.scatter(0, ids.index_select(0, at)[0], 0.0)  # max(p - q, 0) for a point mass q
    if drafted:
        residual = torch.where(sampled.index_select(0, at), torch.clamp(p - q_rows.index_select(0, at)[0], min=0),
                               residual)
    residual = torch.where(residual.sum() > 0, residual, p)
    noise = torch.rand(residual.shape, generator=generator, device=device)
    best, drawn = (torch.log(residual) - torch.log(-torch.log(noise))).max(dim=-1)  # u = 0: -inf, never drawn
    return torch.stack([accepted, torch.where(torch.isfinite(best), drawn, -1)])


def draw_tokens(logits: torch.Tensor, draws: Sequence[tuple[int, SamplingParams, torch.Generator]]) -> torch.Tensor:
    """One token for each ``(row, params, generator)`` of already-masked ``logits`` (``[rows,
    vocab]``), drawn where the logits are, with no read back: Gumbel-max, the argmax of the
    logits over the row's temperature plus noise from the row's own generator, over its top-p
    nucleus (the same distribution as ``choose``'s, not the same draws). -1 where the row allows
    nothing. The engine reads the draws back with the step's argmaxes, in its one transfer."""
    rows = torch.stack([logits[row] for row, _, _ in draws]).float()
    temperatures = torch.tensor([params.temperature for _, params, _ in draws], dtype=torch.float32)
    scaled = rows / temperatures.to(rows.device, non_blocking=True)[:, None]
    nucleus = [i for i, (_, params, _) in enumerate(draws) if params.top_p < 1.0]
    for i in nucleus:  # few rows ask for top-p; each keeps the smallest set of its mass
        scaled[i] = _nucleus(scaled[i], draws[i][1].top_p)
    noise = torch.stack([torch.rand(rows.shape[-1], generator=generator, device=rows.device)
                         for _, _, generator in draws])
    keyed = scaled - torch.log(-torch.log(noise))  # u = 0 gives -inf: never drawn
    best, index = keyed.max(dim=-1)
    return torch.where(torch.isfinite(best), index, -1)


def _nucleus(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scaled`` logits with those outside the top-``top_p`` nucleus (as ``distribution`` keeps it) at -inf."""
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
    outside[..., 0] = False
    return scaled.scatter(-1, order, torch.where(outside, float("-inf"), scaled.gather(-1, order)))


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Argmax when greedy, else a sample from ``distribution``."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(distribution(logits, params), 1, generator=generator))
