"""Quality metrics and bootstrap intervals: exact values on fixed inputs."""

import math

import pytest
import torch

from benchmarks.quality import bleu, bootstrap_ci, mean_nll, paired_ratio_ci, rouge_l
from tests.decoding.test_mechanics_tiny import tiny_model


def test_mean_nll_is_the_mean_negative_log_likelihood_of_the_output():
    model = tiny_model(1)
    prompt, output = [0, 1, 2], [3, 4]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0], dim=-1)
    expected = -(logp[2, 3] + logp[3, 4]) / 2  # position i predicts token i + 1
    assert mean_nll(model, prompt, output) == pytest.approx(float(expected), rel=1e-5)
    assert math.isnan(mean_nll(model, prompt, []))


def test_bleu_and_rouge_l_against_references():
    refs = [["The dog caught the frisbee.", "A dog catches a frisbee."], ["Kids dance in the rain."]]
    assert bleu(["The dog caught the frisbee.", "Kids dance in the rain."], refs) == pytest.approx(100.0)
    assert rouge_l(["A dog catches a frisbee.", "Kids dance in the rain."], refs) == pytest.approx(1.0)
    partial = rouge_l(["The dog sleeps.", "Rain."], refs)
    assert 0.0 < partial < 1.0
    assert bleu(["Nothing alike here at all.", "Zebra."], refs) < 10.0


def test_bootstrap_intervals():
    assert bootstrap_ci([1.0] * 20) == (1.0, 1.0)
    low, high = bootstrap_ci([0.0] * 50 + [1.0] * 50)
    assert low < 0.5 < high and high - low < 0.3
    wide = bootstrap_ci([0.0] * 5 + [1.0] * 5)
    assert wide[1] - wide[0] > high - low  # fewer cases, wider interval
    assert bootstrap_ci([0.0, 1.0], seed=3) == bootstrap_ci([0.0, 1.0], seed=3)  # seeded
    assert paired_ratio_ci([1.0] * 10, [1.0] * 10) == (1.0, 1.0)
    low, high = paired_ratio_ci([1.0, 0.0] * 10, [1.0] * 20)
    assert low < 0.5 < high
    with pytest.raises(ValueError, match="same number"):
        paired_ratio_ci([1.0], [1.0, 1.0])
