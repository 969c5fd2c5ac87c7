"""Filling a step's deferred masks into the engine's bitmask, off the engine's thread: the
llguidance rows whose masks are all deferred in one call that llguidance spreads over its own
threads (no GIL held: ``fill_drafted_masks``), every other row by ``loop.fill_deferred_masks``.
Each job carries its row's place in the step, so errors come back to the right row. A draft's
mask is filled on a worker thread while the draft's pass runs (``draft_with_mask``)."""

from __future__ import annotations

import functools
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import torch

from .loop import Proposal, Session, fill_deferred_masks
from .rows import Row

MaskJob = tuple[int, tuple[tuple[Row, Proposal], torch.Tensor]]
"""A row's place in the step, the row and its proposal, and its block of the step's bitmask."""


def fill_masks(jobs: list[MaskJob]) -> list[tuple[int, BaseException | None]]:
    """Fill each row's deferred masks into its block; per row, its index and the error its
    constraint raised or None."""
    errors: list[tuple[int, BaseException | None]] = []
    for index, ((row, proposal), block) in jobs:
        try:
            fill_deferred_masks(row.session, proposal, block)
            errors.append((index, None))
        except Exception as exc:  # noqa: BLE001 - the row ends with its own error
            errors.append((index, exc))
    return errors


def split_mask_jobs(jobs: list[MaskJob]) -> tuple[list[MaskJob], list[MaskJob]]:
    """The jobs whose masks can be filled together in one llguidance call (every mask of the
    proposal deferred, on an llguidance state: ``fill_drafted_masks``), and the rest."""
    from ..constraints.backends.llguidance_backend import parallel_fill_supported

    together, alone = [], []
    for job in jobs:
        (row, proposal), _ = job[1]
        state = row.session.state
        fits = all(mask is None for mask in proposal.masks) and parallel_fill_supported(state) \
            and not (state.finished and not proposal.tokens)  # finished before the step: fill_mask clears
        (together if fits else alone).append(job)
    return together, alone


def fill_masks_together(jobs: list[MaskJob], bitmask: torch.Tensor) -> list[tuple[int, BaseException | None]]:
    """``fill_masks`` for llguidance rows whose masks are all deferred, in one parallel call (its
    threads hold no GIL); a row it could not fill goes the usual way."""
    from ..constraints.backends.llguidance_backend import fill_drafted_masks

    base = bitmask.data_ptr()
    row_bytes = bitmask.stride(0) * bitmask.element_size()
    try:
        done = fill_drafted_masks([(row.session.state, list(proposal.tokens), (block.data_ptr() - base) // row_bytes)
                                   for _, ((row, proposal), block) in jobs], bitmask)
    except Exception:  # noqa: BLE001 - the usual way reports each row's own error
        return fill_masks(jobs)
    for (_, ((_, proposal), block)), ok in zip(jobs, done, strict=True):
        if ok:
            proposal.masks[:] = list(block)
    return [(index, None) for (index, _), ok in zip(jobs, done, strict=True) if ok] + \
        fill_masks([job for job, ok in zip(jobs, done, strict=True) if not ok])


@functools.cache
def _draft_mask_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="cdsl-draft-masks")


def draft_with_mask(session: Session, passes: Any) -> Generator[Any, list[torch.Tensor], tuple[list[torch.Tensor],
                                                                                              torch.Tensor]]:
    """Yield ``passes`` (a draft pass a step program asks for) and return what it gave with the
    session's mask at its current position, filled on a worker thread meanwhile: the mask depends
    only on the tokens before the pass, and the engines fill it without the GIL (CommonGen's
    30,000-word grammar: 1.5 ms a mask). The state is left alone until the fill is done, also when
    the program is closed or fails."""
    pending = _draft_mask_pool().submit(session.current_mask)
    try:
        outputs = yield passes
    except BaseException:
        wait([pending])  # nothing else may touch the state while the worker reads it
        raise
    return outputs, pending.result()
