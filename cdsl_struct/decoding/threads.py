"""How many threads a CPU forward gets, chosen by measuring, so a busy neighbour cannot stall it.

torch runs each op of a CPU forward on a team of OpenMP threads, one per core by default. When
another process takes a core, every op waits for the team member that lost its core to be
scheduled again: measured on two AVX2 cores beside one spinning process (``bench overhead
--neighbour``), a 16-row step of the near-zero model went from 11 to 30 ms with two threads,
where one thread took 14 ms. Alone, two threads are faster at 64 rows (20 against 33 ms).

``ThreadGovernor`` keeps the count that costs least per fed position now: it runs ``period``
steps at its current choice, then ``trial`` steps at each other count, and compares the mean
forward time per position of each count's latest ``trial`` steps (neighbouring in time, so
under the same load); the cheapest wins until the next round. The counts tried are 1 and the
thread count torch had when the engine started (nothing to choose where that is 1).
"""

from __future__ import annotations

from collections import deque

import torch

#: steps between trials, and steps each trial (and each count's cost window) lasts
PERIOD = 64
TRIAL = 4


class ThreadGovernor:
    """Sets ``torch.set_num_threads`` before each CPU forward (``before_step``) and learns from its
    time (``after_step``)."""

    def __init__(self, most: int | None = None, period: int = PERIOD, trial: int = TRIAL) -> None:
        most = most or torch.get_num_threads()
        self.choices = sorted({1, most})
        self.period, self.trial = period, trial
        self.current = most
        self.costs = {choice: deque(maxlen=trial) for choice in self.choices}
        self._plan: deque[int] = deque()
        self._since_trial = period - trial  # the first trial comes early
        self.switches = 0

    @property
    def active(self) -> bool:
        return len(self.choices) > 1

    def before_step(self) -> int:
        """Set and return the thread count for the coming step."""
        if self.active and not self._plan and self._since_trial >= self.period:
            self._plan.extend(c for c in self.choices if c != self.current for _ in range(self.trial))
            self._since_trial = 0
        threads = self._plan[0] if self._plan else self.current
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def restore(self) -> None:
        """Give torch back the thread count it had when the governor started (the count is
        process-wide: other torch work in the process should not inherit the engine's choice)."""
        if self.active and torch.get_num_threads() != self.choices[-1]:
            torch.set_num_threads(self.choices[-1])

    def after_step(self, threads: int, seconds: float, positions: int) -> None:
        """Record a step's forward time over its fed positions at ``threads``."""
        if not self.active or positions <= 0:
            return
        self.costs[threads].append(seconds / positions)
        if self._plan:
            self._plan.popleft()
            if not self._plan:
                self._decide()
        else:
            self._since_trial += 1

    def _decide(self) -> None:
        measured = {c: sum(v) / len(v) for c, v in self.costs.items() if v}
        best = min(measured, key=measured.__getitem__)
        if best != self.current:
            self.current = best
            self.switches += 1
