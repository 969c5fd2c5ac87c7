"""Worker threads for blocking generation jobs: requests queue in arrival order, none lost; a
full queue is a 429.

Up to ``concurrency`` jobs run at once (the Generator's batch size: their rows share the
engine's forward passes), so the event loop keeps accepting requests while they generate. A
request is admitted when fewer than ``queue_limit`` requests wait behind the running ones;
otherwise it is refused at once with 429 (``rate_limit_error``, with ``Retry-After``) before
anything is queued.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .errors import APIError

T = TypeVar("T")
_ITEM, _ERROR, _END = "item", "error", "end"


class GenerationWorker:
    """Runs blocking jobs, ``concurrency`` at a time on dedicated threads, with a bounded queue."""

    def __init__(self, queue_limit: int, concurrency: int = 1) -> None:
        if queue_limit < 0:
            raise ValueError(f"queue_limit must be >= 0, got {queue_limit}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.queue_limit = queue_limit
        self.concurrency = concurrency
        self.retry_after = 1  # seconds a refused client is told to wait
        self.active = 0  # admitted jobs not finished: the running ones plus those waiting
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="cdsl-generate")

    def _admit(self) -> None:
        waiting = self.active - self.concurrency + 1
        if waiting > self.queue_limit:
            raise APIError(429, f"The server is busy: {waiting - 1} requests are already waiting (queue limit "
                                f"{self.queue_limit}). Retry later.", code="queue_full",
                           headers={"Retry-After": str(self.retry_after)})
        self.active += 1

    def _release(self, _: Any = None) -> None:
        self.active -= 1

    async def run(self, job: Callable[[], T]) -> T:
        """Queue ``job`` and wait for its return value (its exception is raised here)."""
        self._admit()
        future = asyncio.get_running_loop().run_in_executor(self._executor, job)
        future.add_done_callback(self._release)
        return await future

    def stream(self, job: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
        """Queue ``job`` (which returns an iterator) and yield its items as the worker produces them.

        Admission happens now (a full queue raises 429 here). Closing the returned iterator early
        (a client that went away) stops the job after its next item.
        """
        self._admit()
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def put(kind: str, value: Any) -> None:
            loop.call_soon_threadsafe(items.put_nowait, (kind, value))

        def produce() -> None:
            try:
                if stop.is_set():
                    return
                iterator = job()
                try:
                    for item in iterator:
                        put(_ITEM, item)
                        if stop.is_set():
                            break
                finally:
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()
            except BaseException as exc:  # handed to the consumer, raised there
                put(_ERROR, exc)
            finally:
                put(_END, None)

        future = loop.run_in_executor(self._executor, produce)
        future.add_done_callback(self._release)
        return self._consume(items, stop)

    @staticmethod
    async def _consume(items: asyncio.Queue[tuple[str, Any]], stop: threading.Event) -> AsyncIterator[Any]:
        try:
            while True:
                kind, value = await items.get()
                if kind == _END:
                    return
                if kind == _ERROR:
                    raise value
                yield value
        finally:
            stop.set()

    def shutdown(self) -> None:
        """Stop accepting jobs; drop the queued ones (the running one finishes)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
