"""Log-probabilities of chosen tokens, of the distribution they were actually drawn from.

Greedy rows: the masked target distribution (softmax of the masked logits, temperature 1).
Sampled rows: the masked distribution after temperature and top-p, the one sampled from. So a
token the constraint forced has log-probability 0, and tokens outside the mask never appear
among the alternatives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..params import MAX_TOP_LOGPROBS
from .sampling import SamplingParams, distribution

__all__ = ["MAX_TOP_LOGPROBS", "token_logprobs"]


def token_logprobs(masked: torch.Tensor, tokens: Sequence[int], params: SamplingParams, top: int,
                   vocabulary: Any) -> list[dict[str, Any]]:
    """One OpenAI-style entry per token: ``token``, ``logprob``, ``bytes``, ``top_logprobs``;
    ``masked[i]`` are the masked logits the ``i``-th token was chosen from."""
    entries = []
    for i, token in enumerate(tokens):
        row = masked[i].float()
        logp = torch.log_softmax(row, dim=-1) if params.greedy else torch.log(distribution(row, params))
        alternatives = []
        if top:
            values, ids = torch.topk(logp, min(top, logp.shape[-1]))
            alternatives = [_entry(int(t), float(v), vocabulary) for t, v in zip(ids, values, strict=True)
                            if math.isfinite(float(v))]
        entries.append({**_entry(token, float(logp[token]), vocabulary), "top_logprobs": alternatives})
    return entries


def _entry(token: int, logprob: float, vocabulary: Any) -> dict[str, Any]:
    raw = b"" if token in vocabulary.eos_token_ids else vocabulary.token_bytes[token]
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": max(logprob, -9999.0),
            "bytes": list(raw)}
