"""Filling a step's deferred masks into the engine's bitmask, off the engine's thread: the
llguidance rows whose masks are all deferred in one call that llguidance spreads over its own
threads (no GIL held: ``fill_drafted_masks``), the free-text rows in one copy of their precomputed
rows (``fill_text_masks``), every other row by ``loop.fill_deferred_masks``.
Each job carries its row's place in the step, so errors come back to the right row. A draft's
mask is filled on a worker thread while the draft's pass runs (``draft_with_mask``)."""

from __future__ import annotations

import functools
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import torch

from ..constraints.backends.text_backend import TextState, fill_text_masks
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
    """The jobs whose masks can be filled together (every mask of the proposal deferred, on an
    llguidance state: one parallel call, ``fill_drafted_masks``; on a free-text state: one copy,
    ``fill_text_masks``), and the rest."""
    together, alone = [], []
    for job in jobs:
        (row, proposal), _ = job[1]
        state = row.session.state
        fits = all(mask is None for mask in proposal.masks) and _fills_together(state) \
            and not (state.finished and not proposal.tokens)  # finished before the step: fill_mask clears
        (together if fits else alone).append(job)
    return together, alone


def _fills_together(state: Any) -> bool:
    """Whether a state's masks are filled with other rows' (free text, llguidance), not one by one."""
    from ..constraints.backends.llguidance_backend import parallel_fill_supported

    return isinstance(state, TextState) or parallel_fill_supported(state)


def fill_masks_together(jobs: list[MaskJob], bitmask: torch.Tensor) -> list[tuple[int, BaseException | None]]:
    """``fill_masks`` for the jobs ``split_mask_jobs`` put together: the free-text rows in one copy,
    the llguidance rows in one parallel call (its threads hold no GIL); a row llguidance could not
    fill goes the usual way."""
    from ..constraints.backends.llguidance_backend import fill_drafted_masks

    base = bitmask.data_ptr()
    row_bytes = bitmask.stride(0) * bitmask.element_size()

    def first_row(block: torch.Tensor) -> int:
        return (block.data_ptr() - base) // row_bytes

    text = [job for job in jobs if isinstance(job[1][0][0].session.state, TextState)]
    guided = [job for job in jobs if not isinstance(job[1][0][0].session.state, TextState)]
    fill_text_masks([(row.session.state, len(proposal.tokens), first_row(block))
                     for _, ((row, proposal), block) in text], bitmask)
    done = [True] * len(text)
    if guided:
        try:
            done += fill_drafted_masks([(row.session.state, list(proposal.tokens), first_row(block))
                                        for _, ((row, proposal), block) in guided], bitmask)
        except Exception:  # noqa: BLE001 - the usual way reports each row's own error
            return [(index, None) for index, _ in text] + fill_masks(guided)
    ordered = text + guided
    for (_, ((_, proposal), block)), ok in zip(ordered, done, strict=True):
        if ok:
            proposal.masks[:] = list(block)
    return [(index, None) for (index, _), ok in zip(ordered, done, strict=True) if ok] + \
        fill_masks([job for job, ok in zip(ordered, done, strict=True) if not ok])


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
