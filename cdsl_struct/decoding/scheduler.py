"""Which waiting rows join the engine's running batch (``Scheduler``: first come, first served,
within a row count, a KV memory budget and a per-step prefill budget), and the budgets' defaults
for a device."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..models.batch import padded_reserve
from .rows import Row

#: prompt positions a step prefills on a CPU before later arrivals wait for the next step (about
#: half a second of prefill on two AVX-512 cores in bfloat16); a GPU's is ``default_prefill_budget``'s
DEFAULT_PREFILL_BUDGET = 512


class Scheduler:
    """Which waiting requests join the batch: first come, first served, while the batch stays
    within ``max_batch_size`` rows and ``kv_budget_bytes``. ``reserved_positions(sequences,
    longest)`` is what the runner's cache may hold for that many sequences of at most ``longest``
    positions (the runner's own rule: ``padded_reserve`` for the padded cache, whose holes from
    rejected speculation may stretch it to twice the longest row before it compacts; the ragged
    runner's slots and their spare room). A request that would not fit waits; one that exceeds the
    budget alone runs alone.

    ``prefill_budget``: prompt positions one step may prefill (``prefill_cost`` of a row: its
    positions not already in the prefix cache). Rows arriving together join over several steps,
    each followed by a decode step of the running rows, so that a burst of long prompts does not
    stall every decoding row for the whole burst's prefill (vLLM's chunked prefill bounds a step
    the same way). A step always admits its first fitting row, however long its prompt."""

    def __init__(self, max_batch_size: int, kv_budget_bytes: float, bytes_per_token: int,
                 prefill_budget: int | None = None, prefill_cost: Callable[[Row], int] | None = None,
                 reserved_positions: Callable[[int, int], int] | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefill_budget is not None and prefill_budget < 1:
            raise ValueError(f"prefill_budget must be >= 1, got {prefill_budget}")
        self.max_batch_size = max_batch_size
        self.kv_budget_bytes = kv_budget_bytes
        self.bytes_per_token = bytes_per_token
        self.prefill_budget = prefill_budget
        self.prefill_cost = prefill_cost or (lambda row: len(row.request.prompt))
        self.reserved_positions = reserved_positions or padded_reserve
        self.waiting: deque[Row] = deque()
        self.running: list[Row] = []

    def fits(self, row: Row) -> bool:
        """Whether ``row`` may join the running rows now (alone it always may)."""
        rows = self.running + [row]
        if len(rows) > self.max_batch_size:
            return False
        positions = self.reserved_positions(sum(r.request.sequences for r in rows),
                                            max(r.request.sequence_tokens for r in rows))
        return positions * self.bytes_per_token <= self.kv_budget_bytes or not self.running

    def admit(self) -> list[Row]:
        """Move the rows that fit from the queue into the batch, in arrival order."""
        admitted, prefill = [], 0
        while self.waiting and self.fits(self.waiting[0]):
            if self.prefill_budget is not None:
                cost = self.prefill_cost(self.waiting[0])
                if admitted and prefill + cost > self.prefill_budget:
                    break
                prefill += cost
            row = self.waiting.popleft()
            self.running.append(row)
            admitted.append(row)
        return admitted



def default_prefill_budget(device: Any, total_memory: int | None = None) -> int:
    """Prompt positions one step prefills by default on ``device``: ``DEFAULT_PREFILL_BUDGET`` on a
    CPU (tuned on two cores); on a GPU the per-step token budget vLLM's server starts with, 8192 on
    a card of 70 GiB or more (H100, H200) and 2048 on a smaller one (or on MPS), where a prefill of
    that size costs a few tens of milliseconds. ``total_memory``: the card's bytes (default: asked
    of CUDA)."""
    device = torch.device(device)
    if device.type == "cpu":
        return DEFAULT_PREFILL_BUDGET
    if device.type == "cuda":
        if total_memory is None:
            total_memory = torch.cuda.get_device_properties(device).total_memory
        return 8192 if total_memory >= 70 * 2**30 else 2048
    return 2048


def default_kv_budget(device: Any) -> float:
    """A quarter of the memory free on ``device`` (the host's available RAM for the CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free / 4
    import psutil

    return psutil.virtual_memory().available / 4
