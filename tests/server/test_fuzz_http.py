"""Property-based fuzzing of the HTTP surface with schemathesis, against the server's own OpenAPI
schema (``/openapi.json``, fetched over HTTP) on a real uvicorn over the embedded SmolLM2.

Two rounds. The schema as served: every operation gets requests that fit it (positive) and
requests that break it (negative); most of these stop at validation. The schema narrowed to what
the server can serve (the served model's name, the chat roles, small ``n`` and ``max_tokens``;
``seed``, constraints, tools, stops and sampling left as free as the schema says): these reach
the constraint compilers and the engine. In both: no answer is 5xx or missing, every 4xx body and
every error event in a stream is OpenAI's ``{"error": {"message", "type", "param", "code"}}`` and
none is a server error, and afterwards the server answers ``/health`` and a well-formed request.
The budget is small (a few examples per operation and mode, at most 4 output tokens) so the file
stays within about a minute on a 2-core machine. (This found the 500s that
test_hostile_requests.py now pins: constraints forcing a byte SmolLM2 has no token for, sub-1e-38
temperatures, keyword requests with an empty prompt.)

schemathesis generates the requests (``APIOperation.as_strategy``) under hypothesis' ``@given``;
its pytest plugin (``schemathesis.pytest.from_fixture``) is not used: it reads the ``_nodeid``
attribute that pytest 9 no longer has.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import SERVER_EXTRA, running_server

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
schemathesis = pytest.importorskip("schemathesis", reason="needs the dev extra: pip install 'cdsl_struct[dev]'")
httpx = pytest.importorskip("httpx2", reason=SERVER_EXTRA)

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402 - after the skips

SEED = 22
AS_SERVED_EXAMPLES = 30
"""Generated requests per operation and mode with the schema as served."""
NARROWED_EXAMPLES = 60
"""Generated requests per POST operation with the narrowed schema (these reach the engine)."""
CLIENT_TIMEOUT_S = 30.0
EXPECTED_OPERATIONS = {"GET /health", "GET /metrics", "GET /v1/models", "GET /v1/models/{model_id}",
                       "POST /v1/chat/completions", "POST /v1/completions"}


@pytest.fixture(scope="module")
def served(smollm2, one_torch_thread) -> Iterator[str]:
    """A real server over SmolLM2 with tight limits (2 output tokens by default, at most 4); its root URL."""
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app
    from cdsl_struct.server.protocol import ServerLimits

    app = create_app(Generator(smollm2), default_max_tokens=2, limits=ServerLimits(max_tokens=4),
                     compile_timeout=5.0, request_timeout=20.0, max_request_bytes=256 * 1024)
    with running_server(app) as base_url:
        yield base_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def openapi(served: str) -> dict[str, Any]:
    """The server's own OpenAPI document."""
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        response = http.get(f"{served}/openapi.json")
    assert response.status_code == 200
    return response.json()


def load(document: dict[str, Any], served: str) -> Any:
    """A schemathesis schema of ``document`` whose requests go to ``served``."""
    return schemathesis.openapi.from_dict(document, config=schemathesis.Config.from_dict({"seed": SEED,
                                                                                         "base-url": served}))


def narrowed(document: dict[str, Any], model: str) -> dict[str, Any]:
    """``document`` with the request bodies narrowed to what this server serves rather than refuses at
    once, so generated requests reach the compilers and the engine: the served model (or none), chat
    roles, short prompts, messages and keywords, ``n`` <= 2, ``max_tokens`` <= 4, valid ``method``
    names, no undeclared keys, none of the fields it refuses by name (``logit_bias``, ``echo``, ``suffix``,
    ``best_of``). ``seed``, sampling parameters, stops, ``response_format`` schemas, regexes, grammars,
    choices and tools stay as free as ``document`` has them."""
    document = copy.deepcopy(document)
    schemas = document["components"]["schemas"]
    text = {"type": "string", "minLength": 1, "maxLength": 24}
    tokens = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 4}, {"type": "null"}]}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        request = schemas[name]
        request["additionalProperties"] = False
        props = request["properties"]
        for refused in ("logit_bias", "echo", "suffix", "best_of"):
            props.pop(refused, None)
        props["model"] = {"anyOf": [{"const": model}, {"type": "null"}]}
        props["max_tokens"] = tokens
        props["n"] = {"type": "integer", "minimum": 1, "maximum": 2}
        props["method"] = {"anyOf": [{"enum": ["auto", "target", "speculative"]}, {"type": "null"}]}
        props["keywords"] = {"anyOf": [{"type": "array", "items": text, "maxItems": 2}, {"type": "null"}]}
    chat = schemas["ChatCompletionRequest"]["properties"]
    chat["max_completion_tokens"] = tokens
    chat["messages"] = {"type": "array", "items": {"$ref": "#/components/schemas/ChatMessage"},
                        "minItems": 1, "maxItems": 3}
    chat["top_logprobs"] = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 20}, {"type": "null"}]}
    prompt = {"type": "string", "maxLength": 24}  # an empty one too: the server refuses it (400)
    schemas["CompletionRequest"]["properties"]["prompt"] = {
        "anyOf": [prompt, {"type": "array", "items": prompt, "minItems": 1, "maxItems": 3}]}
    schemas["ChatMessage"] = {"type": "object", "additionalProperties": False, "required": ["role", "content"],
                              "properties": {"role": {"enum": ["system", "user", "assistant"]}, "content": text}}
    return document


def openai_error_problem(body: Any) -> str | None:
    """What is wrong with an error body, measured against OpenAI's shape; None if nothing."""
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return f"not {{'error': {{...}}}}: {body!r}"
    error = body["error"]
    if set(error) != {"message", "type", "param", "code"}:
        return f"the error's keys are {sorted(error)}: {body!r}"
    if not (isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
            and error["type"]):
        return f"message and type must be non-empty strings: {body!r}"
    if not all(error[key] is None or isinstance(error[key], str) for key in ("param", "code")):
        return f"param and code must be strings or null: {body!r}"
    return None


def answer_problem(response: Any) -> str | None:
    """What is wrong with an answer: a 5xx, an error body not in OpenAI's shape, a stream carrying a
    server error or not ending with ``[DONE]``; None if nothing."""
    status, content = response.status_code, response.content
    if status >= 500:
        return f"{status} {content[:300]!r}"
    if status >= 400:
        try:
            return openai_error_problem(json.loads(content))
        except ValueError:
            return f"{status} with a body that is not JSON: {content[:300]!r}"
    content_type = " ".join(value for key, values in response.headers.items() if key.lower() == "content-type"
                            for value in values)  # schemathesis keeps each header as a list of values
    if not content_type.startswith("text/event-stream"):
        return None
    events = [event.removeprefix("data: ") for event in content.decode().split("\n\n") if event.strip()]
    if not events or events[-1] != "[DONE]":
        return f"a stream that does not end with [DONE]: {content[-300:]!r}"
    for event in events[:-1]:
        chunk = json.loads(event)
        if "error" in chunk:
            return f"an error event in a 200 stream: {chunk!r}" if chunk["error"].get("type") == "server_error" \
                else openai_error_problem(chunk)
    return None


def fuzz(operation: Any, mode: Any, examples: int, seen: list[int], problems: list[str], *,
         derandomize: bool = True) -> None:
    """Send ``examples`` generated requests for ``operation``; every status goes to ``seen``, every bad
    answer (see ``answer_problem``) or missing one to ``problems``, with the request that got it."""

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a real request
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        started = time.monotonic()
        try:
            response = case.call(timeout=CLIENT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a hang or a dropped connection is a finding too
            problem = f"no answer ({type(exc).__name__}: {exc}) after {time.monotonic() - started:.1f} s"
        else:
            seen.append(response.status_code)
            problem = answer_problem(response)
        if problem:
            problems.append(f"{operation.label} ({mode}): {problem}; request body {_excerpt(case.body)}")

    one()


def _excerpt(body: Any) -> str:
    text = repr(body) if isinstance(body, bytes) else json.dumps(body, default=str)
    return text if len(text) <= 800 else text[:800] + "..."


def operations_of(schema: Any) -> list[Any]:
    """Every operation of ``schema``; fails on one schemathesis could not read."""
    results = list(schema.get_all_operations())
    errors = [result.err() for result in results if not hasattr(result, "ok")]
    assert not errors, errors
    return [result.ok() for result in results]


def fuzz_all(openapi: dict[str, Any], served: str, *, as_served: int, narrowed_examples: int,
             derandomize: bool = True) -> tuple[list[int], list[int], list[str]]:
    """Both rounds over ``openapi``: the statuses of the first and of the second round, and the problems."""
    from schemathesis import GenerationMode

    first: list[int] = []
    second: list[int] = []
    problems: list[str] = []
    operations = operations_of(load(openapi, served))
    assert {operation.label for operation in operations} >= EXPECTED_OPERATIONS
    for operation in operations:
        fuzz(operation, GenerationMode.POSITIVE, as_served, first, problems, derandomize=derandomize)
        if operation.body:  # a GET's only parameter is a free path segment: nothing there can be invalid
            fuzz(operation, GenerationMode.NEGATIVE, as_served, first, problems, derandomize=derandomize)
    model = httpx.get(f"{served}/health", timeout=CLIENT_TIMEOUT_S).json()["model"]
    posts = [operation for operation in operations_of(load(narrowed(openapi, model), served))
             if operation.method.upper() == "POST"]
    assert len(posts) == 2
    for operation in posts:
        fuzz(operation, GenerationMode.POSITIVE, narrowed_examples, second, problems, derandomize=derandomize)
    return first, second, problems


@pytest.mark.timeout(150)
def test_generated_requests_get_no_server_error_and_openai_shaped_errors(openapi: dict[str, Any],
                                                                            served: str) -> None:
    first, second, problems = fuzz_all(openapi, served, as_served=AS_SERVED_EXAMPLES,
                                       narrowed_examples=NARROWED_EXAMPLES)
    assert not problems, f"{len(problems)} bad answers:\n" + "\n".join(problems)
    assert 400 in first and 422 in first, first
    assert second.count(200) >= NARROWED_EXAMPLES // 2, f"the narrowed round reached the engine too rarely: {second}"


def test_the_server_is_healthy_after_the_fuzzing(served: str) -> None:
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        health = http.get(f"{served}/health")
        assert health.status_code == 200 and health.json() == {"status": "ok", "model": "smollm2",
                                                               "active_requests": 0,
                                                               "forward": {"answers": "eager", "phase": None,
                                                                           "runner": "ragged", "cuda_graphs": 0}}
        answer = http.post(f"{served}/v1/completions", json={"prompt": "Answer yes or no:", "choices": ["yes", "no"]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] in ("yes", "no")
