"""The reward protocol, score checking, and combinators."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from ..errors import RewardError


def checked_score(value: object, source: object = "reward") -> float:
    """``value`` as a float in [0, 1]; ``RewardError`` for NaN, infinities or out of range."""
    try:
        score = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise RewardError(f"{source} returned {value!r}, not a number") from None
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        raise RewardError(f"{source} returned {score}, outside [0, 1]")
    return score


class Reward(ABC):
    """Scores text in [0, 1]. ``final`` says whether the text is the finished output."""

    earned_by_end: bool = False
    """True when unfinished text may still earn the reward later (keyword coverage, progress):
    a low score on a prefix is no fault, only a premature ending is, so CDSL's ``reward_on="auto"``
    judges only lookaheads that end the output. False (the default) when every prefix can be
    judged as it stands (harmlessness)."""

    @abstractmethod
    def score(self, text: str, *, final: bool) -> float: ...

    def suggestions(self, text: str) -> list[str]:
        """Words that would raise the score if written next after ``text`` (none by default).

        A hint for reward-guided drafts (``GuidedDraft`` also weighs these words, not only the
        model's top tokens); it never changes the score or any hard constraint.
        """
        return []

    def spent(self, text: str) -> list[str]:
        """Words that would lower the score if written again after ``text`` (none by default), e.g.
        the inflections of a keyword already written as often as it may be.

        A hint for CDSL, whose draft and target then prefer other words (``decoding.guards``); it never
        changes the score or any hard constraint.
        """
        return []

    def failed(self, text: str) -> bool:
        """Whether ``text`` has lost the reward whatever follows it (False by default), e.g. keyword
        coverage that pays nothing for a list of the words once the text is one. A reward judged
        on endings (``earned_by_end``) says so here, so a decoder can turn back at the token that
        lost it instead of at the ending."""
        return False

    guard_marks: str = ""
    """Characters a token's text holds wherever writing it can lose the reward (``losing``): the
    decoder asks about those tokens only. Empty (the default): it asks about none."""

    def losing(self, text: str, pieces: Sequence[str | None]) -> list[int]:
        """The indices of ``pieces`` (the texts of tokens that hold a ``guard_marks`` character;
        None: the output ends) after which ``text`` has lost the reward for good (``failed``) or
        ends where its final score is lost. None by default.

        A hint for CDSL, whose draft and target then write something else where anything else is
        allowed (``decoding.guards``); it never changes the score or any hard constraint.
        """
        return []

    def __call__(self, text: str, *, final: bool = False) -> float:
        return checked_score(self.score(text, final=final), type(self).__name__)


class CallableReward(Reward):
    """A user function ``fn(text, final) -> float`` (or ``fn(text)``) as a reward."""

    def __init__(self, fn: Callable[..., float], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "callable reward")

    def score(self, text: str, *, final: bool) -> float:
        try:
            return self.fn(text, final=final)
        except TypeError:
            return self.fn(text)

    def __call__(self, text: str, *, final: bool = False) -> float:
        return checked_score(self.score(text, final=final), self.name)


def as_reward(value: Reward | Callable[..., float]) -> Reward:
    return value if isinstance(value, Reward) else CallableReward(value)


class WeightedMean(Reward):
    """The weighted mean of several rewards (weights default to equal)."""

    def __init__(self, rewards: Sequence[Reward | Callable[..., float]], weights: Sequence[float] | None = None):
        if not rewards:
            raise ValueError("WeightedMean needs at least one reward")
        self.rewards = [as_reward(r) for r in rewards]
        self.weights = list(weights) if weights is not None else [1.0] * len(self.rewards)
        if len(self.weights) != len(self.rewards) or any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("weights must be non-negative, one per reward, and not all zero")

    def score(self, text: str, *, final: bool) -> float:
        total = sum(w * r(text, final=final) for w, r in zip(self.weights, self.rewards, strict=True))
        return total / sum(self.weights)

    def suggestions(self, text: str) -> list[str]:
        return _merged([reward.suggestions(text) for reward in self.rewards])

    def spent(self, text: str) -> list[str]:
        return _merged([reward.spent(text) for reward in self.rewards])

    def failed(self, text: str) -> bool:
        return all(reward.failed(text) for reward in self.rewards)

    @property
    def guard_marks(self) -> str:  # type: ignore[override]
        return _marks(self.rewards)

    def losing(self, text: str, pieces: Sequence[str | None]) -> list[int]:
        """The pieces that lose every part (a mean keeps what one part still earns)."""
        return sorted(set.intersection(*(set(r.losing(text, pieces)) for r in self.rewards)))

    @property
    def earned_by_end(self) -> bool:  # type: ignore[override]
        return all(r.earned_by_end for r in self.rewards)


class MinReward(Reward):
    """The lowest of several rewards: every one must be satisfied."""

    def __init__(self, rewards: Sequence[Reward | Callable[..., float]]):
        if not rewards:
            raise ValueError("MinReward needs at least one reward")
        self.rewards = [as_reward(r) for r in rewards]

    def score(self, text: str, *, final: bool) -> float:
        return min(r(text, final=final) for r in self.rewards)

    def suggestions(self, text: str) -> list[str]:
        return _merged([reward.suggestions(text) for reward in self.rewards])

    def spent(self, text: str) -> list[str]:
        return _merged([reward.spent(text) for reward in self.rewards])

    def failed(self, text: str) -> bool:
        return any(reward.failed(text) for reward in self.rewards)

    @property
    def guard_marks(self) -> str:  # type: ignore[override]
        return _marks(self.rewards)

    def losing(self, text: str, pieces: Sequence[str | None]) -> list[int]:
        """The pieces that lose any part (the lowest part is the score)."""
        return sorted(set().union(*(r.losing(text, pieces) for r in self.rewards)))

    @property
    def earned_by_end(self) -> bool:  # type: ignore[override]
        return all(r.earned_by_end for r in self.rewards)


def _merged(lists: Sequence[list[str]]) -> list[str]:
    """The parts' word lists (suggestions, spent words) as one, each word once, in order."""
    return list(dict.fromkeys(word for words in lists for word in words))


def _marks(rewards: Sequence[Reward]) -> str:
    """The parts' ``guard_marks`` as one string, each character once."""
    return "".join(dict.fromkeys(mark for reward in rewards for mark in reward.guard_marks))
