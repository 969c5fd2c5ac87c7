"""Harmlessness: 1 - P(offensive) from a classifier that ships inside its package."""

from __future__ import annotations

from .base import Reward


class Harmlessness(Reward):
    """``1 - P(offensive)`` by alt-profanity-check's linear model (no download at run time)."""

    def __init__(self) -> None:
        from profanity_check import predict_prob

        self._predict = predict_prob

    def score(self, text: str, *, final: bool) -> float:
        if not text.strip():
            return 1.0
        return 1.0 - float(self._predict([text])[0])
