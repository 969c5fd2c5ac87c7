"""The thread governor: it tries the other thread count now and then, interleaved with its own,
and keeps whichever costs less per position, so a neighbour that takes a core moves the engine to
one thread and back; steps of another kind before a trial do not decide it."""

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
    assert chosen[:6] == [2, 2, 1, 2, 1, 2] and chosen[6] == 1  # the first trial comes early, interleaved, and wins
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


def test_a_step_that_prefills_teaches_nothing_and_a_trial_without_clean_steps_is_dropped(monkeypatch):
    import itertools

    from cdsl_struct.decoding.threads import UNTAUGHT_LIMIT

    threads = [2]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    governor = ThreadGovernor(period=8, trial=2)
    cost = {1: 1.4, 2: 1.0}  # two threads cheaper a decoded position
    chosen = []
    for _ in range(60):
        count = governor.before_step()
        chosen.append(count)
        # every step at one thread also prefills a prompt: cheap a position, but not comparable
        prefilled = 50 if count == 1 else 0
        governor.after_step(count, cost[count] * 10 + 0.1 * prefilled, 10 + prefilled, prefilled)
    assert governor.current == 2 and governor.switches == 0 and not governor.costs[1]
    runs = [(count, len(list(group))) for count, group in itertools.groupby(chosen)]
    trials = [length for count, length in runs if count == 1]
    assert len(trials) >= 2 and trials[0] == UNTAUGHT_LIMIT  # each trial dropped after the limit
    assert runs[-1][0] == 2 or runs[-1][1] <= UNTAUGHT_LIMIT


def test_a_trial_is_judged_by_its_own_steps_not_by_the_steps_before_it(monkeypatch):
    """One request alone (few positions a step, dear a position), then sixteen at once (many, cheap
    a position): one thread is the cheaper count for both, and a trial at the switch keeps it."""
    threads = [1]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    for switch in range(30, 42):  # wherever the trial falls against the change of kind
        governor = ThreadGovernor(most=2, period=8, trial=2)
        governor.current = 1
        for step in range(60):
            count = governor.before_step()
            positions = 3 if step < switch else 40
            seconds = (0.025 if positions == 3 else 0.05) * (1.0 if count == 1 else 1.3)  # per step, by kind
            governor.after_step(count, seconds, positions)
        assert governor.current == 1 and governor.switches == 0, switch
