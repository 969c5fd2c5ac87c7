"""Prepacked linear layers: same results as nn.Linear, same module tree, safe under copies and casts."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from cdsl_struct.models import packed
from cdsl_struct.models.packed import (
    PackedLinear,
    _fused,
    _packed,
    pack_linears,
    packable_dtypes,
    packing_available,
    unpack_linears,
)
from cdsl_struct.models.runner import self_draft

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN")


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.SiLU(), nn.Linear(96, 32, bias=False)).eval()


def test_packed_linears_match_plain_ones_and_keep_the_state_dict():
    model = _mlp()
    keys = list(model.state_dict())
    x = torch.randn(3, 5, 64)
    with torch.inference_mode():
        expected = model(x)
    assert pack_linears(model) == 2
    assert all(type(m) is PackedLinear for m in model if isinstance(m, nn.Linear))
    assert list(model.state_dict()) == keys
    with torch.inference_mode():
        got = model(x)
    assert got.shape == expected.shape == (3, 5, 32)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_a_changed_or_cast_weight_is_repacked():
    model = _mlp()
    pack_linears(model)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        model(x)
        model[2].weight.mul_(2)  # in place: same storage, new version
    plain = copy.deepcopy(model)
    unpack_linears(plain)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), plain(x), atol=1e-4, rtol=1e-4)
    model.to(torch.bfloat16)
    plain.to(torch.bfloat16)
    with torch.inference_mode():
        got = model(x.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), plain(x.bfloat16()).float(), atol=5e-2, rtol=5e-2)


def test_autograd_takes_the_stock_path():
    model = _mlp()
    pack_linears(model)
    x = torch.randn(2, 64, requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None and model[0].weight.grad is not None


def test_unpack_restores_plain_linears():
    model = _mlp()
    pack_linears(model)
    assert unpack_linears(model) == 2
    assert all(type(m) is nn.Linear for m in model if isinstance(m, nn.Linear))


class _Block(nn.Module):
    """The projections of an attention block and a gated MLP, by the names HF decoders use."""

    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(32, n, bias=bias) for n in (32, 8, 8))
        self.gate_proj, self.up_proj = nn.Linear(32, 48, bias=bias), nn.Linear(32, 48, bias=bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.q_proj(x), self.k_proj(x), self.v_proj(x), self.gate_proj(x), self.up_proj(x)]


@pytest.mark.parametrize("bias", [False, True])
def test_sibling_projections_share_one_packed_matrix_and_give_their_own_outputs(bias):
    block = _Block(bias).eval()
    plain = copy.deepcopy(block)
    pack_linears(block)
    assert all(m in _fused for m in block.children())
    x = torch.randn(3, 2, 32)
    with torch.inference_mode():
        for got, expected in zip(block(x), plain(x), strict=True):
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert not any(m in _packed for m in block.children())  # no separate copies beside the fused ones
        # a sibling asked twice for one input, or for another input, computes afresh
        torch.testing.assert_close(block.q_proj(x), plain.q_proj(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(block.q_proj(x), plain.q_proj(x), atol=1e-4, rtol=1e-4)
        other = torch.randn(5, 32)
        torch.testing.assert_close(block.k_proj(other), plain.k_proj(other), atol=1e-4, rtol=1e-4)
        block.v_proj.weight.mul_(3)  # in place: the group repacks
        plain.v_proj.weight.mul_(3)
        for got, expected in zip(block(x), plain(x), strict=True):
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    unpack_linears(block)
    assert not any(m in _fused for m in block.children())


def test_siblings_that_cannot_share_a_matrix_stay_apart():
    block = _Block()
    block.k_proj = nn.Linear(32, 8, bias=True)  # one sibling with a bias, the others without
    pack_linears(block)
    assert not any(m in _fused for m in (block.q_proj, block.k_proj, block.v_proj))
    assert block.gate_proj in _fused and block.up_proj in _fused


def _bf16_outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.to(torch.bfloat16)
    with torch.inference_mode():
        out = model(x.bfloat16())
        return [out, *model(x.bfloat16())] if isinstance(out, torch.Tensor) else [*out, *model(x.bfloat16())]


def _plain_copy(model: nn.Module) -> nn.Module:
    plain = copy.deepcopy(model)
    unpack_linears(plain)
    return plain


def test_bf16_takes_the_stock_path_where_this_cpu_packs_no_bf16(monkeypatch):
    """An AVX2-only CPU (oneDNN has no bfloat16 path there): bfloat16 linears are never handed to
    oneDNN, and give exactly what plain ``nn.Linear`` gives; float32 still packs."""
    monkeypatch.setattr(packed, "packable_dtypes", lambda: frozenset({torch.float32}))
    reordered = []
    real = packed._reorder
    monkeypatch.setattr(packed, "_reorder", lambda weight: reordered.append(weight.dtype) or real(weight))
    for model, x in ((_mlp(), torch.randn(3, 64)), (_Block().eval(), torch.randn(2, 32))):
        pack_linears(model)
        plain = _plain_copy(model)
        with torch.inference_mode():
            model(x)
        assert reordered == [torch.float32] * len(reordered) and reordered
        for got, expected in zip(_bf16_outputs(model, x), _bf16_outputs(plain, x), strict=True):
            assert got.dtype is torch.bfloat16
            torch.testing.assert_close(got, expected, atol=0, rtol=0)
        assert reordered == [torch.float32] * len(reordered)


def test_a_dtype_onednn_refuses_falls_back_once_with_a_warning(monkeypatch, caplog):
    """Where oneDNN refuses a weight that ``packable_dtypes`` promised (as it refuses bfloat16 on an
    AVX2-only CPU), the forward still answers, on the stock path, and says so once."""
    monkeypatch.setattr(packed, "packable_dtypes", lambda: frozenset({torch.float32, torch.bfloat16}))
    monkeypatch.setattr(packed, "_refused", set())

    def refuse(weight: torch.Tensor, rows: int) -> torch.Tensor:
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    for model, x in ((_mlp(), torch.randn(3, 64)), (_Block().eval(), torch.randn(2, 32))):
        pack_linears(model)
        plain = _plain_copy(model)
        with caplog.at_level("WARNING", logger=packed.__name__):
            for got, expected in zip(_bf16_outputs(model, x), _bf16_outputs(plain, x), strict=True):
                torch.testing.assert_close(got, expected, atol=0, rtol=0)
    warnings = [r for r in caplog.records if "cannot prepack" in r.getMessage()]
    assert len(warnings) == 1 and "bfloat16" in warnings[0].getMessage()
    assert packed._refused == {torch.bfloat16}


def test_this_cpu_packs_bf16_only_where_onednn_has_its_path():
    assert torch.float32 in packable_dtypes()
    assert (torch.bfloat16 in packable_dtypes()) == torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_pack_off_packs_nothing(monkeypatch):
    monkeypatch.setenv("CDSL_PACK", "0")
    model = _mlp()
    assert packable_dtypes() == frozenset() and pack_linears(model) == 0
    assert all(type(m) is nn.Linear for m in model if isinstance(m, nn.Linear))


def test_the_loaded_model_is_packed_and_its_int8_draft_still_quantises(smollm2):
    model = smollm2.model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is PackedLinear for m in linears)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied weights stay tied
    draft = self_draft(model, "int8")
    from cdsl_struct.models.int8 import TokenScaledInt8Linear

    assert sum(isinstance(m, TokenScaledInt8Linear) for m in draft.modules()) == len(linears)
    assert not any(isinstance(m, nn.Linear) for m in draft.modules())
    assert all(type(m) is PackedLinear for m in model.modules() if isinstance(m, nn.Linear))


def test_the_packed_model_predicts_what_the_plain_one_does(smollm2):
    """Real weights: the packed forward's logits equal the stock forward's to float32 rounding and
    pick the same next token at every position."""
    model, tokenizer = smollm2.model, smollm2.tokenizer
    ids = torch.tensor([tokenizer.encode("The capital of France is Paris, and the capital of Italy is")])
    plain = copy.deepcopy(model)
    unpack_linears(plain)
    with torch.inference_mode():
        packed_logits = model(input_ids=ids).logits
        plain_logits = plain(input_ids=ids).logits
    torch.testing.assert_close(packed_logits, plain_logits, atol=2e-3, rtol=1e-3)
    assert torch.equal(packed_logits.argmax(-1), plain_logits.argmax(-1))


@pytest.mark.parametrize("bias", [False, True])
def test_a_compiled_block_multiplies_by_the_prepacked_matrices_and_equals_the_plain_one(bias):
    """``prepack`` keeps each layer's packed weight (a sibling: its group's, and its columns) where a traced
    forward reads it; compiled, the block gives the plain block's outputs through ``packed_linear``."""
    from cdsl_struct.models.packed import TRACED, prepack

    block = _Block(bias).eval()
    plain = copy.deepcopy(block)
    pack_linears(block)
    if torch.float32 not in packable_dtypes():
        pytest.skip("this CPU packs no float32")
    assert prepack(block) == 5
    spans = [getattr(block, name).__dict__[TRACED][2:] for name in ("q_proj", "k_proj", "v_proj")]
    assert spans == [(0, 32), (32, 40), (40, 48)]
    assert block.q_proj.__dict__[TRACED][0] is block.v_proj.__dict__[TRACED][0]  # one matrix for the group
    x = torch.randn(3, 2, 32)
    with torch.inference_mode():
        run = torch.compile(block, dynamic=False, fullgraph=True)
        run(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            compiled = run(x)
        expected = plain(x)
    assert sum(e.name == "cdsl_struct::packed_linear" for e in prof.events()) == 5  # no pass merged them here
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(compiled, expected, strict=True))
