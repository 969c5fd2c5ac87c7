"""A real uvicorn server on a free localhost port, in a background thread, and openai clients for it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

SERVER_EXTRA = "needs the server extra: pip install 'cdsl_struct[server]'"


@contextmanager
def running_server(app, **config) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a port picked by the OS); yield its base URL ``http://127.0.0.1:P/v1``.
    ``config``: more ``uvicorn.Config`` options."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def base_url(smollm2):
    """The URL of a server on the embedded SmolLM2 for the real-client tests (one per module)."""
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    with running_server(create_app(Generator(smollm2), default_max_tokens=64)) as url:
        yield url


def client_for(base_url: str, **kwargs):
    """The official openai client for a test server (no retries, so status codes are seen as sent)."""
    import openai

    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, **kwargs)
