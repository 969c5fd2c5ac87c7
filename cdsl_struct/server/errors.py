"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with a status code.

``APIError`` is what the routes raise; ``from_exception`` maps the library's errors (and
``ValueError`` for bad parameters) onto it; ``install_handlers`` makes FastAPI answer every error,
including its own request validation and routing errors, in that shape.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    CompileError,
    CompileTimeout,
    GrammarSyntaxError,
    InvalidSchema,
    PromptTooLong,
    UnsatisfiableSchema,
    UnsupportedFeature,
)

_log = logging.getLogger("cdsl_struct.server")

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    422: "invalid_request_error",
    504: "server_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error answered as ``status`` with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type or _STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """This error as a JSON response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def from_exception(exc: BaseException, *, param: str | None = None) -> APIError:
    """The ``APIError`` for an exception raised while handling a request.

    Constraint errors (invalid schema, grammar syntax, unsupported feature, unsatisfiable schema,
    compile timeout), a prompt too long and ``ValueError`` (bad parameters) are the client's: 400
    with the reason. ``param`` names the request field that carried the constraint. Anything else,
    the library's own errors while decoding included (``InvalidToken``, ``RollbackError``...), is
    the server's fault: 500 with a request id, the traceback in the server's log under that id.
    """
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, PromptTooLong):
        return APIError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, CompileTimeout):
        return APIError(400, f"Compiling the constraint took longer than the server's compile timeout: {exc}",
                        param=param, code="compile_timeout")
    if isinstance(exc, UnsupportedFeature):
        return APIError(400, f"Unsupported feature ({exc.feature}): {exc}", param=param, code="unsupported_feature")
    for kind, code in ((InvalidSchema, "invalid_schema"), (UnsatisfiableSchema, "unsatisfiable_schema"),
                       (GrammarSyntaxError, "grammar_syntax_error")):
        if isinstance(exc, kind):
            return APIError(400, str(exc), param=param, code=code)
    if isinstance(exc, CompileError):
        return APIError(400, str(exc), param=param, code=_snake(type(exc).__name__))
    if isinstance(exc, ValueError):
        return APIError(400, str(exc) or type(exc).__name__, param=getattr(exc, "param", None), code="invalid_value")
    if _is_template_error(exc):
        return APIError(400, f"The chat template refused the messages: {exc}", param="messages",
                        code="invalid_messages")
    return internal_error(exc)


def internal_error(exc: BaseException) -> APIError:
    """A 500 for a fault of the server's: logged with its traceback under a fresh request id,
    which the body and the ``x-request-id`` header carry so the two can be matched."""
    request_id = "req_" + uuid.uuid4().hex[:16]
    _log.error("internal error in request %s", request_id, exc_info=(type(exc), exc, exc.__traceback__))
    return APIError(500, f"Internal error ({type(exc).__name__}); request id {request_id} (see the server log).",
                    code="internal_error", headers={"x-request-id": request_id})


def _is_template_error(exc: BaseException) -> bool:
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - transformers depends on jinja2
        return False
    return isinstance(exc, TemplateError)


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = list(exc.errors())
    if any(error.get("type") == "json_invalid" for error in errors):
        detail = next(error for error in errors if error.get("type") == "json_invalid")
        reason = (detail.get("ctx") or {}).get("error", "")
        return APIError(422, f"The request body is not valid JSON{': ' + str(reason) if reason else ''}.",
                        code="invalid_json")
    messages, param = [], None
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part != "body"]
        where = ".".join(location)
        param = param or where or None
        messages.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return APIError(422, "Invalid request: " + "; ".join(messages), param=param, code="invalid_request")


def install_handlers(app: FastAPI) -> None:
    """Answer ``APIError``, request validation, routing and unexpected errors in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and "parsing the body" in str(exc.detail):  # not UTF-8: as any bad JSON
            return APIError(422, "The request body is not valid JSON (nor UTF-8 text).", code="invalid_json").response()
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()
