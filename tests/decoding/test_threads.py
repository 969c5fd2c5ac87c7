"""The thread governor: it tries the other thread count now and then and keeps whichever costs
less per position, so a neighbour that takes a core moves the engine to one thread and back."""

from __future__ import annotations

import torch

from cdsl_struct.decoding.threads import ThreadGovernor


def _run(governor: ThreadGovernor, steps: int, cost: dict[int, float], chosen: list[int]) -> None:
    for _ in range(steps):
        threads = governor.before_step()
        assert torch.get_num_threads() == threads
        chosen.append(threads)
        governor.after_step(threads, cost[threads] * 10, 10)


def test_it_moves_to_the_cheaper_count_and_back_when_the_load_changes(monkeypatch):
    threads = [2]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    governor = ThreadGovernor(period=8, trial=2)
    chosen: list[int] = []
    _run(governor, 40, {1: 1.4, 2: 3.0}, chosen)  # a neighbour took a core: two threads stall
    assert governor.current == 1 and chosen[-8:].count(1) >= 6
    assert chosen[:4] == [2, 2, 1, 1] and chosen[4] == 1  # the first trial comes early, and wins
    chosen.clear()
    _run(governor, 40, {1: 1.4, 2: 0.8}, chosen)  # the neighbour left
    assert governor.current == 2 and governor.switches == 2
    assert chosen.count(1) <= 40 // 8 * 2 + 10  # one thread only for trials once two win again
    threads[0] = 1
    governor.restore()  # the engine closing: torch gets its own count back
    assert threads[0] == 2


def test_nothing_to_govern_with_one_thread(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    governor = ThreadGovernor()
    assert not governor.active
    assert {governor.before_step() for _ in range(100)} == {1}


def test_steps_that_fed_nothing_teach_nothing(monkeypatch):
    threads = [2]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    governor = ThreadGovernor(period=4, trial=2)
    for _ in range(20):
        governor.after_step(governor.before_step(), 1.0, 0)
    assert governor.current == 2 and not any(governor.costs.values())
