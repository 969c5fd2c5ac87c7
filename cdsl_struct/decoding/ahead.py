"""Steps launched ahead: step N + 1's forward started before the host reads step N's tokens
(vLLM's asynchronous scheduling, for plain decode rows).

A plain decode row feeds one token a step, the one just chosen. That token already lies on the
device once the step's masked argmax (or draw) has run, so the next forward need not wait for the
host to read it: the engine launches it from the device tokens (``GraphRunner.run_ahead``), then
reads step N's tokens back, commits and streams them and fills step N + 1's masks while the card
runs step N + 1. The next step takes the launched forward's logits instead of running one.

Which steps may (``ahead_allowed``): every running row fed exactly one position (no draft or
forced tokens to verify, no strategy program), every row's proposers only the grammar's forced
tokens (a row with a draft would lose its drafts), and no waiting row that could join now (a
launched step admits nobody: a joining row waits one step at most). A row whose token budget ends
with this step is left out. While steps run ahead, forced tokens come one a step (their masks
allow one token, so the argmax is the forced token): the text is the same, the steps are more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .loop import Proposal
from .rows import Row
from .scheduler import Scheduler


@dataclass
class Ahead:
    """A launched step: its rows, the logits of their next position (``[rows, vocab]``, on the
    device) with each row's offset in them, and the seconds the launch took."""

    rows: list[Row]
    logits: torch.Tensor
    offsets: dict[Hashable, int]
    seconds: float

    def covers(self, rows: Sequence[Row]) -> bool:
        """Whether every one of ``rows`` was fed by this step."""
        return all(row.row_id in self.offsets for row in rows)


def ahead_allowed(rows: Sequence[tuple[Row, Proposal, int]], scheduler: Scheduler, positions: int) -> bool:
    """Whether the step whose committing rows are ``rows`` ((row, proposal, its first logit row)),
    over ``positions`` logit rows, may launch the next one before its read (module docstring)."""
    if not rows or len(rows) != len(scheduler.running) or positions != len(rows):
        return False
    if any(proposal.tokens or start != i for i, (_, proposal, start) in enumerate(rows)):
        return False
    if any(p.name != "forced" for row, _, _ in rows for p in row.request.proposers):
        return False
    return not scheduler.waiting or not scheduler.fits(scheduler.waiting[0])


def launch_ahead(runner: Any, rows: Sequence[Row], choices: torch.Tensor, drawn: torch.Tensor | None,
                 draw_rows: Sequence[int]) -> Ahead | None:
    """Launch the next step of ``rows`` (logit row ``i`` is ``rows[i]``'s) from their tokens on the
    device: ``choices`` (each logit row's masked argmax) where a row is greedy, ``drawn[j]`` for
    logit row ``draw_rows[j]`` where it samples. Rows whose budget this step spends are left out.
    None when nothing was launched."""
    device = choices.device
    tokens = choices[:len(rows)]
    if draw_rows:
        tokens = tokens.index_copy(0, _on(device, draw_rows), drawn)
    going = [i for i, row in enumerate(rows) if len(row.session.output) + 1 < row.request.max_tokens]
    if not going:
        return None
    if len(going) < len(rows):
        tokens = tokens.index_select(0, _on(device, going))
    started = time.perf_counter()
    launched = runner.run_ahead([rows[i].row_id for i in going], tokens)
    if launched is None:
        return None
    logits, offsets = launched
    return Ahead([rows[i] for i in going], logits, offsets, time.perf_counter() - started)


def _on(device: torch.device, indices: Sequence[int]) -> torch.Tensor:
    """``indices`` as an int64 tensor on ``device``, copied without waiting for the device's queue."""
    return torch.tensor(list(indices), dtype=torch.long).to(device, non_blocking=True)


def default_run_ahead(runner: Any) -> bool:
    """Whether an engine on ``runner`` launches steps ahead by default: where the runner replays CUDA
    graphs (on a CPU a step runs as it is launched: nothing to overlap). ``CDSL_RUN_AHEAD=1`` or
    ``0`` says so instead; never where the runner's launched steps failed the load-time self-check
    (``ahead_off``)."""
    if getattr(runner, "ahead_off", None) is not None:
        return False
    choice = os.environ.get("CDSL_RUN_AHEAD", "")
    if choice in ("0", "1"):
        return choice == "1"
    return getattr(runner, "graphs", None) is not None
