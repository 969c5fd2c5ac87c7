"""The compiled forward built off the request path: a second server process that compiles, then takes the traffic.

``serve`` answers from an eager Generator as soon as the model is loaded. Beside it, a child process
(``compiled_child``) loads the same model with the same options, compiles its forward with
``torch.compile`` and warms every shape a server meets (``models.compiled.warm``), checks the compiled
steps against the model's own forward (``models.self_check.check_ragged``), and serves the same app on a
Unix socket in a private folder. Once it answers there, this process hands it every new completion
request (``CompiledHandoff.proxy``: the body as received, the answer or its stream relayed as it comes);
requests already running here finish here. ``/health`` and ``/metrics`` say which forward answers and
what is still compiling; after the handoff ``/metrics`` is the child's own, which decodes every request.

Why a process and not a thread: compiling in the serving process stalled its steps for seconds at a
time (the compiler's Python holds the GIL: eager steps of 0.1 s took a median 0.24 s and up to 21.7 s
while a thread compiled, 2-core CPU), and it is not safe there: torch.fx's tracing patches
``torch.nn.Module.__call__`` for every thread while it runs, so an eager step on the engine's thread
was traced into the compiler's graph and failed (``NameError: module is not installed as a
submodule``), and ``torch.compiler.is_compiling()`` turns true process-wide. The child runs at a lower
CPU priority (``models.background_compile.CHILD_NICENESS``), so its minutes of compiling take the cores
the server leaves idle.

If the child fails (a compile error, a failed check, an exit), this process goes on serving eagerly and
says why in the log, ``/health`` and ``/metrics``; a request a dead child drops mid-answer gets 502.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..models.background_compile import lower_priority

log = logging.getLogger(__name__)

READY_POLL_S = 0.5
PROXIED_PATHS = ("/v1/chat/completions", "/v1/completions")
#: request headers not passed on to the child: hop-by-hop ones, and the credentials this process checked
_DROPPED_HEADERS = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"authorization", b"upgrade",
                    b"content-length"}
_DROPPED_RESPONSE_HEADERS = {"connection", "keep-alive", "transfer-encoding", "date", "server"}


#: ``serve``'s arguments the child takes as they are (the Generator's; the rest are ``ServerConfig``'s)
GENERATOR_OPTIONS = ("model", "draft", "backend", "whitespace", "loop_guard", "string_guard", "compile_timeout",
                     "device", "dtype", "max_batch_size", "extra_properties", "max_prompt_tokens", "tool_format")


def child_options(generator_options: dict[str, Any], config: Any) -> dict[str, Any]:
    """The JSON-able options of the child for a server of ``generator_options`` and ``config`` (a
    ``ServerConfig``; its API key stays here: the parent checks it, and only this user reaches the socket)."""
    server = asdict(config)
    server.pop("api_key", None)
    return {"generator": {k: generator_options[k] for k in GENERATOR_OPTIONS if k in generator_options},
            "server": server}


@dataclass
class HandoffState:
    """Where the compiled forward stands: ``phase`` is ``starting``, ``loading``, ``compiling``,
    ``checking`` (against the model's own forward, then until the child answers on its socket),
    ``ready`` (the child answers every new request), ``failed`` or ``stopped``."""

    phase: str = "starting"
    started: float = field(default_factory=time.monotonic)
    compile_seconds: float | None = None
    """The child's compile and warm-up, once done."""
    ready_after: float | None = None
    """Seconds from the child's start to its first answer over the socket."""
    reason: str | None = None
    """Why the compiled forward is not used (``failed``)."""
    proxied: int = 0


class CompiledHandoff:
    """Start a compiling child process with ``options`` (``compiled_child.run``'s), watch it, and proxy
    completion requests to it once it answers. ``command``: the child's command line (tests give
    their own); by default ``python -m cdsl_struct.server.compiled_child``."""

    def __init__(self, options: dict[str, Any], command: list[str] | None = None) -> None:
        self.options = options
        self.command = command or [sys.executable, "-m", "cdsl_struct.server.compiled_child"]
        self.state = HandoffState()
        self.folder = Path(tempfile.mkdtemp(prefix="cdsl-struct-compiled-"))  # 0700: only this user reaches it
        self.socket = self.folder / "server.sock"
        self.process: subprocess.Popen | None = None
        self._client: Any = None
        self._lock = threading.Lock()

    # --- the child --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the child and a thread that follows it (idempotent)."""
        with self._lock:
            if self.process is not None:
                return
            spec = json.dumps({"socket": str(self.socket), "options": self.options})
            self.process = subprocess.Popen([*self.command, spec], stdout=subprocess.PIPE, stderr=None, text=True,
                                            preexec_fn=lower_priority if os.name == "posix" else None)
        threading.Thread(target=self._follow, name="cdsl-compiled-child", daemon=True).start()

    def _follow(self) -> None:
        """Read the child's progress lines (JSON: ``phase``, ``seconds``, ``reason``) until it exits."""
        process = self.process
        assert process is not None and process.stdout is not None
        for line in process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or self.state.phase in ("failed", "stopped"):
                continue
            phase = event.get("phase")
            if phase == "compiled":
                self.state.compile_seconds = event.get("seconds")
                self.state.phase = "checking"
                threading.Thread(target=self._wait_until_answering, daemon=True).start()
            elif phase == "failed":
                self._fail(str(event.get("reason")))
            elif isinstance(phase, str) and self.state.phase != "ready":
                self.state.phase = phase
        code = process.wait()
        if self.state.phase != "stopped":
            self._fail(f"the compiling process exited with code {code}")

    def _wait_until_answering(self) -> None:
        import httpx

        transport = httpx.HTTPTransport(uds=str(self.socket))
        with httpx.Client(transport=transport, base_url="http://compiled", timeout=5.0) as client:
            while self.state.phase == "checking" and self.process is not None and self.process.poll() is None:
                try:
                    if client.get("/health").status_code == 200:
                        self.state.ready_after = time.monotonic() - self.state.started
                        self.state.phase = "ready"
                        log.info("the compiled forward is ready (compiled in %.0f s); new requests go to it",
                                 self.state.compile_seconds or 0)
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(READY_POLL_S)

    def _fail(self, reason: str) -> None:
        if self.state.phase in ("failed", "stopped"):
            return
        self.state.phase, self.state.reason = "failed", reason
        log.warning("the compiled forward is not used (%s); this server goes on decoding eagerly", reason)

    def stop(self, grace: float = 10.0) -> None:
        """Stop the child (its requests are cancelled) and remove its folder."""
        self.state.phase = "stopped"
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def ready(self) -> bool:
        """Whether new completion requests go to the child."""
        return self.state.phase == "ready"

    def describe(self) -> dict[str, Any]:
        """What ``/health`` reports: which forward answers, and the child's progress."""
        state = self.state
        return {"answers": "compiled" if self.ready else "eager", "phase": state.phase,
                "seconds_since_start": round(time.monotonic() - state.started, 1),
                "compile_seconds": state.compile_seconds, "ready_after_seconds": state.ready_after,
                "reason": state.reason, "proxied_requests": state.proxied}

    # --- proxying -----------------------------------------------------------------------------------
    def client(self) -> Any:
        """The child's HTTP client (made on first use, on the server's event loop)."""
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(self.socket)),
                                             base_url="http://compiled", timeout=None)
        return self._client

    async def proxy(self, scope: dict, receive: Any, send: Any) -> None:
        """Send one HTTP request (ASGI) to the child and relay its answer as it comes. A client that
        goes away closes the child's response, which cancels the request's rows there."""
        import httpx

        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _DROPPED_HEADERS]
        request = self.client().build_request(scope["method"], scope["path"], content=bytes(body),
                                              headers=headers, params=scope.get("query_string", b"").decode())
        self.state.proxied += 1
        try:
            response = await self.client().send(request, stream=True)
        except httpx.HTTPError as exc:
            await _error(send, 502, f"the compiled forward's process did not answer ({type(exc).__name__})")
            return
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode(), v.encode()) for k, v in response.headers.items()
                                    if k.lower() not in _DROPPED_RESPONSE_HEADERS]})
            async for chunk in response.aiter_raw():
                if gone.done():
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError:  # the child went away mid-answer: end what was started
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            await response.aclose()

    async def metrics(self) -> bytes:
        """``/metrics`` once handed off: the child's own (it decodes every request), then this
        process's gauges of the handoff; before, only those gauges (the caller adds its own metrics)."""
        served = b""
        if self.ready:
            try:
                response = await self.client().get("/metrics")
                served = response.content if response.status_code == 200 else b""
            except Exception:  # noqa: BLE001 - a child that does not answer: the gauges say where things stand
                served = b""
        return served + self.gauges()

    def gauges(self) -> bytes:
        """The handoff's gauges in Prometheus' text format."""
        state = self.state
        values = {"cdsl_forward_compiled_ready": ("1 while completion requests go to the compiled forward's "
                                                  "process", float(self.ready)),
                  "cdsl_forward_compiling": ("1 while that process loads, compiles or checks the forward",
                                             float(state.phase in ("starting", "loading", "compiling", "checking"))),
                  "cdsl_forward_compile_failed": ("1 where the compiled forward is not used (the log and /health "
                                                  "say why)", float(state.phase == "failed")),
                  "cdsl_forward_compile_seconds": ("Seconds the compile and warm-up took (0 until done)",
                                                   float(state.compile_seconds or 0.0))}
        lines = []
        for name, (help_text, value) in values.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        return ("\n".join(lines) + "\n").encode()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


async def _disconnected(receive: Any) -> None:
    """Return once the client went away (``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _error(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": "upstream_unavailable"}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class HandoffRouter:
    """ASGI middleware: completion requests go to the compiled child once it is ready; all else here."""

    def __init__(self, app: Any, handoff: CompiledHandoff) -> None:
        self.app = app
        self.handoff = handoff

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in PROXIED_PATHS \
                and self.handoff.ready:
            await self.handoff.proxy(scope, receive, send)
            return
        await self.app(scope, receive, send)
