"""Sampling parameters at their edges: what a client may send must never make a nan distribution."""

import pytest
import torch

from cdsl_struct.decoding.sampling import MIN_TEMPERATURE, SamplingParams, choose, distribution


@pytest.mark.parametrize("temperature", [0.0, 1e-300, 5e-324, 1e-38, MIN_TEMPERATURE / 2])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature):
    params = SamplingParams(temperature=temperature)
    logits = torch.tensor([1.0, 3.0, 2.0, -float("inf")])
    assert params.greedy
    assert choose(logits, params, torch.Generator().manual_seed(0)) == 1


@pytest.mark.parametrize("top_p", [1e-46, 5e-324, 1e-9])
def test_a_top_p_below_float32_precision_keeps_the_most_likely_token(top_p):
    """1e-46 is 0 in float32: every token used to be dropped and the distribution was nan."""
    probs = distribution(torch.tensor([1.0, 3.0, 2.0, -float("inf")]), SamplingParams(temperature=1.0, top_p=top_p))
    assert torch.isfinite(probs).all() and probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_top_p_keeps_the_smallest_nucleus():
    probs = distribution(torch.log(torch.tensor([0.5, 0.3, 0.2])), SamplingParams(temperature=1.0, top_p=0.7))
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0])
