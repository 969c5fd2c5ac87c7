"""The int8 self-draft's own step (``models.int8_forward``): bitwise the logits of the model's own
forward through the ragged runner, on the embedded model and on each family it takes; the models
it does not take keep their own forward."""

from __future__ import annotations

import pytest
import torch
import transformers

from cdsl_struct.models.batch import Feed
from cdsl_struct.models.int8 import quantise_linears
from cdsl_struct.models.int8_forward import Int8Forward, int8_forward
from cdsl_struct.models.ragged import RaggedRunner


def _runners(draft):
    """Two runners on ``draft``: one through ``Int8Forward``, one through the model's own forward."""
    fast, own = RaggedRunner(draft, prefix_cache_bytes=0), RaggedRunner(draft, prefix_cache_bytes=0)
    assert isinstance(fast.int8, Int8Forward)
    own.int8 = None
    return fast, own


def _same_steps(draft, vocab: int) -> int:
    """Run one script of steps through both runners and assert every step's logits are bitwise
    equal: prompts joining beside decoding rows, one to four rows (the keys written by slice and
    by index), several positions kept, a row released, a rejected speculation cropped, a fork.
    Returns how many steps ran."""
    fast, own = _runners(draft)
    rows = {"a": [(7 * i + 3) % vocab for i in range(21)], "b": [(5 * i + 1) % vocab for i in range(4)]}
    steps = 0

    def step(feeds):
        nonlocal steps
        for mine, theirs in zip(fast.run(feeds), own.run(feeds), strict=True):
            assert torch.equal(mine, theirs), f"step {steps}: {(mine - theirs).abs().max()}"
        steps += 1

    step([Feed("a", rows["a"], 1)])  # a prompt alone
    step([Feed("a", rows["a"] + [5], 1), Feed("b", rows["b"], 2)])  # a prompt joining a decoding row
    rows["a"] += [5, 9, 11]
    rows["c"] = [(3 * i + 2) % vocab for i in range(9)]
    rows["d"] = [4, 4, 8]
    step([Feed(name, ids, 2) for name, ids in rows.items()])  # four rows: keys written by index
    for name in rows:
        rows[name] = rows[name] + [(len(rows[name]) * 13) % vocab]
    step([Feed(name, ids, 1) for name, ids in rows.items()])
    for runner in (fast, own):
        runner.release("b")
    del rows["b"]
    rows["a"] = rows["a"][:-3] + [1, 2]  # a rejected speculation: the row is cropped, two tokens fed
    step([Feed(name, ids, 3 if name == "a" else 1) for name, ids in rows.items()])
    step([Feed("e", rows["c"] + [6], 1, parent="c"), Feed("c", rows["c"] + [7], 1)])  # a fork
    return steps


def test_the_embedded_models_int8_draft_gives_its_own_forwards_logits_bitwise(smollm2, one_torch_thread):
    from cdsl_struct.models.runner import self_draft

    draft = self_draft(smollm2.model, "int8")
    assert _same_steps(draft, 49152) == 6


def _tiny_int8(family: str, **extra):
    torch.manual_seed(11)
    config = transformers.AutoConfig.for_model(family, vocab_size=60, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=256, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.set_attn_implementation("sdpa")
    return quantise_linears(model)


@pytest.mark.parametrize(("family", "extra"), [("llama", {"tie_word_embeddings": False}),
                                               ("mistral", {}), ("mistral", {"sliding_window": 5}), ("qwen2", {})])
def test_each_family_it_takes_matches_bitwise(family, extra):
    draft = _tiny_int8(family, **extra)
    if family == "qwen2":  # biases on q/k/v: carried by the shared int8 matrix
        assert draft.model.layers[0].self_attn.q_proj.matrix.bias is not None
    assert _same_steps(draft, 60) == 6


@pytest.mark.parametrize(("family", "extra"), [("qwen3", {}), ("llama", {"hidden_act": "gelu"}),
                                               ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                                              "rope_theta": 10000.0}})])
def test_models_it_does_not_reproduce_keep_their_own_forward(family, extra):
    draft = _tiny_int8(family, **extra)
    assert int8_forward(draft) is None
    assert RaggedRunner(draft, prefix_cache_bytes=0).int8 is None


def test_float_models_and_the_switch_keep_the_models_forward(model, monkeypatch):
    assert int8_forward(model) is None  # linear layers not int8
    draft = quantise_linears(model)
    assert int8_forward(draft) is not None
    assert RaggedRunner(draft, prefix_cache_bytes=0, rows_alone=False).int8 is None  # grouped attention
    monkeypatch.setenv("CDSL_INT8_FORWARD", "0")
    assert int8_forward(draft) is None


def test_a_product_keeps_its_input_buffers_for_a_few_small_token_counts():
    from cdsl_struct.models.int8 import Int8Matrix
    from cdsl_struct.models.int8_forward import _SHAPES_KEPT, _TOKENS_KEPT, _Matmul

    torch.manual_seed(0)
    matrix = Int8Matrix(torch.randn(24, 16), None)
    product = _Matmul(matrix)
    inputs = {n: torch.randn(1, n, 16) for n in (1, 2, 3)}
    first = {n: product(x) for n, x in inputs.items()}
    kept = {n: product.padded[torch.Size([1, n])].data_ptr() for n in inputs}
    for _ in range(2):  # counts that alternate reuse their buffers, and give the same values
        for n, x in inputs.items():
            assert torch.equal(product(x), first[n]) and torch.equal(product(x), matrix(x))
            assert product.padded[torch.Size([1, n])].data_ptr() == kept[n]
    product(torch.randn(1, _TOKENS_KEPT + 1, 16))  # a prompt's count is not kept
    assert set(product.padded) == {torch.Size([1, n]) for n in inputs}
    for n in range(4, 4 + _SHAPES_KEPT):
        product(torch.randn(1, n, 16))
    assert len(product.padded) == _SHAPES_KEPT and torch.Size([1, 1]) not in product.padded
