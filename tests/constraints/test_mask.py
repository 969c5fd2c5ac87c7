"""Bitmask unpacking: the host path (numpy, what a CPU's logits get) and the device path (torch
shifts, what a GPU's logits get, run here on the CPU) agree bit for bit with the layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cdsl_struct.constraints import mask
from cdsl_struct.constraints.mask import (
    allocate_bitmask,
    apply_bitmask,
    clear_bit,
    is_allowed,
    set_bit,
    unpack_bitmask,
    unpack_by_shifts,
    unpack_on_host,
)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_both_unpackings_follow_the_layout(shape):
    generator = torch.Generator().manual_seed(0)
    words = torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, generator=generator)
    expected = np.zeros((*shape, 32), dtype=bool)
    for index in np.ndindex(*shape):
        word = int(words[index]) & 0xFFFFFFFF
        expected[index] = [(word >> bit) & 1 for bit in range(32)]
    expected = torch.from_numpy(expected.reshape(*shape[:-1], -1))
    assert torch.equal(unpack_on_host(words), expected)
    assert torch.equal(unpack_by_shifts(words), expected)
    assert torch.equal(unpack_bitmask(words, torch.device("cpu")), expected)


def test_a_strided_view_of_the_engines_buffer_unpacks_as_a_copy_would():
    buffer = torch.randint(-2**31, 2**31 - 1, (6, 4), dtype=torch.int32)
    view = buffer[1:5, :3]
    assert torch.equal(unpack_on_host(view), unpack_by_shifts(view.contiguous()))


@pytest.mark.parametrize("kernels", ["host", "device"])
def test_apply_bitmask_allows_only_the_set_bits_and_bans_the_padded_columns(monkeypatch, kernels):
    """The CPU's numpy kernel and the torch ops a GPU runs (forced here) mask alike."""
    if kernels == "device":
        monkeypatch.setattr(mask, "host_kernels", lambda logits: False)
    vocab = 70
    rows = allocate_bitmask(vocab, 2)
    for token in (0, 31, 32, 69):
        set_bit(rows[0], token)
    set_bit(rows[1], 5)
    logits = torch.randn(2, 80)  # wider than the vocabulary (70), narrower than the mask (96 bits)
    masked = apply_bitmask(logits.clone(), rows)
    assert torch.isfinite(masked[0]).nonzero().flatten().tolist() == [0, 31, 32, 69]
    assert torch.isfinite(masked[1]).nonzero().flatten().tolist() == [5]
    assert torch.equal(masked[0, [0, 31]], logits[0, [0, 31]])


@pytest.mark.parametrize("token", [0, 5, 31, 32, 63, 95])
def test_a_bit_set_then_cleared_leaves_every_other_bit(token):
    row = allocate_bitmask(96)
    row[:] = -1  # every bit set
    clear_bit(row, token)
    assert not is_allowed(row, token) and all(is_allowed(row, t) for t in range(96) if t != token)
    set_bit(row, token)
    assert bool((row == -1).all())
