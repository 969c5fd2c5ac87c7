"""How many positions each row may feed in a batched step: speculation is worth its padding.

In a padded batch every row is padded to the widest feed, so a step costs about ``a + b * rows *
width`` (one pass reads the weights once: ``a``; every fed position adds compute: ``b``); in a
ragged batch (``RaggedRunner``) only the positions a row really feeds count. At one
row the pass is bound by reading the weights and extra positions are nearly free; at sixteen
rows on a CPU they are not. ``StepWidth`` fits ``a`` and ``b`` online from the engine's own
forward passes and picks the width that maximises expected committed tokens per second: a
forced token is always accepted (it is the only token the mask allows), a drafted one with the
acceptance rate observed so far, and every row commits one token of the target's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from .loop import Proposal


class StepWidth:
    """An online cost model of the batched forward and the width it recommends."""

    def __init__(self, cost_ratio: float = 1 / 32, window: int = 64, padded: bool = True) -> None:
        self.cost_ratio = cost_ratio
        """``b / a``: the cost of one more fed position relative to a pass; refitted as steps run."""
        self.padded = padded
        """Whether every row of a step is padded to its widest feed (``BatchRunner``) or not."""
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.drafted = 0
        self.accepted_drafted = 0

    @property
    def acceptance(self) -> float:
        """Share of drafted (not forced) tokens the target accepted so far (0.5 before any)."""
        return (self.accepted_drafted + 1) / (self.drafted + 2)

    def observe_pass(self, positions: int, seconds: float) -> None:
        """Record a forward pass of ``positions`` padded positions; refit ``b / a`` when they vary."""
        self.samples.append((positions, seconds))
        if len(self.samples) < 8:
            return
        xs, ys = [p for p, _ in self.samples], [s for _, s in self.samples]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        if var <= 0:
            return
        b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        a = mean_y - b * mean_x
        if a > 0 and b > 0:
            self.cost_ratio = b / a

    def observe_verdict(self, drafted: int, accepted_drafted: int) -> None:
        self.drafted += drafted
        self.accepted_drafted += accepted_drafted

    def choose(self, proposals: Sequence[Proposal]) -> int:
        """The width (positions fed per row, proposals plus one) with the best tokens per cost."""
        widest = 1 + max((len(p.tokens) for p in proposals), default=0)
        rows, best, best_rate = len(proposals), 1, 0.0
        for width in range(1, widest + 1):
            room = width - 1
            tokens = sum(1 + min(p.forced, room) + self.acceptance * max(0, min(len(p.tokens), room) - p.forced)
                         for p in proposals)
            fed = rows * width if self.padded else sum(1 + min(len(p.tokens), room) for p in proposals)
            rate = tokens / (1 + self.cost_ratio * fed)
            if rate > best_rate * 1.0001:
                best, best_rate = width, rate
        return best
