"""Token bitmasks: int32 words, bit ``i % 32`` of word ``i // 32`` allows token ``i``.

The same layout as llguidance, outlines-core and XGrammar, so engines write into our buffers
directly. Rows may be torch tensors (for the decoders) or numpy arrays (for the benchmarks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Bitmask = Any  # a contiguous 1-D int32 torch.Tensor or numpy.ndarray


def words_for(vocab_size: int) -> int:
    """Number of int32 words that hold one mask over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def allocate_bitmask(vocab_size: int, batch: int | None = None, *, backend: str = "torch") -> Bitmask:
    """A zeroed bitmask of ``batch`` rows (or one 1-D row when ``batch`` is None)."""
    shape = (words_for(vocab_size),) if batch is None else (batch, words_for(vocab_size))
    if backend == "numpy":
        return np.zeros(shape, dtype=np.int32)
    import torch

    return torch.zeros(shape, dtype=torch.int32)


def row_pointer(row: Bitmask, vocab_size: int) -> tuple[int, int]:
    """Address and byte size of a mask row, after checking its dtype, shape and layout."""
    need = words_for(vocab_size)
    if isinstance(row, np.ndarray):
        if row.dtype != np.int32 or row.ndim != 1 or row.shape[0] != need or not row.flags.c_contiguous:
            raise ValueError(f"mask row must be a contiguous 1-D int32 array of {need} words")
        return row.ctypes.data, row.nbytes
    import torch

    if row.dtype != torch.int32 or row.dim() != 1 or row.shape[0] != need or not row.is_contiguous():
        raise ValueError(f"mask row must be a contiguous 1-D int32 tensor of {need} words")
    if row.device.type != "cpu":
        raise ValueError("mask rows are filled on the CPU; copy to the device afterwards")
    return row.data_ptr(), row.numel() * 4


def clear_bitmask(row: Bitmask) -> None:
    row[:] = 0


def set_bit(row: Bitmask, token_id: int) -> None:
    word, bit = divmod(token_id, 32)
    value = int(row[word]) | (1 << bit)
    row[word] = value - (1 << 32) if value >= 1 << 31 else value


def clear_bit(row: Bitmask, token_id: int) -> None:
    word, bit = divmod(token_id, 32)
    value = (int(row[word]) & 0xFFFFFFFF) & ~(1 << bit)
    row[word] = value - (1 << 32) if value >= 1 << 31 else value


def is_allowed(row: Bitmask, token_id: int) -> bool:
    """Whether ``token_id`` is allowed by a mask row."""
    word, bit = divmod(token_id, 32)
    return bool((int(row[word]) >> bit) & 1)


def allowed_tokens(row: Bitmask, vocab_size: int) -> list[int]:
    """All allowed token ids of a mask row, ascending."""
    words = np.asarray(row.numpy() if hasattr(row, "numpy") else row, dtype=np.int32)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits).tolist()


def allows_only(row: Bitmask, tokens: Any, vocab_size: int) -> bool:
    """Whether a mask row allows no token outside ``tokens`` (vectorised: no list of allowed ids)."""
    words = np.asarray(row.numpy() if hasattr(row, "numpy") else row, dtype=np.int32)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size]
    inside = [t for t in tokens if 0 <= t < vocab_size]
    if inside:
        bits[inside] = 0
    return not bits.any()


def apply_bitmask(logits: Any, row: Bitmask) -> Any:
    """Set disallowed logits to ``-inf`` in place (torch; last dimension is the vocabulary).

    ``row`` may be one mask row or a batch of rows (one per leading index of ``logits``); it is
    copied to the logits' device packed and unpacked there. Logit columns past the mask (models
    often pad their vocabulary) are disallowed too.
    """
    import torch

    words = row if isinstance(row, torch.Tensor) else torch.from_numpy(row)
    if host_kernels(logits) and words.device.type == "cpu":
        mask_on_host(logits.numpy(), words)
        return logits
    allowed = unpack_bitmask(words, logits.device)
    width = min(allowed.shape[-1], logits.shape[-1])
    logits[..., width:] = float("-inf")
    logits[..., :width].masked_fill_(~allowed[..., :width], float("-inf"))
    return logits


def host_kernels(logits: Any) -> bool:
    """Whether masking and choosing over ``logits`` run as numpy kernels on their memory (float32 on
    the CPU: numpy's masked copy and argmax are 5-10x torch's there) rather than as torch ops."""
    import torch

    return logits.device.type == "cpu" and logits.dtype == torch.float32


def mask_on_host(logits: np.ndarray, words: Any) -> None:
    """``apply_bitmask`` of float32 logits held in host memory, in numpy: ``-inf`` copied in where
    the mask refuses, in place (torch's ``masked_fill_`` took 6-13 ms over 64 rows of a 49k
    vocabulary on an AVX2 core, this 1.2)."""
    refused = _bits(words) == 0
    width = min(refused.shape[-1], logits.shape[-1])
    logits[..., width:] = -np.inf
    np.copyto(logits[..., :width], np.float32(-np.inf), where=refused[..., :width])


def unpack_bitmask(words: Any, device: Any) -> Any:
    """A bool tensor on ``device``, one element per bit of ``words`` (``[..., words * 32]``).

    A mask bound for a CPU's logits is unpacked by numpy's ``unpackbits`` (one pass over the
    bytes; torch's shift-and-compare over an ``[..., words, 32]`` int32 tensor made 32x the
    data and cost most of a step's host time at 64 rows). One bound for a GPU crosses packed
    (32x fewer bytes) and is unpacked there by the shift and compare, in parallel."""
    if device.type == "cpu" and words.device.type == "cpu":
        return unpack_on_host(words)
    return unpack_by_shifts(words.to(device, non_blocking=True))


def unpack_on_host(words: Any) -> Any:
    """``unpack_bitmask`` of a CPU tensor, by numpy."""
    import torch

    return torch.from_numpy(_bits(words)).view(torch.bool)


def _bits(words: Any) -> np.ndarray:
    """Each bit of a CPU tensor's int32 words as a uint8 0 or 1 (``[..., words * 32]``)."""
    return np.unpackbits(words.contiguous().numpy().view(np.uint8), axis=-1, bitorder="little")


def unpack_by_shifts(words: Any) -> Any:
    """``unpack_bitmask`` where ``words`` are, by torch ops (what runs on a GPU)."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 1).reshape(*words.shape[:-1], -1).bool()
