"""Quality of generated sentences beyond keyword coverage, and bootstrap confidence intervals.

- ``mean_nll``: fluency, the target model's mean negative log-likelihood per token of an output
  given the same prompt, scored without any constraint (one forward pass, not counted in a
  decoder's stats).
- ``bleu`` (sacrebleu, corpus level, every reference) and ``rouge_l`` (rouge-score, the best
  F-measure over the references, averaged) against human references.
- ``bootstrap_ci``: a percentile interval for the mean of per-case values, resampling cases with
  a seeded generator; ``paired_ratio_ci`` does the same for the ratio of two methods' means over
  the same cases.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch


@torch.inference_mode()
def token_nlls(model: Any, prompt: Sequence[int], output: Sequence[int]) -> list[float]:
    """The negative log-likelihood (nats) of each token of ``output`` after ``prompt`` under
    ``model`` (an HF causal LM), unconstrained."""
    if not output:
        return []
    ids = torch.tensor([list(prompt) + list(output)], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(list(output), device=logp.device)
    return [float(v) for v in -logp.gather(1, target.unsqueeze(1)).squeeze(1)]


def mean_nll(model: Any, prompt: Sequence[int], output: Sequence[int]) -> float:
    """Mean negative log-likelihood (nats per token) of ``output`` after ``prompt`` under ``model``;
    NaN for an empty output."""
    values = token_nlls(model, prompt, output)
    return sum(values) / len(values) if values else math.nan


def bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU (0-100) of ``hypotheses``, each against all of its ``references``."""
    import sacrebleu

    if not hypotheses:
        return 0.0
    width = max(len(r) for r in references)
    streams = [[refs[i] if i < len(refs) else "" for refs in references] for i in range(width)]
    return float(sacrebleu.corpus_bleu(list(hypotheses), streams).score)


def rouge_l(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean over cases of the best ROUGE-L F-measure (0-1) against any of the case's references."""
    from rouge_score import rouge_scorer

    if not hypotheses:
        return 0.0
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    best = [max((scorer.score(ref, hyp)["rougeL"].fmeasure for ref in refs), default=0.0)
            for hyp, refs in zip(hypotheses, references, strict=True)]
    return sum(best) / len(best)


def bootstrap_ci(values: Sequence[float], resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of ``values`` (cases resampled with replacement)."""
    if not values:
        return (math.nan, math.nan)
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return _percentiles(means, level)


def paired_ratio_ci(numerator: Sequence[float], denominator: Sequence[float], resamples: int = 2000,
                    level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval for ``mean(numerator) / mean(denominator)``, the two measured
    on the same cases (resampled together)."""
    if len(numerator) != len(denominator):
        raise ValueError("paired values need the same number of cases")
    if not numerator:
        return (math.nan, math.nan)
    rng, n = random.Random(seed), len(numerator)
    ratios = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        den = sum(denominator[i] for i in picks)
        ratios.append(sum(numerator[i] for i in picks) / den if den else math.inf)
    return _percentiles(sorted(ratios), level)


def _percentiles(ordered: list[float], level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2
    low = ordered[int(tail * (len(ordered) - 1))]
    high = ordered[int(math.ceil((1.0 - tail) * (len(ordered) - 1)))]
    return (round(low, 4), round(high, 4))
