"""The compiled forward built off the request path (``server.handoff``): while a second process compiles,
requests are answered here at once; once it answers, new completion requests (whole and streamed) go to
it with the API key checked here; ``/health`` and ``/metrics`` say which forward answers; a child that
fails or dies leaves this server answering eagerly. Mechanics with a scripted child and the fake
Generator; then the real child on a tiny random Llama, whose compiled answers equal the eager ones."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from .conftest import SERVER_EXTRA, running_server
from .test_server_mechanics import FakeGenerator

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
httpx = pytest.importorskip("httpx", reason=SERVER_EXTRA)

from cdsl_struct.server import create_app  # noqa: E402
from cdsl_struct.server.handoff import CompiledHandoff  # noqa: E402

CHILD = r'''
import json, os, sys, time
import uvicorn

spec = json.loads(sys.argv[1])
options = spec["options"]


def say(phase, **fields):
    print(json.dumps({"phase": phase, **fields}), flush=True)


say("loading")
say("compiling")
while not os.path.exists(options["go"]):
    time.sleep(0.05)
if options.get("fail"):
    say("failed", reason="the scripted compile failed")
    sys.exit(1)
say("compiled", seconds=1.5)


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {k.decode(): v.decode() for k, v in scope["headers"]}
    if scope["path"] == "/v1/chat/completions" and json.loads(body).get("stream"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for piece in ("a", "b", "c"):
            await send({"type": "http.response.body", "body": f"data: {piece}\n\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        return
    if scope["path"] == "/metrics":
        answer = b"child_requests_total 3.0\n"
    else:
        answer = json.dumps({"answered_by": "child", "path": scope["path"], "body": json.loads(body or b"null"),
                             "authorization": headers.get("authorization")}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


uvicorn.run(app, uds=spec["socket"], log_level="warning")
'''


def _wait(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _chat(url: str, text: str, key: str = "k", **extra):
    return httpx.post(f"{url}/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "fake-model", "messages": [{"role": "user", "content": text}], **extra})


@pytest.fixture
def scripted(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    def start(**options) -> tuple[CompiledHandoff, Path]:
        go = tmp_path / "go"
        handoff = CompiledHandoff({"go": str(go), **options}, command=[sys.executable, str(script)])
        handoff.start()
        return handoff, go

    return start


def test_requests_are_answered_here_while_compiling_then_by_the_compiled_process(scripted):
    handoff, go = scripted()
    try:
        with running_server(create_app(FakeGenerator(), handoff=handoff, api_key="k")) as url:
            root = url.removesuffix("/v1")
            _wait(lambda: handoff.state.phase == "compiling")
            answer = _chat(url, "hello")
            assert answer.status_code == 200 and "hello" in answer.json()["choices"][0]["message"]["content"]
            health = httpx.get(f"{root}/health").json()["forward"]
            assert health["answers"] == "eager" and health["phase"] == "compiling"
            metrics = httpx.get(f"{root}/metrics").text
            assert "cdsl_forward_compiling 1.0" in metrics and "cdsl_requests_total" in metrics

            go.touch()
            _wait(lambda: handoff.ready)
            response = _chat(url, "hello again")
            assert response.headers.get("content-length") == str(len(response.content))  # framed as the child's
            answer = response.json()
            assert answer["answered_by"] == "child" and answer["path"] == "/v1/chat/completions"
            assert answer["body"]["messages"][0]["content"] == "hello again"
            assert answer["authorization"] is None  # the key was checked here, not passed on
            assert _chat(url, "hello", key="wrong").status_code == 401  # refused here, never proxied
            with httpx.stream("POST", f"{url}/chat/completions", headers={"Authorization": "Bearer k"},
                              json={"model": "fake-model", "stream": True, "messages": []}) as stream:
                events = [line for line in stream.iter_lines() if line]
            assert events == ["data: a", "data: b", "data: c", "data: [DONE]"]
            health = httpx.get(f"{root}/health").json()["forward"]
            assert health["answers"] == "compiled" and health["compile_seconds"] == 1.5
            assert health["proxied_requests"] == 2  # the one refused for its key never reached the child
            metrics = httpx.get(f"{root}/metrics").text
            assert "child_requests_total 3.0" in metrics and "cdsl_forward_compiled_ready 1.0" in metrics
            assert "cdsl_requests_total" not in metrics  # the child's metrics now, not this process's

            handoff.process.kill()  # the compiled process dies: this one answers again
            _wait(lambda: handoff.state.phase == "failed", 10)
            answer = _chat(url, "still there")
            assert answer.status_code == 200 and "still there" in answer.json()["choices"][0]["message"]["content"]
            forward = httpx.get(f"{root}/health").json()["forward"]
            assert forward["answers"] == "eager" and "exited" in forward["reason"]
    finally:
        handoff.stop()
    assert not handoff.folder.exists()


def test_a_child_that_fails_to_compile_leaves_the_server_eager(scripted):
    handoff, go = scripted(fail=True)
    try:
        go.touch()
        _wait(lambda: handoff.state.phase == "failed")
        assert handoff.state.reason == "the scripted compile failed" and not handoff.ready
        with running_server(create_app(FakeGenerator(), handoff=handoff)) as url:
            assert "hello" in _chat(url, "hello").json()["choices"][0]["message"]["content"]
            assert "cdsl_forward_compile_failed 1.0" in httpx.get(url.removesuffix("/v1") + "/metrics").text
    finally:
        handoff.stop()


def test_the_real_child_compiles_and_answers_as_the_eager_server(tmp_path_factory):
    """``compiled_child`` on a tiny random Llama (SmolLM2's tokenizer): it compiles, passes its check
    and takes the requests; its greedy answers (float32) equal this process's eager ones."""
    from cdsl_struct.api import Generator
    from cdsl_struct.server.app import ServerConfig
    from cdsl_struct.server.handoff import child_options
    from tests.models.solo import save_tiny_llama

    folder = save_tiny_llama(tmp_path_factory.mktemp("tiny-handoff"), seed=2, heads=4, kv_heads=2)
    options = {"model": folder, "draft": None, "dtype": "float32", "device": "cpu"}
    config = ServerConfig(default_max_tokens=24)
    handoff = CompiledHandoff(child_options(options, config))
    handoff.start()
    generator = Generator(**options)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
            "max_tokens": 24, "temperature": 0}
    try:
        with running_server(create_app(generator, config, handoff=handoff)) as url:
            prompts = [f"Describe person number {i} as JSON." for i in range(3)]
            eager = [_chat(url, p, model=generator.model_name, **body).json()["choices"][0]["message"]["content"]
                     for p in prompts]
            _wait(lambda: handoff.ready or handoff.state.phase == "failed", 600)
            assert handoff.ready, handoff.state.reason
            compiled = [_chat(url, p, model=generator.model_name, **body).json()["choices"][0]["message"]["content"]
                        for p in prompts]
            assert compiled == eager and len(set(eager)) > 1
            metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
            assert "cdsl_engine_compiled 1.0" in metrics  # the child's engine, compiled
            assert json.loads(httpx.get(url.removesuffix("/v1") + "/health").text)["forward"]["answers"] == "compiled"
    finally:
        handoff.stop()
        generator.close()
