"""Decoding mechanics on tiny random models with an 8-letter vocabulary (fast, exact).

The sampling test compares speculative sampling against the exact constrained target
distribution with a chi-square test, and checks that the same test rejects a biased sampler.
"""

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cdsl_struct import IncompatibleTokenizers, Regex, compile
from cdsl_struct.constraints import TokenVocabulary, mask
from cdsl_struct.constraints.mask import allocate_bitmask
from cdsl_struct.decoding import DraftModelProposer, SamplingParams, decode, forced_proposer, loop
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.decoding.sampling import distribution, masked_logits
from cdsl_struct.models.runner import ModelRunner, check_same_vocabulary, self_draft
from cdsl_struct.models.self_check import batch_runner

LETTERS = b"abcdefgh"
EOS = len(LETTERS)


def letters_vocab(letters: bytes = LETTERS) -> TokenVocabulary:
    return TokenVocabulary(
        token_bytes=[bytes([c]) for c in letters] + [b"</s>"], special_ids=frozenset({len(letters)}),
        eos_token_ids=(len(letters),), scheme="byte-level",
        encode=lambda text: [letters.index(c) for c in text.encode() if c in letters],
    )


def tiny_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=EOS + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper distributions than the default init
        model.lm_head.weight.mul_(40)
    return model


@pytest.fixture(scope="module")
def models():
    return tiny_model(1), tiny_model(2)


@pytest.fixture(scope="module")
def compiled():
    return compile(Regex("[a-d][a-h]"), letters_vocab(), backend="outlines-core")


PROMPT = [0, 1, 2]
PARAMS = SamplingParams(temperature=1.0)


def exact_distribution(model, compiled, params):
    """P(x1 x2) of the constrained target: masked, tempered, renormalised at each position."""
    state = compiled.new_state()
    probs = {}
    with torch.no_grad():
        first_mask = allocate_bitmask(compiled.vocab_size)
        state.fill_mask(first_mask)
        p1 = distribution(masked_logits(model(torch.tensor([PROMPT])).logits[0, -1], first_mask), params)
        for x1 in range(4):
            state.advance(x1)
            second_mask = allocate_bitmask(compiled.vocab_size)
            state.fill_mask(second_mask)
            logits = model(torch.tensor([PROMPT + [x1]])).logits[0, -1]
            p2 = distribution(masked_logits(logits, second_mask), params)
            state.rollback(1)
            for x2 in range(8):
                probs[(x1, x2)] = float(p1[x1] * p2[x2])
    return probs


def chi_square_p_value(samples, probs):
    counts = {key: 0 for key in probs}
    for sample in samples:
        counts[sample] += 1
    n = len(samples)
    # pool rare outcomes so that every expected count is at least 5
    cells, pooled_obs, pooled_exp = [], 0, 0.0
    for key, p in sorted(probs.items(), key=lambda kv: kv[1]):
        if n * p < 5:
            pooled_obs += counts[key]
            pooled_exp += n * p
        else:
            cells.append((counts[key], n * p))
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    stat = sum((obs - exp) ** 2 / exp for obs, exp in cells)
    dof = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def sample_outputs(models, compiled, proposers_for, n):
    target = ModelRunner(models[0])
    outputs = []
    for seed in range(n):
        params = SamplingParams(temperature=1.0, seed=seed)
        result = decode(target, compiled, PROMPT, proposers=proposers_for(), k=2, max_tokens=4, params=params)
        assert result.finish_reason == "stop"
        outputs.append(tuple(result.tokens[:2]))
    return outputs


class AlwaysA:
    """A deterministic draft that proposes 'a' whenever allowed (a point mass)."""

    name = "always-a"

    def propose(self, session, proposal, budget):
        for _ in range(budget):
            if session.state.validate([0]) != 1:
                return
            proposal.masks.append(session.current_mask())
            session.speculate(proposal, 0, None)


@pytest.mark.parametrize("draft", ["model", "point-mass"])
def test_speculative_sampling_matches_constrained_target(models, compiled, draft):
    exact = exact_distribution(models[0], compiled, PARAMS)
    draft_runner = ModelRunner(models[1], name="draft")
    if draft == "model":
        def make():
            return [forced_proposer(), DraftModelProposer(draft_runner)]
    else:
        def make():
            return [AlwaysA()]
    samples = sample_outputs(models, compiled, make, 800)
    assert chi_square_p_value(samples, exact) > 1e-3


@pytest.mark.parametrize(("draft", "kernels"), [("model", "host"), ("point-mass", "device")])
def test_the_engines_verdicts_in_bulk_sample_the_constrained_target(models, compiled, monkeypatch, draft, kernels):
    """The engine judges a sampling row's proposal with the step's choices, in its one read
    (``sampling.speculative_verdict``), on the CPU's numpy path and on the torch ops a GPU runs
    (forced here): 800 seeded rows, 16 at a time, against the exact constrained target."""
    if kernels == "device":
        monkeypatch.setattr(loop, "host_kernels", lambda logits: False)
        monkeypatch.setattr(mask, "host_kernels", lambda logits: False)
    exact = exact_distribution(models[0], compiled, PARAMS)
    proposers = (forced_proposer(), DraftModelProposer(ModelRunner(models[1], name="draft"))) \
        if draft == "model" else (AlwaysA(),)
    engine = BatchEngine(batch_runner(models[0], pad_token_id=EOS), max_batch_size=16, adaptive_width=False)
    try:
        results = engine.run([Request(tuple(PROMPT), compiled, SamplingParams(temperature=1.0, seed=seed), 4,
                                      proposers=proposers, k=2) for seed in range(800)])
    finally:
        engine.close()
    assert all(result.finish_reason == "stop" for result in results)
    assert sum(result.stats.proposed for result in results) > 800  # most rows had a proposal judged
    assert chi_square_p_value([tuple(result.tokens[:2]) for result in results], exact) > 1e-3


class WrongWidthDraft:
    """A draft proposing ``token`` first, with a distribution over a wider vocabulary than the target's."""

    name = "wrong-width"

    def __init__(self, token):
        self.token = token

    def propose(self, session, proposal, budget):
        if not session.output and session.state.validate([self.token]) == 1:
            proposal.masks.append(session.current_mask())
            q = torch.zeros(EOS + 4)
            q[self.token] = 1.0
            session.speculate(proposal, self.token, q)


def test_a_draft_of_another_width_ends_its_own_row_not_the_steps_bulk_verdicts(models, compiled):
    """Its rejected token's residual cannot be formed: that row ends with the error, in its own verify;
    the rows beside it, judged in the same bulk ops, finish."""
    exact = exact_distribution(models[0], compiled, PARAMS)
    unlikely = min(range(4), key=lambda x1: sum(p for (first, _), p in exact.items() if first == x1))
    nucleus = SamplingParams(temperature=1.0, top_p=0.01)  # the most likely token alone: ``unlikely`` is refused
    engine = BatchEngine(batch_runner(models[0], pad_token_id=EOS), max_batch_size=4, adaptive_width=False)
    try:
        rows = engine.run_rows([Request(tuple(PROMPT), compiled, params, 4, proposers=proposers, k=2)
                                for params, proposers in [(nucleus, (WrongWidthDraft(unlikely),)),
                                                          (SamplingParams(temperature=1.0, seed=1), (AlwaysA(),)),
                                                          (SamplingParams(temperature=1.0, seed=2), ())]])
    finally:
        engine.close()
    assert rows[0].error is not None
    assert all(row.error is None and row.result.finish_reason == "stop" for row in rows[1:])


def test_chi_square_rejects_a_biased_sampler(models, compiled):
    """Draft-only sampling (accept everything) is what a biased verifier would produce."""
    exact = exact_distribution(models[0], compiled, PARAMS)
    draft_exact = exact_distribution(models[1], compiled, PARAMS)
    gen = torch.Generator().manual_seed(0)
    keys = list(draft_exact)
    weights = torch.tensor([draft_exact[k] for k in keys])
    samples = [keys[int(i)] for i in torch.multinomial(weights, 800, replacement=True, generator=gen)]
    assert chi_square_p_value(samples, exact) < 1e-6


def test_greedy_identity_with_random_draft(models, compiled):
    target = ModelRunner(models[0])
    plain = decode(target, compiled, PROMPT, max_tokens=4)
    for k in (1, 2, 5):
        spec = decode(target, compiled, PROMPT, proposers=[DraftModelProposer(ModelRunner(models[1]))], k=k,
                      max_tokens=4)
        assert spec.tokens == plain.tokens


def test_runner_crop_matches_recompute(models):
    runner = ModelRunner(models[0])
    sequence = [0, 1, 2, 3, 4, 5, 6]
    runner.run(sequence, keep=1)
    runner.crop(4)
    assert runner.length == 4
    cropped = runner.run([0, 1, 2, 3, 7], keep=1)
    fresh = ModelRunner(models[0]).run([0, 1, 2, 3, 7], keep=1)
    assert torch.allclose(cropped, fresh, atol=1e-5)
    assert runner.passes == 2 and runner.positions == 8


def test_self_drafts_leave_the_target_untouched(models):
    target = models[0]
    layers_before = len(target.model.layers)
    truncated = self_draft(target, "layers:1")
    assert len(truncated.model.layers) == 1 and len(target.model.layers) == layers_before
    assert self_draft(target, "bf16").dtype == torch.bfloat16 and target.dtype == torch.float32
    with pytest.raises(Exception, match="layers:N"):
        self_draft(target, "layers:99")


def test_incompatible_tokenizers_name_the_first_difference():
    with pytest.raises(IncompatibleTokenizers, match="token 2"):
        check_same_vocabulary(letters_vocab(), letters_vocab(b"abzdefgh"))
    check_same_vocabulary(letters_vocab(), letters_vocab())


def test_bad_parameters(models, compiled):
    target = ModelRunner(models[0])
    with pytest.raises(ValueError, match="k must be"):
        decode(target, compiled, PROMPT, k=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        decode(target, compiled, PROMPT, max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(temperature=1, top_p=0)


def test_constraint_dead_end(models):
    dead = compile(Regex("az"), letters_vocab(), backend="llguidance")  # no token spells "z"
    result = decode(ModelRunner(models[0]), dead, PROMPT, max_tokens=4)
    assert result.finish_reason == "constraint_dead_end" and not result.complete and result.value is None


def test_streaming_callback_sees_every_token(models, compiled):
    pieces = []
    result = decode(ModelRunner(models[0]), compiled, PROMPT, max_tokens=4, on_tokens=pieces.append)
    assert list(itertools.chain.from_iterable(pieces)) == result.tokens
