"""A draft's mask filled on a worker thread while its pass runs (``mask_fill.draft_with_mask``):
the same mask, off the engine's thread, and the state let go of before a closed program leaves."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from cdsl_struct.decoding.mask_fill import draft_with_mask


class _Session:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay, self.threads, self.done = delay, [], threading.Event()

    def current_mask(self) -> torch.Tensor:
        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay)
        self.done.set()
        return torch.tensor([7, 1], dtype=torch.int32)


def test_the_pass_is_yielded_and_its_outputs_come_back_with_the_mask_filled_meanwhile():
    session = _Session()
    program = draft_with_mask(session, "a draft pass")
    assert next(program) == "a draft pass"
    with pytest.raises(StopIteration) as ended:
        program.send(["logits"])
    outputs, mask = ended.value.value
    assert outputs == ["logits"] and mask.tolist() == [7, 1]
    assert session.threads and session.threads[0] != threading.current_thread().name


def test_a_program_closed_during_the_pass_waits_for_the_fill_before_it_leaves():
    session = _Session(delay=0.2)
    program = draft_with_mask(session, "a draft pass")
    next(program)
    program.close()  # the row ended while its draft ran: nothing may touch its state after this
    assert session.done.is_set()
