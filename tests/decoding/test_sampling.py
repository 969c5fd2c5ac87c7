"""Sampling parameters at their edges: what a client may send must never make a nan distribution."""

import pytest
import torch

from cdsl_struct.decoding.sampling import (
    MIN_TEMPERATURE,
    SamplingParams,
    choose,
    distribution,
    draw_tokens,
    speculative_verdict,
)


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


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 1.0), (1.3, 0.7)])
def test_draws_on_the_device_follow_the_distribution_choose_samples(temperature, top_p):
    """Gumbel-max draws (``draw_tokens``, what the engine reads back with its argmaxes) against
    ``distribution``: every token within a few standard errors of its probability, masked and
    out-of-nucleus tokens never drawn."""
    logits = torch.log(torch.tensor([0.4, 0.25, 0.15, 0.1, 0.1, 0.0]))  # the last one masked (-inf)
    params = SamplingParams(temperature=temperature, top_p=top_p)
    expected = distribution(logits, params)
    n = 6000
    generators = [torch.Generator().manual_seed(seed) for seed in range(n)]
    rows = logits.expand(n, -1).clone()
    drawn = draw_tokens(rows, [(i, params, generators[i]) for i in range(n)])
    counts = torch.bincount(drawn, minlength=6).double() / n
    error = (expected.double() * (1 - expected.double()) / n).sqrt()
    assert (counts - expected.double()).abs().le(5 * error + 1e-12).all(), (counts, expected)
    assert counts[5] == 0 and (counts[expected == 0] == 0).all()


def test_a_draw_depends_on_its_own_generator_alone_and_is_minus_one_where_nothing_is_allowed():
    params = SamplingParams(temperature=1.0, seed=3)
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    logits[2] = -float("inf")
    alone = draw_tokens(logits[:1], [(0, params, params.generator())])
    crowd = draw_tokens(logits, [(1, SamplingParams(temperature=0.7), SamplingParams(temperature=0.7).generator()),
                                 (0, params, params.generator()), (2, params, params.generator())])
    assert crowd[1] == alone[0] and crowd[2] == -1


def test_a_verdict_keeps_a_forced_token_refuses_one_outside_the_nucleus_and_draws_nothing_where_nothing_is_allowed():
    """``speculative_verdict``'s edges (its distribution is tested through the engine:
    tests/decoding/test_mechanics_tiny.py): a token the mask forces is accepted; a token top-p leaves
    out is refused and the draw comes from the nucleus; a position that allows nothing gives -1."""
    inf = float("inf")
    params = SamplingParams(temperature=0.7, top_p=0.5, seed=1)
    forced = torch.full((2, 6), -inf)
    forced[0, 3] = 0.0
    forced[1, :4] = torch.tensor([2.0, 1.0, 0.5, 0.0])
    assert speculative_verdict(forced, [3, 2], [None, None], params, params.generator()).tolist()[0] == 1
    refused = forced[1:].clone()  # token 3 is allowed by the mask, outside the 0.5 nucleus
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        assert speculative_verdict(refused, [3], [None], params, generator).tolist() == [0, 0]
    nothing = torch.full((1, 6), -inf)
    assert speculative_verdict(nothing, [2], [None], params, params.generator()).tolist() == [0, -1]


@pytest.mark.parametrize("fill", ["finite", "some_masked", "all_masked", "plus_inf", "nan", "only_plus_inf"])
def test_any_allowed_says_what_isfinite_any_says(fill):
    from cdsl_struct.decoding.sampling import any_allowed

    row = torch.randn(64)
    if fill != "finite":
        row[::2] = -float("inf")
    if fill == "all_masked":
        row[:] = -float("inf")
    if fill == "plus_inf":
        row[3] = float("inf")
    if fill == "nan":
        row[5] = float("nan")
    if fill == "only_plus_inf":
        row[:] = -float("inf")
        row[7] = float("inf")
    assert any_allowed(row) == bool(torch.isfinite(row).any())


@pytest.mark.parametrize("allowed", [0, 1, 3, 5, 40])
def test_allowed_top_is_the_top_of_the_allowed_tokens_only(allowed):
    from cdsl_struct.decoding.sampling import allowed_top

    logits = torch.randn(64, generator=torch.Generator().manual_seed(allowed))
    logits[torch.randperm(64, generator=torch.Generator().manual_seed(1))[allowed:]] = -float("inf")
    logp = torch.log_softmax(logits, -1)
    values, indices = allowed_top(logp, 5)
    expected = torch.topk(logp, min(5, allowed))
    assert indices.tolist() == expected.indices.tolist()
    assert torch.equal(values, expected.values)
