"""The OpenAI-compatible FastAPI app over one ``Generator``, and ``serve`` to run it with uvicorn.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/chat/completions``,
``POST /v1/completions``, ``GET /health``. Request fields are in ``protocol``, response bodies in
``responses``, status codes in ``errors``, the queue in ``worker``, the body limit in ``limits``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from ..prompts import prompt_ids
from ..tools import tool_request
from . import responses
from .errors import APIError, from_exception, install_handlers
from .limits import BodySizeLimit
from .protocol import ChatCompletionRequest, CompletionRequest, GenerateCall
from .responses import ChunkWriter, Finished
from .worker import GenerationWorker

DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
DEFAULT_QUEUE_LIMIT = 64
DEFAULT_MAX_TOKENS = 256


def count_prompt_tokens(generator: Any, prompt: Any, kwargs: dict[str, Any]) -> int:
    """Tokens of one prompt as ``Generator.generate`` renders it (chat template, tools' system prompt)."""
    calls = tool_request(kwargs.get("tools"), kwargs.get("tool_choice", "auto"),
                         kwargs.get("parallel_tool_calls", False))
    system = calls.system_prompt() if calls else None
    return len(prompt_ids(generator.tokenizer, prompt, chat=kwargs.get("chat", True), system=system))


class _Service:
    """The Generator behind the routes: the queue, the served model names, the defaults."""

    def __init__(self, generator: Any, worker: GenerationWorker, default_max_tokens: int) -> None:
        self.generator = generator
        self.worker = worker
        self.default_max_tokens = default_max_tokens
        self.model = str(generator.model_name)
        self.created = int(time.time())

    def check_model(self, name: str | None) -> None:
        if name and name != self.model:
            raise APIError(404, f"The model {name!r} does not exist on this server; it serves {self.model!r}.",
                           param="model", code="model_not_found")

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.created, "owned_by": "cdsl_struct"}

    # --- jobs, run on the worker threads ------------------------------------------------------------
    def finished(self, call: GenerateCall) -> Finished | list[Finished]:
        output = self.generator.generate(call.prompt, **call.kwargs)
        if isinstance(output, list):
            return [Finished(result, count_prompt_tokens(self.generator, prompt, call.kwargs))
                    for result, prompt in zip(output, call.prompt, strict=True)]
        return Finished(output, count_prompt_tokens(self.generator, call.prompt, call.kwargs))

    def streamed(self, call: GenerateCall) -> Iterator[str | Finished]:
        stream = self.generator.generate(call.prompt, stream=True, **call.kwargs)
        try:
            for item in stream:
                if isinstance(item, str):
                    yield item
                else:
                    yield Finished(item, count_prompt_tokens(self.generator, call.prompt, call.kwargs))
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    # --- answers --------------------------------------------------------------------------------------
    async def answer(self, call: GenerateCall) -> Finished | list[Finished]:
        try:
            return await self.worker.run(lambda: self.finished(call))
        except Exception as exc:
            raise from_exception(exc, param=call.constraint_param) from exc

    async def stream(self, call: GenerateCall, *, chat: bool, include_usage: bool) -> StreamingResponse:
        """Server-sent events; errors before the first item are answered with their status code."""
        items = self.worker.stream(lambda: self.streamed(call))
        try:
            first = await items.__anext__()
        except Exception as exc:
            await items.aclose()
            raise from_exception(exc, param=call.constraint_param) from exc
        tool_mode = bool(call.kwargs.get("tools")) and call.kwargs.get("tool_choice") != "none"
        events = self._events(first, items, call, ChunkWriter(self.model, chat=chat), include_usage, tool_mode)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _events(self, first: Any, items: AsyncIterator[Any], call: GenerateCall, writer: ChunkWriter,
                      include_usage: bool, tool_mode: bool) -> AsyncIterator[str]:
        def content(text: str) -> dict[str, Any] | str:
            return {"content": text} if writer.chat else text

        if writer.chat:
            yield writer.delta({"role": "assistant", "content": ""})
        sent: list[str] = []
        done: Finished | None = None
        try:
            item = first
            while True:
                if isinstance(item, Finished):
                    done = item
                elif item and not tool_mode:  # tool calls are sent whole, once parsed
                    sent.append(item)
                    yield writer.delta(content(item))
                try:
                    item = await items.__anext__()
                except StopAsyncIteration:
                    break
        except Exception as exc:
            yield responses.sse(from_exception(exc, param=call.constraint_param).body())
            yield responses.sse("[DONE]")
            return
        finally:
            await items.aclose()
        if done is None:
            yield responses.sse(APIError(500, "The generation ended without a result.").body())
            yield responses.sse("[DONE]")
            return
        result = done.result
        reason = responses.finish_reason(result)
        if reason == "tool_calls" and writer.chat:
            calls = [responses.tool_call_json(tool_call, i) for i, tool_call in enumerate(result.tool_calls)]
            yield writer.delta({"tool_calls": calls})
        else:
            streamed = "".join(sent)
            rest = result.text[len(streamed):] if result.text.startswith(streamed) else ""
            if rest:
                yield writer.delta(content(rest))
        yield writer.delta({} if writer.chat else "", reason)
        if include_usage:
            yield writer.usage(done)
        yield responses.sse("[DONE]")


def create_app(generator: Any, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               queue_limit: int = DEFAULT_QUEUE_LIMIT, compile_timeout: float | None = None,
               default_max_tokens: int = DEFAULT_MAX_TOKENS) -> FastAPI:
    """An OpenAI-compatible app serving ``generator`` (a ``cdsl_struct.api.Generator``).

    ``max_request_bytes``: larger bodies get 413. ``queue_limit``: requests allowed to wait behind
    the running ones (as many run together as the Generator's engine batches); more get 429.
    ``compile_timeout``: seconds a constraint may take to compile (default: the Generator's); over
    it the request gets 400 ``compile_timeout``.
    ``default_max_tokens``: when a request gives none.
    """
    if compile_timeout is not None:
        generator.compile_timeout = compile_timeout
    engine = getattr(generator, "engine", None)
    worker = GenerationWorker(queue_limit, engine.scheduler.max_batch_size if engine is not None else 1)
    service = _Service(generator, worker, default_max_tokens)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        worker.shutdown()

    app = FastAPI(title="cdsl_struct", description="OpenAI-compatible structured generation", lifespan=lifespan)
    app.state.service = service
    install_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, the served model, and how many requests are running or waiting."""
        return {"status": "ok", "model": service.model, "active_requests": worker.active}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        """The one loaded model."""
        return {"object": "list", "data": [service.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> dict[str, Any]:
        """The loaded model by its id; any other id is 404."""
        service.check_model(model_id)
        return service.model_card()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> dict[str, Any] | StreamingResponse:
        """Chat completion: messages through the chat template, constrained output or tool calls."""
        service.check_model(body.model)
        call = body.to_call(service.default_max_tokens)
        if body.stream:
            return await service.stream(call, chat=True, include_usage=body.include_usage)
        done = await service.answer(call)
        assert isinstance(done, Finished)
        return responses.chat_completion(done, service.model)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> dict[str, Any] | StreamingResponse:
        """Text completion of a prompt (or a list of prompts), constrained by the extension fields."""
        service.check_model(body.model)
        call = body.to_call(service.default_max_tokens)
        if body.stream:
            return await service.stream(call, chat=False, include_usage=body.include_usage)
        done = await service.answer(call)
        return responses.text_completion(done if isinstance(done, list) else [done], service.model)

    return app


def serve(host: str = "127.0.0.1", port: int = 8000, model: str = "smollm2", draft: str | None = "auto", *,
          backend: str = "auto", whitespace: str = "compact", compile_timeout: float = 30.0,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, queue_limit: int = DEFAULT_QUEUE_LIMIT,
          default_max_tokens: int = DEFAULT_MAX_TOKENS, log_level: str = "info", device: Any = "auto",
          dtype: Any = "auto", max_batch_size: int = 16) -> None:
    """Load ``model`` (with ``draft``) once on ``device`` and serve it on ``host:port`` until interrupted."""
    import uvicorn

    from ..api import Generator

    generator = Generator(model, draft=draft, backend=backend, whitespace=whitespace, compile_timeout=compile_timeout,
                          device=device, dtype=dtype, max_batch_size=max_batch_size)
    app = create_app(generator, max_request_bytes=max_request_bytes, queue_limit=queue_limit,
                     default_max_tokens=default_max_tokens)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
