"""How many threads a CPU forward gets, chosen by measuring, so a busy neighbour cannot stall it.

torch runs each op of a CPU forward on a team of OpenMP threads, one per core by default. When
another process takes a core, every op waits for the team member that lost its core to be
scheduled again: measured on two AVX2 cores beside one spinning process (``bench overhead
--neighbour``), a 16-row step of the near-zero model went from 11 to 30 ms with two threads,
where one thread took 14 ms. Alone, two threads are faster at 64 rows (20 against 33 ms).

``ThreadGovernor`` keeps the count that costs least per fed position now: it runs ``period``
steps at its current choice, then a trial of ``trial`` steps at the other count, each followed
by one at its current count, and compares the mean forward time per position of the trial's
steps at each count (interleaved, so under the same load and the same kind of steps); the
cheaper wins until the next round. The counts tried are 1 and the thread count torch had when
the engine started (nothing to choose where that is 1). Measured against steps from before the
trial instead, one thread's steps of one keyword request lost to two threads' steps of sixteen at
once (more positions a step, so less a position), on a 2-core VM where one thread ran both faster.

Only steps that decode are compared: a step that prefills a prompt costs a tenth as much a
position (a 50-token prompt beside one decoding row), so a trial that caught one won whatever
the counts cost. On a 2-core VM where one thread runs keyword requests faster, such trials sent
16 requests at once to two threads in some runs: 2.9-3.1 s against 2.2-2.4 s. (One thread won there
only while the caller's thread held an OpenMP team of its own, which slows every other team's
hand-off: ``api.on_own_thread``. Without it two threads win on that VM: 1.7-2.1 s.)
"""

from __future__ import annotations

from collections import deque

import torch

#: steps between trials, and steps each trial (and each count's cost window) lasts
PERIOD = 64
TRIAL = 4
#: steps in a row that teach nothing (they prefill, or feed nothing) after which a trial is dropped
UNTAUGHT_LIMIT = 16


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
        self._untaught = 0  # steps in a row that taught nothing
        self.switches = 0

    @property
    def active(self) -> bool:
        return len(self.choices) > 1

    def before_step(self) -> int:
        """Set and return the thread count for the coming step."""
        if self.active and not self._plan and self._since_trial >= self.period:
            other = next(c for c in self.choices if c != self.current)
            self._plan.extend(c for _ in range(self.trial) for c in (other, self.current))
            for costs in self.costs.values():
                costs.clear()
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

    def after_step(self, threads: int, seconds: float, positions: int, prefilled: int = 0) -> None:
        """Record a step's forward time over its fed positions at ``threads``; a step that fed
        nothing or ``prefilled`` prompt positions teaches nothing (module docstring)."""
        if not self.active:
            return
        if positions <= 0 or prefilled > 0:
            self._untaught += 1
            if self._plan and self._untaught >= UNTAUGHT_LIMIT:  # no clean step to judge it by: drop it
                self._plan.clear()
                self._since_trial = 0
            return
        self._untaught = 0
        self.costs[threads].append(seconds / positions)
        if self._plan:
            self._plan.popleft()
            if not self._plan:
                self._decide()
        else:
            self._since_trial += 1

    def _decide(self) -> None:
        measured = {c: sum(v) / len(v) for c, v in self.costs.items() if v}
        if len(measured) < 2:  # a count taught nothing in the trial: nothing to compare
            return
        best = min(measured, key=measured.__getitem__)
        if best != self.current:
            self.current = best
            self.switches += 1
