"""The OpenAI-compatible FastAPI app over one ``Generator``, and ``serve`` to run it with uvicorn.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/chat/completions``,
``POST /v1/completions``, ``GET /health``, ``GET /metrics``. A request flows one way: the body is
parsed into a ``GenerateCall`` (``protocol``), admitted or refused with 429 (``worker``), its rows
decode in the Generator's batched engine with every other request's (tools become one
constraint there and the text is read back into calls), and the Results become response bodies
or stream chunks (``responses``). A request whose client goes away, or that runs past its
deadline, has its rows cancelled within a step.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ..constraints.whitespace import DEFAULT_WHITESPACE
from ..errors import CompileTimeout
from ..heap import freeze_loaded_objects
from ..options import SERVE_TORCH_COMPILE
from ..partial import NOTHING
from ..streaming import Thought
from ..tools import CallStream
from ..tools.formats import FORMATS
from . import responses
from .auth import API_KEY_ENV, ApiKeyAuth
from .errors import APIError, from_exception, install_handlers
from .handoff import HandoffRouter
from .limits import BodySizeLimit
from .metrics import Metrics, StatusCounter
from .protocol import ChatCompletionRequest, CompletionRequest, GenerateCall, ServerLimits
from .responses import ChunkWriter
from .worker import GenerationWorker

DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
DEFAULT_QUEUE_LIMIT = 64
DEFAULT_MAX_TOKENS = 256
DISCONNECT_POLL_S = 0.2


@dataclass(frozen=True)
class ServerConfig:
    """How the server admits and bounds requests.

    ``max_request_bytes``: larger bodies get 413. ``queue_limit``: requests that may wait behind
    the running ones (as many run together as the engine batches); more get 429 with
    Retry-After. ``default_max_tokens``: when a request gives none. ``limits``: what one request
    may ask (``ServerLimits``). ``request_timeout``: seconds a request may take before its rows
    are cancelled and it is answered 504. ``api_key``: required as a bearer token on ``/v1``
    when set. ``shutdown_grace``: seconds running requests get to finish on shutdown.
    ``compile_timeout``: seconds a request's constraint may take to read and compile (past it:
    400 ``compile_timeout``); None: the Generator's own.
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    queue_limit: int = DEFAULT_QUEUE_LIMIT
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    limits: ServerLimits = field(default_factory=ServerLimits)
    request_timeout: float = 600.0
    api_key: str | None = None
    shutdown_grace: float = 30.0
    compile_timeout: float | None = None



class PartialText(str):
    """An answer delta with the answer's typed partial value after it (``stream_options.partial_values``)."""

    value: Any

    def __new__(cls, text: str, value: Any) -> PartialText:
        made = super().__new__(cls, text)
        made.value = value
        return made

class _Service:
    """The Generator behind the routes: admission, cancellation, the served model's name."""

    def __init__(self, generator: Any, config: ServerConfig) -> None:
        self.generator = generator
        self.config = config
        self.worker = GenerationWorker(config.queue_limit, getattr(generator, "max_batch_size", 1))
        self.metrics = Metrics(self.worker, getattr(generator, "load", None))
        self.compile_timeout = config.compile_timeout if config.compile_timeout is not None \
            else getattr(generator, "compile_timeout", None)
        self.model = str(generator.model_name)
        self.created = int(time.time())
        self.cancels: set[threading.Event] = set()

    def check_model(self, name: str | None) -> None:
        if name and name != self.model:
            raise APIError(404, f"The model {name!r} does not exist on this server; it serves {self.model!r}.",
                           param="model", code="model_not_found")

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": self.created, "owned_by": "cdsl_struct"}

    def _generate(self, call: GenerateCall, cancel: threading.Event) -> Any:
        """The Result of ``call`` (a list of them for a batch: several prompts, or ``n`` > 1)."""
        verb = self.generator.generate_batch if call.is_batch else self.generator.generate
        return verb(call.prompt, params=call.params, cancel=cancel, compile_timeout=self.compile_timeout,
                    **call.kwargs)

    async def read(self, body: ChatCompletionRequest | CompletionRequest) -> GenerateCall:
        """The request's ``GenerateCall``, read off the event loop (a client's grammar builds a
        lark parser) within the compile timeout: past it the client gets 400 ``compile_timeout``
        at once (the reading thread, bounded by the grammar limits, ends by itself)."""
        timeout = self.compile_timeout
        reading = asyncio.to_thread(body.to_call, self.config.default_max_tokens, self.config.limits)
        try:
            return await asyncio.wait_for(reading, timeout)
        except asyncio.TimeoutError:
            raise from_exception(CompileTimeout(f"reading the request's constraint took longer than {timeout} s"),
                                 param=body.constraint_field()) from None

    async def _watch(self, cancel: threading.Event, http: Request, deadline: float, *,
                     disconnects: bool = True) -> None:
        """Set ``cancel`` when ``deadline`` passes or (with ``disconnects``) the client goes away."""
        while not cancel.is_set():
            await asyncio.sleep(DISCONNECT_POLL_S)
            if time.perf_counter() > deadline or (disconnects and await http.is_disconnected()):
                cancel.set()

    def _deadline_error(self) -> APIError:
        return APIError(504, f"The request ran past the server's deadline of {self.config.request_timeout} s "
                             "(or its client went away) and was cancelled.", code="deadline_exceeded")

    # --- whole answers --------------------------------------------------------------------------
    async def answer(self, call: GenerateCall, http: Request) -> list[Any]:
        """Run ``call``; cancel its rows if the client goes away or the deadline passes."""
        cancel = threading.Event()
        self.cancels.add(cancel)
        started = time.perf_counter()
        watcher = asyncio.ensure_future(self._watch(cancel, http, started + self.config.request_timeout))
        try:
            output = await self.worker.run(lambda: self._generate(call, cancel))
        except Exception as exc:
            raise from_exception(exc, param=call.constraint_param) from exc
        finally:
            cancel.set()  # also when this handler is cancelled (server shutdown)
            self.cancels.discard(cancel)
            watcher.cancel()
        results = output if isinstance(output, list) else [output]
        self.metrics.observe(results, started)
        if any(r.finish_reason == "cancelled" for r in results):
            raise self._deadline_error()
        return results

    # --- streams ----------------------------------------------------------------------------------
    async def stream(self, call: GenerateCall, http: Request, *, chat: bool,
                     include_usage: bool, partials: bool = False) -> StreamingResponse:
        """Server-sent events; errors before the first item are answered with their status code.

        The deadline holds for the whole stream; a client that goes away before the first item is
        noticed here (after it, the response notices and closes the events, cancelling the row).
        """
        cancel = threading.Event()
        self.cancels.add(cancel)
        started = time.perf_counter()
        deadline = started + self.config.request_timeout
        watcher = asyncio.ensure_future(self._watch(cancel, http, deadline))
        items = self.worker.stream(lambda: self._stream_items(call, cancel, partials))
        try:
            first = await items.__anext__()
        except BaseException as exc:
            cancel.set()
            self.cancels.discard(cancel)
            watcher.cancel()
            await items.aclose()
            if isinstance(exc, Exception):
                raise from_exception(exc, param=call.constraint_param) from exc
            raise
        watcher.cancel()  # from here the response watches the connection; only the deadline is ours
        if not cancel.is_set():
            watcher = asyncio.ensure_future(self._watch(cancel, http, deadline, disconnects=False))
        if _cancelled_result(first):  # the client left or the deadline passed before any text
            cancel.set()
            self.cancels.discard(cancel)
            watcher.cancel()
            await items.aclose()
            raise self._deadline_error()
        events = self._events(first, items, call, ChunkWriter(self.model, chat=chat, partials=partials), include_usage,
                              cancel, started, watcher)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _stream_items(self, call: GenerateCall, cancel: threading.Event, partials: bool = False) -> Iterator[Any]:
        """The text deltas of ``call`` (with ``partials``, answer deltas as ``PartialText`` holding
        the partial value so far), then its Result; closed early, the request is cancelled."""
        with self.generator.stream(call.prompt, params=call.params, cancel=cancel,
                                   compile_timeout=self.compile_timeout, **call.kwargs) as stream:
            for delta in stream:
                if partials and not isinstance(delta, Thought) and stream.partial is not None:
                    delta = PartialText(delta, stream.partial)
                yield delta
            yield stream.result

    async def _events(self, first: Any, items: AsyncIterator[Any], call: GenerateCall, writer: ChunkWriter,
                      include_usage: bool, cancel: threading.Event, started: float,
                      watcher: asyncio.Future) -> AsyncIterator[str]:
        written = FORMATS[call.kwargs["tool_format"]] if "tool_format" in call.kwargs else \
            getattr(self.generator, "tool_format", None)
        calls = CallStream(written) if call.tool_mode and writer.chat else None
        if writer.chat:
            yield writer.delta({"role": "assistant", "content": None if calls else ""})
        result, first_at, streamed = None, None, ""
        try:
            item = first
            while True:
                if isinstance(item, Thought):  # thinking: chat's reasoning_content; completions drop it
                    if item and first_at is None:
                        first_at = time.perf_counter()
                    if writer.chat and item:
                        yield writer.delta({"reasoning_content": str(item)})
                elif isinstance(item, str):
                    if item and first_at is None:
                        first_at = time.perf_counter()
                    streamed += item
                    for chunk in self._text_chunks(item, calls, writer):
                        yield chunk
                else:
                    result = item
                    rest = result.text[len(streamed):] if result.text.startswith(streamed) else ""
                    for chunk in self._text_chunks(rest, calls, writer):  # what no delta carried
                        yield chunk
                try:
                    item = await items.__anext__()
                except StopAsyncIteration:
                    break
        except Exception as exc:
            yield responses.sse(from_exception(exc, param=call.constraint_param).body())
            yield responses.sse("[DONE]")
            return
        finally:
            cancel.set()  # a client that went away closes this generator: its row stops within a step
            self.cancels.discard(cancel)
            watcher.cancel()
            await items.aclose()
        if result is None:
            yield responses.sse(APIError(500, "The generation ended without a result.").body())
            yield responses.sse("[DONE]")
            return
        if result.finish_reason == "cancelled":  # the deadline passed mid-stream
            self.metrics.observe([result], started, first_at)
            yield responses.sse(self._deadline_error().body())
            yield responses.sse("[DONE]")
            return
        if calls is not None:
            held = calls.flush()
            if held:
                yield writer.content(held)
        self.metrics.observe([result], started, first_at)
        yield writer.finish(result, responses.finish_reason(result, call.named_tool))
        if include_usage:
            yield writer.usage(result)
        yield responses.sse("[DONE]")

    @staticmethod
    def _text_chunks(delta: str, calls: CallStream | None, writer: ChunkWriter) -> Iterator[str]:
        if calls is None:
            if delta:
                yield writer.content(delta, getattr(delta, "value", NOTHING))
            return
        content, pieces = calls.push(delta)
        if content:
            yield writer.content(content)
        for piece in pieces:
            yield writer.call_delta(piece, calls.calls[piece.index].arguments if writer.partials else None)

    def shutdown(self) -> None:
        """Cancel what still runs and stop the workers."""
        for cancel in list(self.cancels):
            cancel.set()
        self.worker.shutdown()


def create_app(generator: Any, config: ServerConfig | None = None, *, handoff: Any = None,
               **options: Any) -> FastAPI:
    """An OpenAI-compatible app serving ``generator`` (a ``cdsl_struct.api.Generator``).

    ``config`` (or its fields as keyword arguments): see ``ServerConfig``. ``handoff``: a started
    ``handoff.CompiledHandoff``, whose process answers the completion requests once it is ready.
    """
    config = config or ServerConfig(**options)
    service = _Service(generator, config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        service.shutdown()
        if handoff is not None:
            await handoff.aclose()

    app = FastAPI(title="cdsl_struct", description="OpenAI-compatible structured generation", lifespan=lifespan)
    app.state.service = service
    install_handlers(app)
    if handoff is not None:  # inside the body limit and the key check: the child trusts what reaches it
        app.add_middleware(HandoffRouter, handoff=handoff)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_request_bytes, timeout=config.request_timeout)
    if config.api_key:
        app.add_middleware(ApiKeyAuth, api_key=config.api_key)
    app.add_middleware(StatusCounter, metrics=service.metrics)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, the served model, how many requests are running or waiting here, and which
        forward answers (``forward``: ``answers`` is ``eager`` or ``compiled``, ``runner`` is ``graph``,
        ``ragged`` or ``padded`` with the ``cuda_graphs`` it replays; with a compiling process, its
        ``phase``, seconds and, where it failed, the reason)."""
        load = getattr(generator, "load", None)
        forward = handoff.describe() if handoff is not None else \
            {"answers": "compiled" if load is not None and load().compiled_active else "eager", "phase": None}
        if load is not None and handoff is None:
            now = load()
            forward["runner"] = "graph" if now.static_runner else "ragged" if now.ragged_runner else "padded"
            forward["cuda_graphs"] = now.cuda_graphs
        return {"status": "ok", "model": service.model, "active_requests": service.worker.active,
                "forward": forward}

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus metrics (once a compiled process answers the requests, its metrics, with the handoff's)."""
        if handoff is None:
            return Response(service.metrics.exposition(), media_type=service.metrics.content_type)
        body = await handoff.metrics()
        if not handoff.ready:
            body = service.metrics.exposition() + body
        return Response(body, media_type=service.metrics.content_type)

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
    async def chat_completions(body: ChatCompletionRequest, http: Request) -> dict[str, Any] | StreamingResponse:
        """Chat completion: messages through the chat template, constrained output or tool calls."""
        service.check_model(body.model)
        call = await service.read(body)
        if body.stream:
            return await service.stream(call, http, chat=True, include_usage=body.include_usage,
                                        partials=body.include_partials)
        results = await service.answer(call, http)
        return responses.chat_completion(results, service.model, call.named_tool)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, http: Request) -> dict[str, Any] | StreamingResponse:
        """Text completion of a prompt (or a list of prompts), constrained by the extension fields."""
        service.check_model(body.model)
        call = await service.read(body)
        if body.stream:
            return await service.stream(call, http, chat=False, include_usage=body.include_usage,
                                        partials=body.include_partials)
        results = await service.answer(call, http)
        return responses.text_completion(results, service.model, call.n)

    return app


def _cancelled_result(item: Any) -> bool:
    return not isinstance(item, str) and getattr(item, "finish_reason", None) == "cancelled"


def serve(host: str = "127.0.0.1", port: int = 8000, model: str = "smollm2", draft: str | None = "auto", *,
          backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE, loop_guard: bool = True,
          string_guard: bool = True, compile_timeout: float = 30.0,
          log_level: str = "info",
          device: Any = "auto", dtype: Any = "auto", max_batch_size: int = 32, extra_properties: bool = False,
          max_prompt_tokens: int | None = None, torch_compile: bool | str = SERVE_TORCH_COMPILE,
          tool_format: str = "auto", **options: Any) -> None:
    """Load ``model`` (with ``draft``) once on ``device`` and serve it on ``host:port`` until interrupted.

    It answers as soon as the model is loaded, on the eager forward. ``torch_compile`` (``"auto"`` here:
    where compiling is measured to pay, ``models.compiled.why_not_compiled``; ``"on"``: wherever it
    compiles; ``"off"``): a second process compiles the forward meanwhile and takes every new request
    once it is ready (``handoff``), so no request waits for a compile. ``tool_format``: ``Generator``'s
    option. ``options``: ``ServerConfig`` fields; ``api_key`` defaults to the ``CDSL_STRUCT_API_KEY``
    environment variable.
    """
    import uvicorn

    from ..api import Generator
    from ..models.compiled import compile_mode, why_not_compiled
    from .handoff import CompiledHandoff, child_options

    options.setdefault("api_key", os.environ.get(API_KEY_ENV) or None)
    config = ServerConfig(**options)
    mode = compile_mode(torch_compile)
    generator_options = {"model": model, "draft": draft, "backend": backend, "whitespace": whitespace,
                         "loop_guard": loop_guard, "string_guard": string_guard, "compile_timeout": compile_timeout,
                         "device": device, "dtype": dtype, "max_batch_size": max_batch_size,
                         "extra_properties": extra_properties, "max_prompt_tokens": max_prompt_tokens,
                         "tool_format": tool_format}
    generator = Generator(**generator_options, torch_compile="off")
    load = generator.load()
    static = getattr(load, "static_runner", False)
    runner = "graph runner" if static else "ragged runner" if load.ragged_runner else "padded runner"
    if static:
        runner += f" ({load.cuda_graphs} CUDA graphs)" if load.cuda_graphs else f" (eager: {load.graphs_off})"
        ahead_off = getattr(generator.engine.runner, "ahead_off", None)
        runner += " (steps launched ahead)" if generator.engine.run_ahead else \
            f" (steps in turn: {ahead_off})" if ahead_off else ""
    if load.runner_fallback:
        runner += f" (a runner failed its self-check: {load.runner_fallback})"
    handoff = None
    reason = None if mode == "on" else why_not_compiled(generator.engine.runner) if mode == "auto" else "off"
    if reason is None and not isinstance(model, str):
        reason = "the model was given loaded; the compiling process loads a model by its name"
    if reason is None:
        handoff = CompiledHandoff(child_options(generator_options, config))
        handoff.start()
    plan = f"torch_compile {mode}: " + ("compiling in a second process; it takes the requests once ready"
                                        if handoff is not None else f"stays eager ({reason})")
    print(f"forward: eager, {runner}; {plan}", file=sys.stderr, flush=True)
    freeze_loaded_objects()
    app = create_app(generator, config, handoff=handoff)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level,
                    timeout_graceful_shutdown=max(1, int(config.shutdown_grace)))
    finally:
        if handoff is not None:
            handoff.stop(config.shutdown_grace)
