"""Hostile requests schemathesis will not find, against a real uvicorn over the embedded SmolLM2:
regex and grammar bombs, a huge ``uniqueItems`` enum, deep ``$ref`` chains, 10,000-item prompt and
stop lists, huge ``n`` and ``seed``, a slowloris client dribbling its body, clients that go away
mid-stream or mid-answer.

Each is answered within a bounded time: a 4xx in OpenAI's error shape naming the problem (its
``param`` and ``code``), or a valid 200 where the request can be served; never a 5xx, never a
hang. After each, the server is healthy: ``/health`` answers with no request left running and a
well-formed request gets a correct answer.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .conftest import SERVER_EXTRA, running_server

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
httpx = pytest.importorskip("httpx2", reason=SERVER_EXTRA)
regex = pytest.importorskip("regex")  # partial matching of a cut-off output; transformers depends on it

CLIENT_TIMEOUT_S = 30.0
REFUSAL_BOUND_S = 10.0
"""A request refused by its shape or a limit is answered within this (a busy 2-core machine)."""
COMPILE_TIMEOUT_S = 3.0
ANSWER_BOUND_S = 25.0
"""A servable hostile request (4 output tokens by default) is answered within this."""
SETTLE_S = 8.0
"""A request whose client went away has its rows ended within this."""


@pytest.fixture(scope="module")
def server(smollm2, one_torch_thread) -> Iterator[str]:
    """A real server over SmolLM2 with the default limits, a 3 s compile timeout and 4 output tokens
    by default; its base URL (``http://127.0.0.1:P/v1``)."""
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    app = create_app(Generator(smollm2), default_max_tokens=4, compile_timeout=COMPILE_TIMEOUT_S,
                     request_timeout=30.0)
    with running_server(app) as base_url:
        yield base_url


def root_of(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def port_of(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1].split("/", 1)[0])


def post(base_url: str, body: Any, *, path: str | None = None, timeout: float = CLIENT_TIMEOUT_S) -> tuple[Any, float]:
    """POST ``body`` (to completions when it has a prompt, else chat); the response and the seconds it took."""
    path = path or ("/completions" if "prompt" in body else "/chat/completions")
    started = time.monotonic()
    with httpx.Client(timeout=timeout) as http:
        response = http.post(f"{base_url}{path}", json=body)
    return response, time.monotonic() - started


def chat_body(content: str = "Say something.", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **fields}


def json_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def assert_openai_error(response: Any, status: int, *, param: str | None, code: str, words: str) -> None:
    """``response`` is ``status`` with OpenAI's error body naming ``param`` and ``code``, its message
    containing ``words``."""
    assert response.status_code == status, f"{response.status_code} {response.text[:500]}"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert error["type"] == "invalid_request_error", body
    assert (error["param"], error["code"]) == (param, code), body
    assert words in error["message"], body


def active_requests(base_url: str) -> int:
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        health = http.get(f"{root_of(base_url)}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text
    return health.json()["active_requests"]


def wait_until_idle(base_url: str, within: float = SETTLE_S) -> float:
    """Seconds until ``/health`` reports no request running or waiting; fails past ``within``."""
    started = time.monotonic()
    while (active := active_requests(base_url)) != 0:
        assert time.monotonic() - started < within, f"{active} requests still running after {within} s"
        time.sleep(0.05)
    return time.monotonic() - started


def assert_healthy(base_url: str) -> None:
    """Nothing left running, and a well-formed constrained request answered correctly."""
    wait_until_idle(base_url)
    response, took = post(base_url, {"prompt": "Is the sky blue? Answer yes or no:", "choices": ["yes", "no"]})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["text"] in ("yes", "no") and choice["finish_reason"] == "stop", choice
    assert took < ANSWER_BOUND_S


DEEP_SCHEMA: Any = {"type": "string"}
for _ in range(60):
    DEEP_SCHEMA = {"type": "array", "items": DEEP_SCHEMA}

REFUSED = {
    "regex with 400 nested groups": (
        {"prompt": "x", "regex": "(" * 400 + "a" + ")" * 400}, "regex", "unsupported_feature", "400 levels"),
    "grammar with 400 nested groups": (
        {"prompt": "x", "grammar": "start: " + "(" * 400 + '"a"' + ")" * 400 + "\n"},
        "grammar", "unsupported_feature", "400 levels"),
    "grammar with 4000 optional symbols": (
        {"prompt": "x", "grammar": "start: x\nx: " + " ".join(['"a"?'] * 4000) + "\n"},
        "grammar", "unsupported_feature", "alternatives"),
    "10,000-item enum with uniqueItems": (
        chat_body(response_format=json_format({"type": "array", "items": {"enum": list(range(10_000))},
                                               "uniqueItems": True})),
        "response_format", "unsupported_feature", "uniqueItems"),
    "6,000 enum strings with uniqueItems and maxItems": (
        chat_body(response_format=json_format({"type": "array", "uniqueItems": True, "maxItems": 3,
                                               "items": {"enum": [f"v{i}" for i in range(6_000)]}})),
        "response_format", "unsupported_feature", "uniqueItems"),
    "grammar of 3,000 terminals, each the next": (
        {"prompt": "x", "grammar": "start: A0\n" + "".join(f"A{i}: A{i + 1}\n" for i in range(3000)) + 'A3000: "a"\n'},
        "grammar", "constraint_too_large", "rules and terminals"),
    "grammar of 100 terminals, each the next": (
        {"prompt": "x", "grammar": "start: A0\n" + "".join(f"A{i}: A{i + 1}\n" for i in range(100)) + 'A100: "a"\n'},
        "grammar", "unsupported_feature", "nested terminals"),
    "regex over the size limit": ({"prompt": "x", "regex": "a" * 70_000}, "regex", "constraint_too_large", "bytes"),
    "schema nested 60 deep": (chat_body(response_format=json_format(DEEP_SCHEMA)), "response_format",
                              "constraint_too_deep", "deeper than"),
    "10,000 prompts": ({"prompt": ["hi"] * 10_000, "max_tokens": 1}, "prompt", "invalid_value", "10000 prompts"),
    "3 prompts times n=8": ({"prompt": ["hi"] * 3, "n": 8, "max_tokens": 1}, "prompt", "invalid_value",
                            "rows per request"),
    "n of a billion": (chat_body(n=10**9), "n", "invalid_value", "n=1000000000"),
    "n of 2**70": (chat_body(n=2**70), "n", "invalid_value", "limit"),
    "n of 2**70 on completions": ({"prompt": "x", "n": 2**70}, "n", "invalid_value", "limit"),
    "10,000 stop strings": (chat_body(stop=[f"s{i}" for i in range(10_000)]), "stop", "invalid_value", "at most 4"),
    "a 100,000-character stop string": (chat_body(stop="x" * 100_000), "stop", "invalid_value", "at most 256"),
    "four 1,000-character stop strings": (chat_body(stop=["y" * 1000] * 4), "stop", "invalid_value", "at most 256"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_hostile_request_is_refused_at_once_naming_the_problem(server: str, name: str) -> None:
    body, param, code, words = REFUSED[name]
    response, took = post(server, body)
    assert_openai_error(response, 400, param=param, code=code, words=words)
    assert took < REFUSAL_BOUND_S, f"{name}: refused after {took:.1f} s"
    assert active_requests(server) == 0


REF_CHAIN: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(199)}
REF_CHAIN["d199"] = {"type": "string", "maxLength": 3}
RULE_CHAIN = "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(250)) + 'r250: "a"\n'

SERVABLE = {
    "nested (a|aa)* regex": ({"prompt": "Letters:", "regex": "((((a|aa)*)*)*)*b", "max_tokens": 8},
                             r"((((a|aa)*)*)*)*b"),
    r"\w{1,5000} regex": ({"prompt": "A word:", "regex": r"\w{1,5000}"}, r"\w{1,5000}"),
    r"(\w{1,100}){1,100} regex": ({"prompt": "Words:", "regex": r"(\w{1,100}){1,100}"}, r"(\w{1,100}){1,100}"),
    "(.*a){20} regex": ({"prompt": "Text:", "regex": "(.*a){20}"}, "(.*a){20}"),
    "200 $defs each referencing the next": (
        chat_body("Give a short word as a JSON string.", response_format=json_format({"$defs": REF_CHAIN,
                                                                                      "$ref": "#/$defs/d0"}),
                  max_tokens=12), r'\s*"([^"\\]|\\u[0-9a-fA-F]{4}|\\[^u]){0,3}"\s*'),
    "grammar of 250 rules, each the next": ({"prompt": "Say a:", "grammar": RULE_CHAIN}, "a"),
    "seed 2**70": (chat_body(seed=2**70, temperature=1.0), None),
    "seed -(2**70) on completions": ({"prompt": "Once", "seed": -(2**70), "temperature": 1.0}, None),
    "four stop strings of 256 characters": (chat_body(stop=["z" * 256] * 4), None),
}


@pytest.mark.parametrize("name", list(SERVABLE))
def test_servable_hostile_request_gets_a_valid_answer_in_bounded_time(server: str, name: str) -> None:
    body, pattern = SERVABLE[name]
    response, took = post(server, body)
    assert response.status_code == 200, f"{name}: {response.status_code} {response.text[:500]}"
    assert took < ANSWER_BOUND_S, f"{name}: answered after {took:.1f} s"
    choice = response.json()["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length"), choice
    if pattern is not None:  # complete: the whole output matches; cut by max_tokens: it can still be completed
        assert regex.fullmatch(pattern, text, partial=choice["finish_reason"] == "length"), (name, choice)
    assert active_requests(server) == 0


def test_a_seed_that_overflows_does_not_fail_its_neighbours(server: str) -> None:
    """Seeds past 64 bits sent while two ordinary requests decode: each is answered (200, or 400 naming
    ``seed``) and the two neighbours, still running meanwhile, finish normally."""
    neighbour = chat_body("Write a long story about a dragon.", max_tokens=96)
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(post, server, neighbour) for _ in range(2)]
        deadline = time.monotonic() + REFUSAL_BOUND_S
        while active_requests(server) < 2:
            assert time.monotonic() < deadline and not any(f.done() for f in running)
            time.sleep(0.02)
        for seed in (2**70, -(2**70), 2**64 - 1):
            response, _ = post(server, chat_body(seed=seed, temperature=0.7, max_tokens=2))
            assert response.status_code == 200 or response.json()["error"]["param"] == "seed", response.text
        assert not any(f.done() for f in running), "the neighbours finished before the seeds came: no overlap"
        for future in running:
            answer, took = future.result(CLIENT_TIMEOUT_S)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["finish_reason"] in ("stop", "length") and took < ANSWER_BOUND_S
    assert_healthy(server)


# --- inputs that were 500s or wrong answers -------------------------------------------------------


def assert_not_a_server_error(response: Any, field: str) -> None:
    """200 (the output ends as a dead end or a valid one) or 400 naming ``field``; never 5xx."""
    assert response.status_code < 500, f"{response.status_code} {response.text[:400]}"
    if response.status_code != 200:
        assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text
        return
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length", "constraint_dead_end"), choice


@pytest.mark.parametrize(("field", "body"), [
    ("regex", {"prompt": "x", "regex": "\U00040225"}),
    ("regex", {"prompt": "x", "regex": "a\x04b"}),
    ("choices", {"prompt": "x", "choices": ["\U00040225x"]}),
    ("grammar", {"prompt": "x", "grammar": 'start: "\U00040225"\n'}),
    ("choices", chat_body(choices=["\U0006775a\u00cf\u00e6"], max_tokens=1, temperature=0)),
])
def test_a_constraint_forcing_a_character_the_vocabulary_cannot_spell_is_not_a_500(server: str, field: str,
                                                                                   body: dict[str, Any]) -> None:
    """SmolLM2 has no byte token for 0x04 0x06 0x13 0x14 0x16 0x1d 0xF1 0xF2...: the output ends as a
    dead end (or the request is refused naming the field), never 500 (was ``InvalidToken``)."""
    response, took = post(server, body)
    assert_not_a_server_error(response, field)
    assert took < REFUSAL_BOUND_S
    assert_healthy(server)


@pytest.mark.parametrize("sampling", [{"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1e-38},
                                      {"temperature": 1.0, "top_p": 1e-46}, {"temperature": 1.0, "top_p": 5e-324}])
def test_a_tiny_temperature_or_top_p_is_not_a_500(server: str, sampling: dict[str, float]) -> None:
    """Sampled as the near-greedy distribution it is, or 400 naming the field; never 500 (was a nan
    distribution: ``RuntimeError``)."""
    response, _ = post(server, {"prompt": "Once upon a time", "max_tokens": 2, **sampling})
    assert_not_a_server_error(response, next(reversed(sampling)))
    assert_healthy(server)


@pytest.mark.parametrize("prompt", ["", ["a", ""], "\x04"])
def test_a_keyword_request_whose_prompt_has_no_token_is_a_400_at_once(server: str, prompt: Any) -> None:
    """As without keywords: 400 'a request needs at least one prompt token', at once (was 500
    ``CdslError`` after decoding the other prompts for up to 14 s)."""
    response, took = post(server, {"prompt": prompt, "keywords": ["dog"], "max_tokens": 2})
    assert response.status_code == 400, f"{response.status_code} {response.text[:300]} after {took:.1f} s"
    assert "prompt token" in response.json()["error"]["message"] and took < REFUSAL_BOUND_S


CYCLE: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{(i + 1) % 200}"} for i in range(200)}


@pytest.mark.parametrize("schema", [{"$defs": CYCLE, "$ref": "#/$defs/d0"},
                                    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, {"$ref": "#"}],
                         ids=["200-cycle", "self", "root"])
def test_a_schema_whose_refs_only_cycle_is_a_400(server: str, schema: dict[str, Any]) -> None:
    """No instance validates (a validator recurses forever): 400 naming response_format, as an
    unsatisfiable schema is (was 200 with empty content and ``constraint_dead_end``)."""
    response, _ = post(server, chat_body(response_format=json_format(schema)))
    assert response.status_code == 400, response.text[:400]
    error = response.json()["error"]
    assert error["param"] == "response_format" and error["code"] in ("invalid_schema", "unsatisfiable_schema"), error


OPTIONAL_RULES = "start: r0\n" + "".join(f"r{i}: " + " ".join(['"a"?'] * 10) + f" r{i + 1}\n"
                                         for i in range(250)) + 'r250: "a"\n'
"""251 rules of ten optional symbols each (15 KB, under the rule limit): about 8 s for lark to read."""


def test_a_grammar_read_past_the_compile_timeout_is_a_400_naming_it(server: str) -> None:
    """Under the size and rule limits, yet longer to read than the compile timeout here: 400
    ``compile_timeout`` naming ``grammar``, at the timeout (or, on a machine fast enough to read it in
    time, a valid answer: a run of ``a``)."""
    response, took = post(server, {"prompt": "x", "grammar": OPTIONAL_RULES})
    assert took < COMPILE_TIMEOUT_S + REFUSAL_BOUND_S, f"answered after {took:.1f} s"
    if response.status_code == 200:
        assert regex.fullmatch("a+", response.json()["choices"][0]["text"]), response.text
    else:
        assert_openai_error(response, 400, param="grammar", code="compile_timeout", words="compile timeout")
    assert_healthy(server)


# --- slow and vanishing clients --------------------------------------------------------------------


def raw_request(base_url: str, path: str, body: bytes, *, send_body: bool = True) -> socket.socket:
    """A socket that has sent a POST of ``body`` to ``/v1{path}`` (only its request line and headers,
    announcing the body's length, when not ``send_body``)."""
    sock = socket.create_connection(("127.0.0.1", port_of(base_url)), timeout=CLIENT_TIMEOUT_S)
    sock.sendall(f"POST /v1{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    if send_body:
        sock.sendall(body)
    return sock


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """The status and raw body bytes of the response on ``sock`` (read until the server closes it)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


def test_slowloris_bodies_do_not_stall_other_clients(server: str) -> None:
    """Eight clients send their bodies 3 bytes at a time; meanwhile /health and a normal request are
    answered promptly, and each slow client, once its body is complete, gets its correct answer."""
    body = json.dumps({"prompt": "Is fire hot? Answer yes or no:", "choices": ["yes", "no"]}).encode()
    sockets = [raw_request(server, "/completions", body, send_body=False) for _ in range(8)]
    stop, answered = threading.Event(), threading.Event()

    def dribble() -> None:
        # the last byte waits until the other requests were answered, however loaded the machine
        for start in range(0, len(body) - 1, 3):
            for sock in sockets:
                sock.sendall(body[start:min(start + 3, len(body) - 1)])
            if stop.wait(0.06):
                return
        if answered.wait(CLIENT_TIMEOUT_S) and not stop.is_set():
            for sock in sockets:
                sock.sendall(body[-1:])

    sender = threading.Thread(target=dribble, daemon=True)
    sender.start()
    try:
        started = time.monotonic()
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
            assert http.get(f"{root_of(server)}/health").status_code == 200
        assert time.monotonic() - started < 2.0
        response, took = post(server, {"prompt": "Is ice cold? Answer yes or no:", "choices": ["yes", "no"]})
        assert response.status_code == 200 and response.json()["choices"][0]["text"] in ("yes", "no")
        assert took < ANSWER_BOUND_S
        answered.set()
        sender.join(CLIENT_TIMEOUT_S)
        for sock in sockets:
            status, raw = read_response(sock)
            assert status == 200, raw[:300]
            assert b'"text":"yes"' in raw or b'"text":"no"' in raw, raw[:300]
    finally:
        stop.set()
        for sock in sockets:
            sock.close()
    assert_healthy(server)


def read_until_chunks(sock: socket.socket, count: int) -> bytes:
    """Read the streamed answer on ``sock`` until ``count`` SSE events after the first have arrived."""
    data = b""
    while data.count(b"data: {") < count + 1:  # the first event carries the role
        chunk = sock.recv(4096)
        assert chunk, f"the stream ended early: {data[-300:]!r}"
        data += chunk
    return data


def test_clients_that_disconnect_mid_stream_have_their_rows_ended(server: str) -> None:
    """Four streaming clients go away after their second token, one right after sending its request,
    and one non-streamed client mid-answer. Each asked for 1000 tokens, so a row left running would
    still be decoding long after; all must end within a few seconds, and the server then streams a
    normal request correctly."""
    story = chat_body("Tell me a long story about a dragon.", max_tokens=1000)
    streamed = json.dumps({**story, "stream": True}).encode()
    streams = [raw_request(server, "/chat/completions", streamed) for _ in range(4)]
    for sock in streams:
        head = read_until_chunks(sock, 2)
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head[:300]
    early = raw_request(server, "/chat/completions", streamed)
    early.close()  # before any answer
    whole = raw_request(server, "/chat/completions", json.dumps(story).encode())
    deadline = time.monotonic() + REFUSAL_BOUND_S
    while active_requests(server) < 5:  # the four streams and the whole answer are decoding
        assert time.monotonic() < deadline, "the non-streamed request was not admitted"
        time.sleep(0.05)
    for sock in [*streams, whole]:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    wait_until_idle(server)
    assert_healthy(server)
    response, _ = post(server, {**chat_body("Tell me a long story about a dragon.", max_tokens=6), "stream": True})
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e.strip()]
    assert response.status_code == 200 and events[-1] == "[DONE]", response.text[-300:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) >= 1
