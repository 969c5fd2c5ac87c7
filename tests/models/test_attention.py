"""Decode-step attention: matches transformers' SDPA, reads a growing buffer whole, falls back elsewhere."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from cdsl_struct.models import attention
from cdsl_struct.models.attention import DECODE_ATTENTION, _whole_buffer, decode_attention, use_decode_attention
from cdsl_struct.models.batch import BatchRunner, Feed
from cdsl_struct.models.growing_cache import _Growing


class _Module:  # what the attention functions read off a layer
    num_key_value_groups = 3
    is_causal = True
    training = False


def _inputs(dtype, rows=4, length=30, queries=1, capacity=None):
    torch.manual_seed(0)
    buffer_k = torch.randn(rows, 2, capacity or length, 16, dtype=dtype)
    buffer_v = torch.randn(rows, 2, capacity or length, 16, dtype=dtype)
    query = torch.randn(rows, 6, queries, 16, dtype=dtype)
    mask = torch.ones(rows, 1, queries, length, dtype=torch.bool).tril(diagonal=length - queries)  # causal
    for row in range(rows):
        mask[row, ..., :5 * row] = False  # left padding, as a batch of rows of different lengths
    return query, buffer_k[:, :, :length], buffer_v[:, :, :length], mask


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(attention, "MIN_WORK", 0)  # the path for small test shapes too


@pytest.mark.parametrize("queries", [1, 4])
def test_a_bf16_step_matches_sdpa_with_one_query_or_a_few(any_size, queries):
    query, key, value, mask = _inputs(torch.bfloat16, queries=queries, capacity=48)
    assert not key.is_contiguous() and _whole_buffer(key).shape[2] == 48  # the spare 18 positions, masked
    ours, _ = decode_attention(_Module(), query, key, value, mask, scaling=0.25)
    reference, _ = sdpa_attention_forward(_Module(), query, key, value, mask, scaling=0.25)
    assert ours.shape == reference.shape == (4, queries, 6, 16)
    assert torch.allclose(ours.float(), reference.float(), atol=2e-2, rtol=2e-2)


def test_other_calls_are_transformers_sdpa_exactly():
    prompt = attention.MAX_QUERIES + 1
    for dtype, queries, rows in ((torch.float32, 1, 80), (torch.bfloat16, prompt, 80), (torch.bfloat16, 1, 4)):
        query, key, value, mask = _inputs(dtype, rows=rows, queries=queries, capacity=40)
        ours, _ = decode_attention(_Module(), query, key, value, mask, scaling=0.25)
        reference, _ = sdpa_attention_forward(_Module(), query, key, value, mask, scaling=0.25)
        assert torch.equal(ours, reference), (dtype, queries, rows)  # fp32; prompts; below MIN_WORK


def test_whole_buffer_only_for_leading_slices_of_a_contiguous_buffer():
    growing = _Growing()
    growing.append(torch.randn(2, 3, 10, 8))
    view = growing.view()
    assert not view.is_contiguous() and _whole_buffer(view).data_ptr() == growing.buffer.data_ptr()
    assert _whole_buffer(view).shape == growing.buffer.shape
    assert torch.count_nonzero(growing.buffer[:, :, 10:]) == 0  # spare positions are zeros, never garbage
    assert _whole_buffer(growing.buffer[:, :, 2:6]) is None  # read whole, it would run past the storage
    assert _whole_buffer(torch.randn(2, 8, 3, 10).transpose(1, 3)) is None


def test_a_bf16_batch_decodes_as_its_rows_do_alone(any_size):
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=50, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval().to(torch.bfloat16)
    assert use_decode_attention(model) and model.config._attn_implementation == DECODE_ATTENTION
    runner = BatchRunner(model, prefix_cache_bytes=0)
    sequences = {"a": [1, 2, 3, 4, 5, 6, 7, 8, 9], "b": [9, 8], "c": [4, 4, 4, 4]}
    runner.run([Feed(r, s, 1) for r, s in sequences.items()])
    for step in range(3):
        for row in sequences:
            sequences[row] = sequences[row] + [10 + step]
        batched = runner.run([Feed(r, s, 1) for r, s in sequences.items()])
    for row in sequences:  # a speculation step: three positions per row, logits of all three
        sequences[row] = sequences[row] + [20, 21, 22]
    speculated = runner.run([Feed(r, s, 3) for r, s in sequences.items()])
    model.set_attn_implementation("sdpa")
    alone = [BatchRunner(model, prefix_cache_bytes=0).run([Feed(r, s, 3)])[0] for r, s in sequences.items()]
    for ours, theirs in zip(speculated, alone, strict=True):
        assert ours.shape == theirs.shape == (3, 50)
        assert torch.allclose(ours, theirs, atol=5e-2, rtol=5e-2)
    assert all(torch.isfinite(logits).all() for logits in batched)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_one_query_row_attends_unmasked_with_the_masks_bits(dtype):
    """``row_attention`` sends SDPA no mask for one query without a window (the CPU's masked path):
    bitwise what the all-true mask gives, at any length; a windowed row keeps its mask."""
    torch.manual_seed(0)
    for length in (1, 7, 64, 65, 300, 513, 1100):
        query = torch.randn(1, 9, 1, 64, dtype=dtype)
        keys, values = torch.randn(1, 3, length, 64, dtype=dtype), torch.randn(1, 3, length, 64, dtype=dtype)
        causal = torch.ones(1, length, dtype=torch.bool)
        masked = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=causal, scale=0.125,
                                                                  enable_gqa=True)
        assert torch.equal(attention.row_attention(query, keys, values, causal, 0.125, 3, True), masked), length
    window = causal.clone()
    window[:, :length - 4] = False
    windowed = attention.row_attention(query, keys, values, window, 0.125, 3, True, windowed=True)
    assert not torch.equal(windowed, masked)
