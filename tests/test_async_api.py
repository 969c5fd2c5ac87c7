"""The async verbs (issue 41): ``agenerate``, ``agenerate_batch`` and ``astream`` give what the sync
ones give, never block the event loop, and a cancelled task cancels its request in the engine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import cdsl_struct as cs
from cdsl_struct import api, verbs
from cdsl_struct.api import Generator
from cdsl_struct.result import Result

COUNT = "Count from one to five in words."
LONG = "Tell me a long story about a dragon."


@pytest.fixture(scope="module")
def gen(smollm2, one_torch_thread):
    generator = Generator(smollm2)
    yield generator
    generator.close()


def run(coroutine):
    return asyncio.run(coroutine)


def test_agenerate_gives_what_generate_gives(gen):
    expected = gen.generate(COUNT, max_tokens=8)
    got = run(gen.agenerate(COUNT, max_tokens=8))
    assert isinstance(got, Result) and got.text == expected.text and got.tokens == expected.tokens


def test_agenerate_batch_gives_what_generate_batch_gives(gen):
    prompts = ["Say yes.", "Say no."]
    expected = gen.generate_batch(prompts, choices=["yes", "no"], max_tokens=3)
    got = run(gen.agenerate_batch(prompts, choices=["yes", "no"], max_tokens=3))
    assert isinstance(got, list) and [r.text for r in got] == [r.text for r in expected]


def test_astream_yields_str_deltas_then_holds_the_result(gen):
    expected = gen.generate(COUNT, max_tokens=8)

    async def read() -> tuple[list[str], cs.AsyncTextStream]:
        stream = gen.astream(COUNT, max_tokens=8)
        with pytest.raises(RuntimeError, match="has not ended"):
            _ = stream.result  # the loop cannot block for it
        return [delta async for delta in stream], stream

    deltas, stream = run(read())
    assert isinstance(stream, cs.AsyncTextStream) and all(isinstance(d, str) for d in deltas)
    assert "".join(deltas) == stream.result.text == expected.text and stream.result.tokens == expected.tokens


def test_astream_finish_waits_and_keeps_the_deltas(gen):
    async def read() -> tuple[Result, list[str]]:
        stream = gen.astream(COUNT, max_tokens=8)
        result = await stream.finish()
        return result, [delta async for delta in stream]

    result, deltas = run(read())
    assert result.finish_reason == "length" and "".join(deltas) == result.text


def test_the_event_loop_keeps_running_while_a_request_decodes(gen):
    async def probe() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        await gen.agenerate(COUNT, max_tokens=12)
        ticker.cancel()
        return ticks

    assert run(probe()) >= 5  # a blocked loop would not have ticked at all


def test_errors_are_raised_where_awaited(gen):
    with pytest.raises(cs.InvalidSchema):
        run(gen.agenerate("hi", schema={"type": 3}))

    async def first_delta() -> str:
        return await gen.astream("hi", schema={"type": 3}).__anext__()

    with pytest.raises(cs.InvalidSchema):
        run(first_delta())
    with pytest.raises(ValueError, match="agenerate_batch"):
        run(gen.agenerate(["a", "b"]))
    with pytest.raises(ValueError, match="agenerate_batch"):
        gen.astream(["a", "b"])


async def _cancel_once_running(gen: Generator, task: asyncio.Task) -> None:
    """Cancel ``task`` once its row decodes; return when the task has ended."""
    deadline = time.monotonic() + 60
    while gen.load().running_rows == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert gen.load().running_rows == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_cancelling_an_agenerate_task_frees_its_rows(gen):
    async def scenario() -> None:
        task = asyncio.create_task(gen.agenerate(LONG, max_tokens=200))
        await _cancel_once_running(gen, task)

    started = time.perf_counter()
    run(scenario())
    assert gen.load().running_rows == 0 and gen.load().waiting_rows == 0
    assert time.perf_counter() - started < 30  # not the 200 tokens


def test_cancelling_an_astream_task_frees_its_rows(gen):
    streams: list[cs.AsyncTextStream] = []

    async def consume() -> None:
        stream = gen.astream(LONG, max_tokens=200)
        streams.append(stream)
        async for _ in stream:
            pass

    async def scenario() -> None:
        await _cancel_once_running(gen, asyncio.create_task(consume()))

    run(scenario())
    assert gen.load().running_rows == 0
    assert streams[0].done and streams[0].result.finish_reason == "cancelled"


def test_leaving_async_with_early_cancels_the_request(gen):
    async def scenario() -> cs.AsyncTextStream:
        async with gen.astream(LONG, max_tokens=200) as stream:
            async for _ in stream:
                break
        return stream

    assert not run(scenario()).done  # left after one delta, before the end
    deadline = time.monotonic() + 30
    while gen.load().running_rows and time.monotonic() < deadline:  # ends within a step
        time.sleep(0.02)
    assert gen.load().running_rows == 0


def test_a_callers_cancel_event_still_cancels(gen):
    cancel = threading.Event()
    cancel.set()
    result = run(gen.agenerate(LONG, max_tokens=200, cancel=cancel))
    assert result.finish_reason == "cancelled"


def test_module_level_async_verbs(smollm2, monkeypatch):
    monkeypatch.setattr(verbs, "_generators", {})
    monkeypatch.setattr(api, "load_model", lambda name, **options: smollm2)

    async def both() -> tuple[Result, list[Result], list[str], Result]:
        one = await cs.agenerate("Say yes.", choices=["yes", "no"], max_tokens=3)
        batch = await cs.agenerate_batch(["Say yes.", "Say no."], choices=["yes", "no"], max_tokens=3)
        stream = cs.astream("Say yes.", choices=["yes", "no"], max_tokens=3)
        return one, batch, [d async for d in stream], stream.result

    one, batch, deltas, streamed = run(both())
    assert one.value in ("yes", "no") and [type(r) for r in batch] == [Result, Result]
    assert "".join(deltas) == streamed.text == one.text
    assert len(verbs._generators) == 1
