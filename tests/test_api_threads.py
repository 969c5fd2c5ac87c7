"""``api.on_own_thread``: the Generator's loading runs on a thread that ends, and hands back its
result or its exception as it was."""

import threading

import pytest

from cdsl_struct.api import on_own_thread
from cdsl_struct.models.device import DeviceUnavailable


def test_the_build_runs_on_another_thread_that_ends():
    seen = {}

    def build():
        seen["thread"] = threading.current_thread()
        return 42

    assert on_own_thread(build) == 42
    assert seen["thread"] is not threading.current_thread() and not seen["thread"].is_alive()


def test_the_builds_exception_reaches_the_caller_with_its_type():
    def build():
        raise DeviceUnavailable("no such device")

    with pytest.raises(DeviceUnavailable, match="no such device"):
        on_own_thread(build)
