"""Strategies: a decoder's step written as a program of passes that the engine runs batched.

A strategy whose step needs more than "propose, one target pass, verify" (CDLH's roll-outs,
CDSL's reward-guided draft) writes the step as a generator: it yields ``Passes`` (positions it
needs scored by the target, or by a draft model), receives their logits, and returns the tokens
it committed. The engine runs the passes of every row together: one target forward per step for
all rows, one batched draft forward for all rows drafting on the same model. A strategy names
its sequences by local keys (``MAIN`` for the row's own sequence, anything hashable for a
branch); a branch starts from a copy of its parent's cache (``Feed.parent``) and lives until the
row's next step that does not feed it.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..models.batch import Feed


class _Main:
    """The type of ``MAIN``: a key of its own, never ``None`` (a ``Feed`` without a parent)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MAIN"


#: the local key of a row's own sequence
MAIN: Hashable = _Main()


@dataclass(frozen=True)
class Passes:
    """Positions a row's step needs scored next: by the target (``draft is None``) or by the
    draft model ``draft``, in one batched forward of the engine."""

    feeds: tuple[Feed, ...]
    draft: Any = None

    @classmethod
    def target(cls, *feeds: Feed) -> Passes:
        return cls(tuple(feeds))

    @classmethod
    def on_draft(cls, model: Any, sequence: Sequence[int]) -> Passes:
        """The draft's logits after ``sequence`` (the row's own draft sequence)."""
        return cls((Feed(MAIN, list(sequence), 1),), draft=model)


#: a strategy's step: yields Passes, receives their logits (one tensor ``[keep, vocab]`` per feed),
#: returns the committed tokens ([] = dead end)
StepProgram = Generator[Passes, list[torch.Tensor], list[int]]


class Strategy(Protocol):
    """A decoder whose step the engine drives as a program (CDLH, CDSL). Its step commits the
    tokens it returns into ``session`` (output and constraint state) itself."""

    @property
    def branches(self) -> int:
        """Sequences a step may branch into beside the row's own (cache the scheduler reserves)."""

    def steps(self, session: Any) -> StepProgram:
        """The program of one step of ``session``."""
