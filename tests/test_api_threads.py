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


def test_a_generator_runs_no_parallel_tensor_op_on_the_callers_thread(smollm2):
    """Every torch op big enough for OpenMP to split (over ATen's grain of 32,768 elements) runs off
    the caller's thread: a caller's thread that ran one keeps an OpenMP team alive, and with two
    teams in the process libgomp stops spinning for its workers, so the engine's two-thread steps
    ran 1.5-2x slower on a 2-core CPU (a one-row int8 draft pass 15.8 ms against 8.6)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from cdsl_struct.api import Generator

    grain = 32768
    big: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [t for t in (*args, *(kwargs or {}).values(), out) if isinstance(t, torch.Tensor)]
            if any(t.numel() > grain for t in tensors):
                big.append(str(func))
            return out

    with Watch():  # a dispatch mode is per thread: only the caller's ops are seen
        gen = Generator(smollm2, draft="auto")
        try:
            for method in ("cdsl", "cdlh"):
                result = gen.generate("Write a sentence.", keywords=["dog", "ride"], method=method, max_tokens=6)
                assert result.tokens
            gen.generate("A number.", schema={"type": "integer"}, max_tokens=4)
        finally:
            gen.close()
    assert big == [], f"ops on the caller's thread: {sorted(set(big))}"
