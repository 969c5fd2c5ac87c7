"""Streaming: committed tokens to text deltas, and running a decode in a thread as an iterator."""

from __future__ import annotations

import codecs
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .constraints import TokenVocabulary


class TextDeltas:
    """Text of tokens as they are committed, never splitting a multi-byte UTF-8 character.

    Bytes that end mid-character are held until the character is complete; ``flush`` writes
    what is left (invalid bytes become U+FFFD, as in ``Result.text``). EOS is dropped.
    """

    def __init__(self, vocabulary: TokenVocabulary) -> None:
        self.vocabulary = vocabulary
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tokens: list[int]) -> str:
        """The new text that ``tokens`` complete."""
        eos = self.vocabulary.eos_token_ids
        return self._decoder.decode(self.vocabulary.decode([t for t in tokens if t not in eos]))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class Cancelled(Exception):
    """Raised inside a streaming decode when its consumer went away."""


def stream_in_thread(work: Callable[[Callable[[str], None]], Any]) -> Iterator[Any]:
    """Run ``work(emit)`` in a thread; yield each ``emit``-ted delta, then ``work``'s result.

    Closing the iterator early (or dropping it) makes the next ``emit`` raise ``Cancelled`` in
    the worker, so the decode stops and releases whatever lock it holds. The queue is
    unbounded: a worker never waits on a slow consumer.
    """
    items: queue.SimpleQueue = queue.SimpleQueue()
    cancelled = threading.Event()

    def emit(delta: str) -> None:
        if cancelled.is_set():
            raise Cancelled
        if delta:
            items.put(("delta", delta))

    def run() -> None:
        try:
            items.put(("result", work(emit)))
        except Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer's thread
            items.put(("error", exc))

    def iterate() -> Iterator[Any]:
        thread = threading.Thread(target=run, name="cdsl-stream", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = items.get()
                if kind == "error":
                    raise item
                yield item
                if kind == "result":
                    return
        finally:
            cancelled.set()

    return iterate()
