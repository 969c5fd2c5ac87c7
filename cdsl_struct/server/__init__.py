"""OpenAI-compatible HTTP server (extra ``server``: ``pip install 'cdsl_struct[server]'``).

``create_app(generator)`` builds the FastAPI app; ``serve(host, port, model, draft)`` loads a
model and runs it with uvicorn (``cdsl-struct serve``). Importing this package does not import
FastAPI; the names are loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
