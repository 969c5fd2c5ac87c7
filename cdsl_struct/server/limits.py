"""ASGI middleware bounding request bodies: over a size limit 413, slower than a deadline 408,
both in OpenAI's error shape."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError


class BodySizeLimit:
    """Refuse a body over ``max_bytes`` (413: by its Content-Length at once, or while reading it)
    or one not received within ``timeout`` seconds (408: a client stalled mid-body holds no
    connection and no handler for longer).

    The body is read here (at most ``max_bytes`` + one chunk are held) and replayed to the app.
    Before a 413 the rest of a body of up to ``DRAIN_BYTES`` is read and dropped for at most
    ``DRAIN_S`` seconds, so that a client still sending gets the answer rather than a reset
    connection, and a slow one gets it anyway.
    """

    DRAIN_BYTES = 64 * 1024 * 1024
    DRAIN_S = 2.0

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = 600.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, int(declared), more_body=int(declared) <= self.DRAIN_BYTES)
            return
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                error = APIError(408, f"The request body did not arrive within {self.timeout:g} s.",
                                 code="request_timeout", headers={"Connection": "close"})
                await error.response()(scope, receive, send)
                return
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, None, more_body=message.get("more_body", False))
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, declared: Any, *, more_body: bool) -> None:
        drained, stop = 0, time.monotonic() + self.DRAIN_S
        while more_body and drained <= self.DRAIN_BYTES and time.monotonic() < stop:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, stop - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            more_body = message.get("more_body", False)
        size = f"{declared} bytes" if declared is not None else "more than that"
        error = APIError(413, f"The request body is too large ({size}); this server accepts at most "
                              f"{self.max_bytes} bytes (--max-request-bytes).", code="request_too_large",
                         headers={"Connection": "close"} if more_body else None)
        await error.response()(scope, receive, send)
