"""The in-place growing KV cache: appends without copying, crops keep the room, and a model
decoding through it sees what it sees through transformers' own DynamicCache."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from cdsl_struct.models.growing_cache import MIN_SPARE, GrowingLayer, growing_cache


def _states(rows: int, positions: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 2, positions, 4, generator=torch.Generator().manual_seed(seed))


def test_appends_go_into_spare_room_and_equal_concatenation():
    layer = GrowingLayer()
    first = _states(3, 5, 0)
    layer.update(first, first)
    buffer = layer._keys.buffer
    assert buffer.shape[2] == 5 + MIN_SPARE
    expected = first
    for seed in range(1, 4):
        step = _states(3, 2, seed)
        keys, values = layer.update(step, step)
        expected = torch.cat([expected, step], dim=2)
        assert torch.equal(keys, expected) and torch.equal(values, expected)
    assert layer._keys.buffer is buffer  # no reallocation while the room lasted
    for seed in range(4, 4 + MIN_SPARE):
        step = _states(3, 1, seed)
        keys, _ = layer.update(step, step)
        expected = torch.cat([expected, step], dim=2)
    assert layer._keys.buffer is not buffer and torch.equal(keys, expected)
    assert layer.get_seq_length() == expected.shape[2]


def test_a_leading_slice_keeps_the_buffer_and_other_tensors_replace_it():
    layer = GrowingLayer()
    states = _states(2, 6, 0)
    layer.update(states, states)
    buffer = layer._keys.buffer
    layer.keys, layer.values = layer.keys[:, :, :4], layer.values[:, :, :4]  # what a crop or a right trim does
    assert layer._keys.buffer is buffer and layer.get_seq_length() == 4
    step = _states(2, 1, 1)
    keys, _ = layer.update(step, step)
    assert torch.equal(keys, torch.cat([states[:, :, :4], step], dim=2))
    layer.keys, layer.values = keys[:1].clone(), keys[:1].clone()  # a row left: a new tensor
    assert layer._keys.buffer is not buffer and layer.keys.shape == (1, 2, 5, 4)
    keys, _ = layer.update(step[:1], step[:1])
    assert keys.shape == (1, 2, 6, 4) and torch.equal(keys[:, :, 5:], step[:1])


def test_a_model_decodes_alike_through_both_caches(smollm2):
    model = smollm2.model
    ids = torch.tensor([smollm2.tokenizer.encode("Name three colours: red, green and")])
    logits = {}
    for name, cache in (("dynamic", DynamicCache()), ("growing", growing_cache())):
        out = []
        with torch.inference_mode():
            step = model(input_ids=ids, past_key_values=cache, use_cache=True)
            for _ in range(5):
                token = step.logits[:, -1:].argmax(-1)
                out.append(step.logits[:, -1])
                step = model(input_ids=token, past_key_values=cache, use_cache=True)
        logits[name] = torch.cat(out)
        if name == "growing":
            assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    torch.testing.assert_close(logits["growing"], logits["dynamic"], atol=1e-4, rtol=1e-4)
    assert torch.equal(logits["growing"].argmax(-1), logits["dynamic"].argmax(-1))
