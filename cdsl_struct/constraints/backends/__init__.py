"""Constraint engines behind one interface: each turns a spec into an ``EngineProgram``."""

from __future__ import annotations

from ...options import ENGINES
from .base import EngineProgram, get_backend

BACKEND_NAMES: tuple[str, ...] = ENGINES

__all__ = ["BACKEND_NAMES", "EngineProgram", "get_backend"]
