"""Token-scaled int8 linear layers (``models.int8``): a row's output does not depend on its batch, the
siblings of one input share a matrix, and on the embedded model the int8 self-draft's ragged rows
give bitwise what each gives alone."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from cdsl_struct.models.batch import Feed
from cdsl_struct.models.int8 import Int8Matrix, TokenScaledInt8Linear, dequantised, quantise_linears, token_scaled
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.self_check import check_ragged


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(64, 64), nn.Linear(64, 16), nn.Linear(64, 16)
        self.o_proj = nn.Linear(64, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.q_proj(x) + torch.cat([self.k_proj(x), self.v_proj(x)] * 2, -1))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return Attention().eval()


def test_each_row_is_quantised_on_its_own_scale(block):
    layer = quantise_linears(block).o_proj
    torch.manual_seed(1)
    # rows of very different magnitudes: one scale over the batch would crush the small ones
    x = torch.randn(12, 64) * torch.logspace(-3, 2, 12).unsqueeze(1)
    together = layer(x)
    assert torch.equal(together, torch.cat([layer(row.unsqueeze(0)) for row in x]))
    assert torch.equal(together[3:7], layer(x[3:7].flip(0)).flip(0))
    assert torch.equal(together.view(3, 4, 64), layer(x.view(3, 4, 64)))  # any leading shape
    exact = x @ block.o_proj.weight.detach().t()
    relative = (together - exact).norm(dim=1) / exact.norm(dim=1)
    assert relative.max() < 0.03  # 7-bit activations, 8-bit weights per channel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = torch.ao.quantization.quantize_dynamic(nn.Sequential(block.o_proj), {nn.Linear},
                                                         dtype=torch.qint8)
    batched = (dynamic(x) - exact).norm(dim=1) / exact.norm(dim=1)
    assert batched[:4].min() > 0.5  # fbgemm's one scale for the batch: the small rows are lost
    assert relative[:4].max() < 0.03


def test_siblings_share_one_matrix_and_let_go_of_the_input(block):
    quantised = quantise_linears(block)
    q, k, v, o = quantised.q_proj, quantised.k_proj, quantised.v_proj, quantised.o_proj
    assert all(type(m) is TokenScaledInt8Linear for m in (q, k, v, o))
    assert q.matrix is k.matrix is v.matrix and o.matrix is not q.matrix
    assert (q.span, k.span, v.span) == ((0, 64), (64, 80), (80, 96))
    x = torch.randn(5, 64)
    whole = q.matrix(x)
    assert torch.equal(k(x), whole[:, 64:80])  # any member first
    assert torch.equal(q(x), whole[:, :64])
    assert q.matrix.last.value is not None
    assert torch.equal(v(x), whole[:, 80:])
    assert q.matrix.last.value is None  # all three served
    assert torch.allclose(quantised(x), block(x), atol=0.05, rtol=0.05)


def test_the_model_quantised_is_left_as_it_was(block):
    before = {name: p.clone() for name, p in block.named_parameters()}
    quantised = quantise_linears(block)
    assert token_scaled(quantised) and not token_scaled(block)
    assert all(type(m) is nn.Linear for m in (block.q_proj, block.k_proj, block.v_proj, block.o_proj))
    assert all(torch.equal(p, before[name]) for name, p in block.named_parameters())


def test_a_bf16_model_with_tied_embeddings_keeps_its_weights_and_dtype():
    import transformers

    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(2)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    before = {name: p.clone() for name, p in model.named_parameters()}
    quantised = quantise_linears(model)
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, before[name]) for name, p in model.named_parameters())
    embedding = quantised.model.embed_tokens.weight
    assert embedding.dtype == torch.float32 and embedding.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(embedding, before["model.embed_tokens.weight"].float())
    assert type(quantised.lm_head) is TokenScaledInt8Linear and type(model.lm_head) is not TokenScaledInt8Linear


def test_the_int8_weights_are_each_channels_rounding_with_zero_anchor_columns():
    torch.manual_seed(3)
    weight = torch.randn(40, 24) * torch.logspace(-2, 1, 40).unsqueeze(1)
    weight[7] = 0.0  # an all-zero channel keeps the smallest scale
    matrix = Int8Matrix(weight.to(torch.bfloat16), None)
    packed, _ = torch.ops.quantized.linear_unpack(matrix.packed)
    reference = weight.to(torch.bfloat16).float()
    scales = (reference.abs().amax(1) / 127).clamp_min(1e-12).double()
    padded = torch.cat([reference, torch.zeros(40, 2)], 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = torch.quantize_per_channel(padded, scales, torch.zeros(40, dtype=torch.long), 0, torch.qint8)
    assert torch.equal(packed.int_repr(), expected.int_repr())
    assert torch.equal(packed.q_per_channel_scales(), expected.q_per_channel_scales())
    assert packed.int_repr()[:, 24:].eq(0).all() and packed.int_repr()[7].eq(0).all()


def test_dequantised_runs_the_layers_in_float_and_goes_back(block):
    quantised = quantise_linears(block)
    x = torch.randn(3, 64)
    int8 = quantised(x)
    with dequantised(quantised):
        in_float = quantised(x)
        assert quantised.q_proj.matrix.float_weight.shape == (96, 64)
    assert quantised.q_proj.matrix.float_weight is None
    assert torch.equal(quantised(x), int8) and not torch.equal(in_float, int8)
    assert torch.allclose(in_float, int8, atol=0.05, rtol=0.05)


def test_the_int8_drafts_ragged_rows_equal_each_row_alone(smollm2, one_torch_thread):
    """Batched ragged steps of the int8 self-draft give each row bitwise its logits alone, prompts and
    decode steps both; its runner attends row by row (grouped attention's float order, rounded to int8,
    would change the draft) and passes the self-check on its dequantised weights."""
    from cdsl_struct.models.runner import self_draft

    draft = self_draft(smollm2.model, "int8")
    assert check_ragged(draft) is None
    rows = {name: [(step * i + 3) % 49152 for i in range(length)]
            for name, step, length in (("a", 7, 20), ("b", 5, 4), ("c", 3, 9), ("d", 11, 6))}
    together = RaggedRunner(draft, prefix_cache_bytes=0)
    assert together.rows_alone
    first = together.run([Feed(name, ids, 2) for name, ids in rows.items()])
    second = together.run([Feed(name, ids + [7, 8], 2) for name, ids in rows.items()])
    for index, (name, ids) in enumerate(rows.items()):
        alone = RaggedRunner(draft, prefix_cache_bytes=0)
        assert torch.equal(alone.run([Feed(name, ids, 2)])[0], first[index]), name
        assert torch.equal(alone.run([Feed(name, ids + [7, 8], 2)])[0], second[index]), name


def test_the_int8_drafts_one_token_rows_equal_each_row_alone(smollm2, one_torch_thread):
    """One-token steps, as most of a draft's are: rows of 6 to 127 positions decoding one token each
    beside others, a row that sits a step out, a row feeding three tokens beside them; each row's
    logits are bitwise what it gives alone (a one-query row attends through SDPA with no mask)."""
    from cdsl_struct.models.runner import self_draft

    draft = self_draft(smollm2.model, "int8")
    lengths = {"a": 61, "b": 6, "c": 65, "d": 127}
    rows = {name: [(13 * i + 5 * length) % 49152 for i in range(length)] for name, length in lengths.items()}
    together = RaggedRunner(draft, prefix_cache_bytes=0)
    alone = {name: RaggedRunner(draft, prefix_cache_bytes=0) for name in rows}
    together.run([Feed(name, ids, 1) for name, ids in rows.items()])
    for name, ids in rows.items():
        alone[name].run([Feed(name, ids, 1)])
    for step in range(4):
        fed = {name: ids + [(step * 101 + len(ids)) % 49152] for name, ids in rows.items() if name != "b" or step % 2}
        if step == 1:
            fed["c"] = rows["c"] + [11, 12, 13]
        out = together.run([Feed(name, ids, 1) for name, ids in fed.items()])
        for (name, ids), logits in zip(fed.items(), out, strict=True):
            assert torch.equal(alone[name].run([Feed(name, ids, 1)])[0], logits), (step, name)
        rows.update(fed)


def test_activations_keep_all_8_bits_only_where_fbgemm_adds_them_exactly(monkeypatch):
    """``full_range``: 8-bit activations where fbgemm's product of saturating pairs is exact (AVX-512
    VNNI), 7 where its kernels add pairs in 16 bits (AVX2); a kernel that saturates is caught, and
    ``Int8Matrix`` asks for what the check found. With 8 bits a product is closer to the float one."""
    from cdsl_struct.models import int8

    real, check = torch.ops.quantized.linear_dynamic, int8.full_range.__wrapped__
    asked = []

    def spy(x, packed, reduce_range):
        asked.append(reduce_range)
        return real(x, packed, reduce_range)

    torch.manual_seed(0)
    weight, x = torch.randn(96, 64) * 0.05, torch.randn(8, 64)
    matrix, full = int8.Int8Matrix(weight, None), int8.full_range()  # checked once, before the spy
    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", spy)
    out = matrix(x)
    assert asked == [not full]
    if full:
        monkeypatch.setattr(int8, "full_range", lambda: False)
        seven = matrix(x)
        exact = x @ weight.T
        assert (out - exact).abs().mean() < 0.75 * (seven - exact).abs().mean()

    def saturating(x, packed, reduce_range):  # pairs of u8 x s8 products clamped to 16 bits, as AVX2's
        out = real(x, packed, reduce_range)
        return out if reduce_range else out.clamp(max=32767 * x.shape[-1] / 2 - 1)

    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", saturating)
    assert not check()
    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", real)
    monkeypatch.setenv("CDSL_INT8_BITS", "7")  # the switch: 7 bits whatever the kernels
    assert not check()
    monkeypatch.delenv("CDSL_INT8_BITS")
    assert check() == full


def test_a_shared_prefix_is_copied_whole_and_rows_stay_the_same_in_any_order(smollm2, one_torch_thread):
    """``share_prefix`` on the int8 self-draft's runner (no prefix cache): rows starting with the prefix
    copy its keys and feed only the rest; a row's logits are bitwise the same whether it joins with
    others or alone, first or later, and a row not starting with it is as without it."""
    from cdsl_struct.models.runner import self_draft

    draft = self_draft(smollm2.model, "int8")
    header = [(7 * i + 3) % 49152 for i in range(20)]
    rows = {"a": header + [11, 12, 13, 14, 15], "b": header + [21, 22, 23, 24, 25, 26, 27, 28, 29],
            "c": [(5 * i + 1) % 49152 for i in range(12)]}
    assert not RaggedRunner(draft).shared and RaggedRunner(draft).share_prefix(header) is None  # a prefix cache: no-op

    def shared_runner():
        runner = RaggedRunner(draft, prefix_cache_bytes=0)
        runner.share_prefix(header)
        assert list(runner.shared) == [tuple(header)] and runner.passes == 1
        return runner

    together = shared_runner()
    before = together.positions
    first = together.run([Feed(name, ids, 1) for name, ids in rows.items()])
    assert together.positions - before == 5 + 9 + 12  # the header copied, not fed
    then = together.run([Feed(name, ids + [40], 1) for name, ids in rows.items()])
    for index, (name, ids) in enumerate(rows.items()):
        alone = shared_runner()
        alone.run([Feed("other", rows["c"] + [1, 2], 1)])  # another row before it
        assert torch.equal(alone.run([Feed(name, ids, 1)])[0], first[index]), name
        assert torch.equal(alone.run([Feed(name, ids + [40], 1)])[0], then[index]), name
    plain = RaggedRunner(draft, prefix_cache_bytes=0)
    assert torch.equal(plain.run([Feed("c", rows["c"], 1)])[0], first[2])
