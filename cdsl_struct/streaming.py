"""Streaming: committed tokens to text deltas, and a request run on a thread of its own as a
stream of them (``TextStream`` for a caller that blocks, ``AsyncTextStream`` for an event loop)."""

from __future__ import annotations

import asyncio
import codecs
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .constraints import TokenVocabulary
from .errors import RequestCancelled


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
        """What is left of a character the last tokens began (U+FFFD for bytes that end no character)."""
        return self._decoder.decode(b"", final=True)


class Thought(str):
    """A text delta of the model's thinking (with ``reasoning=``): a stream yields these beside the
    answer's plain ``str`` deltas; the plain ones alone concatenate to ``result.text``."""


class ThoughtDeltas:
    """Text deltas of a reasoning row split into ``Thought`` (between the markers) and answer
    text; the markers themselves are dropped. ``written`` is the raw text consumed up to and
    including the close marker, so ``written + result.text`` is the row's whole output."""

    def __init__(self, open_marker: str, close_marker: str, phase: str) -> None:
        from .constraints.reasoning import ANSWER, BEFORE, THINKING

        self.open, self.close = open_marker, close_marker
        # any other phase (a forced open marker) starts with the marker, as BEFORE reads it
        self.phase = {ANSWER: "answer", THINKING: "thinking", BEFORE: "before"}.get(phase, "before")
        self._buffer = ""
        self.written = ""

    def push(self, delta: str) -> list[str]:
        """The pieces ``delta`` completes (``Thought`` or answer ``str``), in order."""
        out: list[str] = []
        self._buffer += delta
        if self.phase == "before":
            if self.open.startswith(self._buffer):
                return out  # maybe the open marker: wait
            if self._buffer.startswith(self.open):
                self.written += self.open
                self._buffer, self.phase = self._buffer[len(self.open):], "thinking"
            else:
                self.phase = "answer"
        if self.phase == "thinking":
            end = self._buffer.find(self.close)
            if end < 0:
                from .constraints.reasoning import matched_after

                keep = matched_after(self._buffer, self.close)  # may begin the close marker: held
                cut = len(self._buffer) - keep
                sendable, self._buffer = self._buffer[:cut], self._buffer[cut:]
                self.written += sendable
                return [Thought(sendable)] if sendable else out
            thought, self._buffer = self._buffer[:end], self._buffer[end + len(self.close):]
            self.written += thought + self.close
            if thought:
                out.append(Thought(thought))
            self.phase = "answer"
        if self.phase == "answer" and self._buffer:
            out.append(self._buffer)
            self._buffer = ""
        return out

    def flush(self) -> list[str]:
        """What is held when the output ends (a thought cut by the budget of tokens)."""
        held, self._buffer = self._buffer, ""
        if not held:
            return []
        if self.phase == "thinking":
            self.written += held
            return [Thought(held)]
        return [] if self.phase == "before" else [held]


class PartialValues:
    """A stream's text so far and its typed partial value (``partial.py``), read on demand: a
    JSON schema's output as a dict (or list, or string), a pydantic model's as a model built
    without validation; ``None`` before the value begins, and for other constraints (``reader``
    None). Each is consistent with the final value: it never takes anything back."""

    def __init__(self, reader: Callable[[str], Any] | None = None) -> None:
        self.reader = reader
        self._parts: list[str] = []
        self._read: tuple[int, Any] = (0, None)

    def add(self, delta: str) -> None:
        if not isinstance(delta, Thought):
            self._parts.append(delta)

    @property
    def value(self) -> Any:
        if self.reader is None:
            return None
        if self._read[0] != len(self._parts):  # read again only when text came
            self._read = (len(self._parts), self.reader("".join(self._parts)))
        return self._read[1]


def partial_reader(spec: Any) -> Callable[[str], Any] | None:
    """How to read partial values of ``spec``'s output: JSON schemas (typed by their pydantic
    model where there is one); None for other constraints."""
    from .constraints import JsonSchema
    from .partial import NOTHING, partial_json, partial_model

    if not isinstance(spec, JsonSchema):
        return None
    model = spec.model

    def read(text: str) -> Any:
        value = partial_json(text)
        if value is NOTHING:
            return None
        return partial_model(model, value) if model is not None and isinstance(value, dict) else value

    return read


def partial_calls_reader(tool_format: Any = None) -> Callable[[str], Any]:
    """How to read partial values of a tool-call output written in ``tool_format``: the calls
    begun so far, as ``ToolCall``s whose ``arguments`` hold the arguments written so far (strings
    grow, numbers appear whole, as for a JSON answer) and ``arguments_text`` their text (``id`` is
    empty: the final calls carry theirs); None before the first call's name is whole."""
    from .partial import partial_json
    from .tools import CallStream, ToolCall

    def read(text: str) -> Any:
        calls = CallStream(tool_format)
        calls.push(text)
        begun = [c for c in calls.calls if c.name is not None]
        if not begun:
            return None
        partials = []
        for call in begun:
            value = partial_json(call.arguments) if call.arguments else None
            partials.append(ToolCall(call.name, value if isinstance(value, dict) else {}, id="",
                                     arguments_text=call.arguments))
        return partials

    return read


class _Changes:
    """A stream's partial values as they change, then its final value where that differs."""

    def __init__(self, partials: PartialValues) -> None:
        self.partials = partials
        self.last: Any = None

    def new(self) -> list[Any]:
        """The partial value, if it changed since the last one given."""
        value = self.partials.value
        if value is None or value == self.last:
            return []
        self.last = value
        return [value]

    def final(self, outcome: tuple[str, Any] | None) -> list[Any]:
        """The finished Result's value (partial values are read only for JSON schemas)."""
        if outcome is None or outcome[0] != _RESULT or self.partials.reader is None:
            return []
        value = getattr(outcome[1], "value", None)
        return [] if value is None or value == self.last else [value]


class LinkedCancel(threading.Event):
    """A request's cancel event: set by its stream (closed, or its task cancelled), and read as set
    too once ``parent`` (the caller's own ``cancel=`` event, if any) is set. The engine reads
    ``is_set()`` at each step boundary."""

    def __init__(self, parent: threading.Event | None = None) -> None:
        super().__init__()
        self.parent = parent

    def is_set(self) -> bool:
        """True once this event or its parent is set."""
        return super().is_set() or (self.parent is not None and self.parent.is_set())


Work = Callable[[Callable[[str], None], threading.Event], Any]
"""A request run on a thread: ``work(emit, cancel)`` decodes, passing text deltas to ``emit``,
ending its rows once ``cancel`` is set, and returns the final value (a Result, or a list of them)."""

_DELTA, _RESULT, _ERROR = "delta", "result", "error"


def start_in_thread(work: Work, cancel: threading.Event, put: Callable[[tuple[str, Any]], None]) -> None:
    """Run ``work(emit, cancel)`` on a daemon thread of its own; ``put`` receives ``("delta", text)``
    for each non-empty delta, then ``("result", value)`` or ``("error", exception)``.

    ``put`` runs on that thread: a plain queue's ``put`` for a caller that blocks, or a hand-off
    through ``loop.call_soon_threadsafe`` for one that awaits. Nothing here holds a reference to the
    stream object, so a dropped stream can be collected (and cancel its request) while it runs.
    """

    def emit(delta: str) -> None:
        if delta:
            put((_DELTA, delta))

    def run() -> None:
        try:
            outcome = (_RESULT, work(emit, cancel))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            outcome = (_ERROR, exc)
        put(outcome)

    threading.Thread(target=run, name="cdsl-stream", daemon=True).start()


class TextStream(Iterator[str]):
    """One request's text as it is decoded: iterate it for the text deltas (``str``), then read
    ``result`` for the final ``Result``. The deltas concatenate to ``result.text`` (text that may
    begin a stop string is held back until it cannot).

    The request starts when the stream is first iterated (or ``result`` is first read).
    ``result`` read before the deltas were all iterated waits for the request to end; the deltas
    not yet read stay to be iterated. As a context manager (``with gen.stream(p) as s:``), leaving
    the block before the request ended cancels it: its rows end within a step (and ``result`` is
    then the partial output with ``finish_reason="cancelled"``). ``close()`` does the same, as does
    dropping an unfinished stream. An error of the request is raised by the iteration and again by
    ``result``. Read a stream from one thread.
    """

    def __init__(self, work: Work, cancel: threading.Event | None = None,
                 partials: PartialValues | None = None) -> None:
        self._work: Work | None = work
        self._cancel = LinkedCancel(cancel)
        self._partials = partials or PartialValues()
        self._items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._pending: deque[str] = deque()
        self._outcome: tuple[str, Any] | None = None
        self._closed = False

    def _start(self) -> None:
        if self._work is not None:
            work, self._work = self._work, None
            start_in_thread(work, self._cancel, self._items.put)

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        delta = self._next_delta()
        self._partials.add(delta)
        return delta

    def _next_delta(self) -> str:
        if self._pending:
            return self._pending.popleft()
        if self._outcome is not None or (self._closed and self._work is not None):
            raise StopIteration
        self._start()
        kind, item = self._items.get()
        if kind == _DELTA:
            return item
        self._outcome = (kind, item)
        if kind == _ERROR:
            raise item
        raise StopIteration

    @property
    def partial(self) -> Any:
        """The typed partial value of the text iterated so far (``PartialValues``), or None."""
        return self._partials.value

    def partials(self) -> Iterator[Any]:
        """Iterate the stream for its partial values instead of its deltas: a value each time it
        changed, each a prefix of the final one (strings grow; numbers appear whole; objects gain
        members), and last the final value itself where the output has one. Only for JSON
        schemas (a pydantic model's partials are models built without validation)."""
        changes = _Changes(self._partials)
        for _ in self:
            yield from changes.new()
        yield from changes.final(self._outcome)

    @property
    def done(self) -> bool:
        """True once the request ended (the deltas may not all have been iterated yet)."""
        return self._outcome is not None

    @property
    def result(self) -> Any:
        """The final ``Result``; read early, it waits for the request to end (see the class).

        Raises the request's error, or ``RequestCancelled`` if the stream was closed before it
        started (nothing was decoded)."""
        if self._outcome is None:
            if self._closed and self._work is not None:
                raise RequestCancelled("this stream was closed before it started; nothing was decoded")
            self._start()
            while True:
                kind, item = self._items.get()
                if kind != _DELTA:
                    self._outcome = (kind, item)
                    break
                self._pending.append(item)
        kind, item = self._outcome
        if kind == _ERROR:
            raise item
        return item

    def close(self) -> None:
        """Cancel the request if it is still running (its rows end within a step); no wait."""
        self._closed = True
        if self._outcome is None:
            self._cancel.set()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_outcome", True) is None:
            self._cancel.set()


class AsyncTextStream(AsyncIterator[str]):
    """``TextStream`` for an event loop: ``async for`` the text deltas, then ``result``.

    The request (resolving its constraint included) runs on a thread of its own, started by the
    first ``__anext__`` (or ``finish()``); its deltas reach the loop through
    ``loop.call_soon_threadsafe``, so the loop never blocks on it. Errors of the request (a bad
    argument, a constraint that does not compile) are raised by the first ``__anext__``.

    ``result`` is the final ``Result`` once the iteration ended; read earlier it raises
    ``RuntimeError`` (``await stream.finish()`` waits for it instead, keeping the deltas not yet
    read for the iteration). Cancelling the task that awaits the stream (in ``__anext__`` or
    ``finish``) cancels the request, and the ``CancelledError`` propagates once its rows ended;
    ``async with`` cancels it when the block is left early, as ``aclose()`` does.
    """

    def __init__(self, work: Work, cancel: threading.Event | None = None,
                 partials: PartialValues | None = None) -> None:
        self._work: Work | None = work
        self._cancel = LinkedCancel(cancel)
        self._partials = partials or PartialValues()
        self._items: asyncio.Queue[tuple[str, Any]] | None = None
        self._pending: deque[str] = deque()
        self._outcome: tuple[str, Any] | None = None
        self._closed = False

    def _queue(self) -> asyncio.Queue[tuple[str, Any]]:
        if self._items is None:
            loop = asyncio.get_running_loop()
            items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
            self._items = items

            def put(item: tuple[str, Any]) -> None:
                try:
                    loop.call_soon_threadsafe(items.put_nowait, item)
                except RuntimeError:  # the loop closed while the request ran: nobody is listening
                    pass

            assert self._work is not None
            work, self._work = self._work, None
            start_in_thread(work, self._cancel, put)
        return self._items

    async def _get(self) -> tuple[str, Any]:
        """The next item of the request; a cancelled wait cancels the request and waits for its end."""
        items = self._queue()
        try:
            return await items.get()
        except asyncio.CancelledError:
            self._cancel.set()
            while self._outcome is None:  # the rows end within a step
                kind, item = await items.get()
                if kind != _DELTA:
                    self._outcome = (kind, item)
            raise

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> str:
        delta = await self._next_delta()
        self._partials.add(delta)
        return delta

    async def _next_delta(self) -> str:
        if self._pending:
            return self._pending.popleft()
        if self._outcome is not None or (self._closed and self._items is None):
            raise StopAsyncIteration
        kind, item = await self._get()
        if kind == _DELTA:
            return item
        self._outcome = (kind, item)
        if kind == _ERROR:
            raise item
        raise StopAsyncIteration

    @property
    def partial(self) -> Any:
        """The typed partial value of the text iterated so far (``TextStream.partial``)."""
        return self._partials.value

    async def partials(self) -> AsyncIterator[Any]:
        """``TextStream.partials`` for an event loop."""
        changes = _Changes(self._partials)
        async for _ in self:
            for value in changes.new():
                yield value
        for value in changes.final(self._outcome):
            yield value

    @property
    def done(self) -> bool:
        """True once the request ended (the deltas may not all have been iterated yet)."""
        return self._outcome is not None

    @property
    def result(self) -> Any:
        """The final ``Result``, once the request ended; ``RuntimeError`` before (the loop cannot
        block: ``await finish()`` waits for it)."""
        if self._outcome is None:
            raise RuntimeError("the stream has not ended: iterate it to its end, or await stream.finish(), "
                               "before reading result")
        kind, item = self._outcome
        if kind == _ERROR:
            raise item
        return item

    async def finish(self) -> Any:
        """Wait for the request to end; its final value (the deltas not yet read stay to be iterated).

        Raises the request's error, or ``RequestCancelled`` if the stream was closed before it started."""
        if self._outcome is None:
            if self._closed and self._items is None:
                raise RequestCancelled("this stream was closed before it started; nothing was decoded")
            while True:
                kind, item = await self._get()
                if kind != _DELTA:
                    self._outcome = (kind, item)
                    break
                self._pending.append(item)
        return self.result

    async def aclose(self) -> None:
        """Cancel the request if it is still running (its rows end within a step); no wait."""
        self._closed = True
        if self._outcome is None:
            self._cancel.set()

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if getattr(self, "_outcome", True) is None:
            self._cancel.set()


def legacy_stream(stream: TextStream) -> Iterator[Any]:
    """The iterator ``generate(..., stream=True)`` gave before ``stream()``: the text deltas, then the
    Result as the last item. Closing it early (or dropping it) cancels the request."""
    with stream:
        yield from stream
        yield stream.result
