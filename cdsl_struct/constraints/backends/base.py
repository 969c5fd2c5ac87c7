"""What every engine provides: compile a spec once, then make per-sequence states from it."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from ..specs import ConstraintSpec
from ..vocabulary import TokenVocabulary
from ..whitespace import WhitespacePolicy

if TYPE_CHECKING:
    from ..state import ConstraintState


class EngineProgram(ABC):
    """An engine's compiled form of one spec for one vocabulary (immutable, shareable).

    ``nbytes``: about how much memory the program holds, which bounds the compile cache.
    """

    nbytes: int = 64 * 1024

    @abstractmethod
    def new_state(self) -> ConstraintState:
        """A fresh per-sequence state at the start of the output."""


class Backend(ABC):
    """An engine. ``compile`` raises a ``CompileError`` subclass when the engine refuses the spec
    (translated from the engine's own errors, where their meaning is known); any other exception
    is a bug and is not caught by ``compile()``.

    ``enforces_timeout``: when true, ``compile`` stops the engine itself once ``timeout`` seconds
    pass; otherwise (the default) it ignores ``timeout`` and the compiler runs ``compile`` in a
    thread that it abandons at the timeout, which is only sound for an engine whose own limits
    bound its work.
    """

    name: str
    enforces_timeout: bool = False

    @abstractmethod
    def compile(
        self, spec: ConstraintSpec, vocabulary: TokenVocabulary, whitespace: WhitespacePolicy,
        timeout: float | None = None,
    ) -> EngineProgram: ...


_MODULES = {"llguidance": "llguidance_backend", "outlines-core": "outlines_core_backend", "text": "text_backend"}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``"llguidance"``, ``"outlines-core"``, or ``"text"``: free text
    only, which ``backend="auto"`` compiles there first)."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; choose auto, {', '.join(_MODULES)}")
    module = importlib.import_module(f"{__package__}.{_MODULES[name]}")
    return module.BACKEND
