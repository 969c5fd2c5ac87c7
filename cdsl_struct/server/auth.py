"""Optional API key: ``Authorization: Bearer KEY`` on the ``/v1`` routes, compared in constant time."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module for API_KEY_ENV, without the server extra installed
    from starlette.types import ASGIApp, Receive, Scope, Send

API_KEY_ENV = "CDSL_STRUCT_API_KEY"
"""The environment variable ``cdsl-struct serve`` reads the key from when ``--api-key`` is not given."""


class ApiKeyAuth:
    """Refuse ``/v1`` requests without the key with 401 (``/health`` and ``/metrics`` stay open)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("an empty API key would let every request in")
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/v1"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                from .errors import APIError

                error = APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                                 type="invalid_request_error", code="invalid_api_key")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
