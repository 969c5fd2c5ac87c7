"""Server mechanics with a scripted stand-in Generator (no model): the request translation, the
error mapping, stream framing, and the queue limit, each deterministic and fast."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from cdsl_struct.errors import CompileTimeout, GrammarSyntaxError, InvalidSchema, RollbackError, UnsupportedFeature
from cdsl_struct.keywords import Keywords
from cdsl_struct.params import GenerationParams
from cdsl_struct.result import Result
from cdsl_struct.tools import ToolCall

from .conftest import SERVER_EXTRA, client_for, running_server

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
openai = pytest.importorskip("openai", reason=SERVER_EXTRA)
httpx = pytest.importorskip("httpx2", reason=SERVER_EXTRA)


class FakeTokenizer:
    """One token per word; no chat template (messages are laid out as ``role: content`` lines)."""

    chat_template = None

    def __call__(self, text):
        return {"input_ids": list(range(len(text.split())))}


class FakeStream:
    """``TextStream``'s surface over the fake's items (str pieces, then the Result)."""

    def __init__(self, items):
        self.items = iter(items)
        self.result = None

    def __iter__(self):
        for item in self.items:
            if isinstance(item, str):
                yield item
            else:
                self.result = item

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        close = getattr(self.items, "close", None)
        if close is not None:
            close()


@dataclass
class FakeGenerator:
    """Answers from the prompt text: ``block`` waits for ``release``; ``timeout``, ``dead`` and
    ``bad grammar`` raise or end as named; otherwise it echoes what it was asked as JSON."""

    model_name: str = "fake-model"
    tokenizer: Any = field(default_factory=FakeTokenizer)
    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    calls: list = field(default_factory=list)

    def generate(self, prompt, *, params=None, stream=False, chat=True, cancel=None, **kwargs):
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)):
            return [self.generate(one, params=params, chat=chat, cancel=cancel, **kwargs) for one in prompt]
        assert isinstance(params, GenerationParams)
        default = GenerationParams().to_dict()
        kwargs = {**{k: v for k, v in params.to_dict().items() if k == "max_tokens" or v != default[k]}, **kwargs}
        self.calls.append((prompt, kwargs))
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        if text == "block":
            self.started.set()
            assert self.release.wait(10)
        if text in ("slow", "slow after text"):  # runs until cancelled
            return self._slow(text, cancel, stream)
        if text == "timeout":
            raise CompileTimeout("compiling took more than 0.01 s")
        if text == "internal":
            raise RollbackError("cannot roll back 3 tokens: 2 advanced")
        if kwargs.get("grammar") == "start: (":
            raise GrammarSyntaxError("unexpected end of grammar at line 1 column 9", line=1, column=9)
        if kwargs.get("regex") == "(?<=a)b":
            raise UnsupportedFeature("lookbehind is not supported", feature="lookbehind")
        if kwargs.get("schema") == {"type": "nonsense"}:
            raise InvalidSchema("'nonsense' is not valid under any of the given schemas")
        if params.temperature > 1.5:
            raise ValueError("temperature too high for this fake")
        if text == "dead":
            result = Result(text="{", tokens=[1], finish_reason="constraint_dead_end", complete=False)
        elif kwargs.get("tools") and kwargs.get("tool_choice") != "none":
            calls = [ToolCall("f", {"x": 1}, "call_a"), ToolCall("g", {}, "call_b")]
            raw = "".join(f'<tool_call>{{"name":"{c.name}","arguments":{json.dumps(c.arguments)}}}' for c in calls)
            result = Result(text=raw, tokens=[1, 2, 3], finish_reason="stop", complete=True, tool_calls=calls,
                            content=None)
        else:
            asked = {k: v for k, v in kwargs.items() if k not in ("tools", "compile_timeout")}
            body = json.dumps({"prompt": text, **asked})
            report = Keywords.of(kwargs["keywords"]).report(text) if "keywords" in kwargs else None
            result = Result(text=body, tokens=list(range(5)), finish_reason="stop", complete=True, value=None,
                            keywords=report)
        result = replace(result, prompt_tokens=len(text.split()) + 2)
        if not stream:
            return result
        pieces = [result.text[i:i + 4] for i in range(0, len(result.text), 4)]
        return iter([*pieces[:-1], result])  # the last piece left out: the server sends the rest

    def generate_batch(self, prompts, **kwargs):
        return [self.generate(one, **kwargs) for one in prompts]

    def stream(self, prompt, **kwargs):
        return FakeStream(self.generate(prompt, stream=True, **kwargs))

    def _slow(self, text, cancel, stream):
        """Text ``"ab"`` first (``slow after text``), then nothing until ``cancel``; a cancelled Result."""
        said = "ab" if text == "slow after text" else ""

        def wait():
            self.started.set()
            self.cancelled = cancel.wait(10)
            return Result(text=said, tokens=[1] * len(said), finish_reason="cancelled", complete=False)

        if not stream:
            return wait()

        def items():
            if said:
                yield said
            yield wait()

        return items()


@pytest.fixture(scope="module")
def fake():
    from cdsl_struct.server import create_app
    from cdsl_struct.server.protocol import ServerLimits

    generator = FakeGenerator()
    app = create_app(generator, max_request_bytes=100_000, queue_limit=1, default_max_tokens=17,
                     limits=ServerLimits(max_schema_depth=8), request_timeout=3.0)
    with running_server(app) as base_url:
        yield generator, base_url


def chat(client, content, **kwargs):
    return client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": content}],
                                          **kwargs)


def test_keyword_requests_pass_their_options_and_each_choice_reports_the_words(fake):
    generator, base_url = fake
    client = client_for(base_url)
    asked = {"words": ["hi", "zebra"], "form": "text", "name": False, "hold_ending": False}
    answer = chat(client, "hi", extra_body={"keywords": asked})
    assert json.loads(answer.choices[0].message.content)["keywords"] == asked
    assert answer.choices[0].model_extra["keywords"] == {"covered": ["hi"], "missing": ["zebra"]}  # of the prompt
    with client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                        stream=True, extra_body={"keywords": ["zebra"]}) as stream:
        last = [chunk for chunk in stream][-1]
    assert last.choices[0].finish_reason == "stop"
    assert last.choices[0].model_extra["keywords"] == {"covered": [], "missing": ["zebra"]}
    plain = chat(client, "hi")
    assert "keywords" not in plain.choices[0].model_extra


def test_request_translation(fake):
    generator, base_url = fake
    client = client_for(base_url)
    answer = chat(client, "hi", response_format={"type": "json_object"}, temperature=0.5, top_p=0.9, seed=3,
                  extra_body={"keywords": ["a", "b"], "method": "target"})
    sent = json.loads(answer.choices[0].message.content)
    assert sent == {"prompt": "hi", "schema": {"type": "object"}, "max_tokens": 17, "temperature": 0.5,
                    "top_p": 0.9, "seed": 3, "method": "target", "keywords": ["a", "b"]}
    assert answer.usage.prompt_tokens == 3 and answer.usage.completion_tokens == 5
    answer = chat(client, "z", stop=["\n", "END"], presence_penalty=0.5, frequency_penalty=-0.5, logprobs=True,
                  top_logprobs=3)
    sent = json.loads(answer.choices[0].message.content)
    assert (sent["stop"], sent["presence_penalty"], sent["frequency_penalty"], sent["logprobs"]) == \
        (["\n", "END"], 0.5, -0.5, 3)
    answer = chat(client, "n", n=3, seed=5)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(json.loads(c.message.content)["prompt"] == "n" for c in answer.choices)
    assert answer.usage.prompt_tokens == 3 and answer.usage.completion_tokens == 15
    answer = chat(client, "x", max_completion_tokens=9,
                  response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "string"}}})
    assert json.loads(answer.choices[0].message.content)["schema"] == {"type": "string"}
    assert json.loads(answer.choices[0].message.content)["max_tokens"] == 9
    generator.calls.clear()
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                                      {"role": "user", "content": "y"}])
    assert generator.calls[-1][0][0] == {"role": "developer", "content": [{"type": "text", "text": "be brief"}]}


def test_completions_batch_and_choices(fake):
    _, base_url = fake
    client = client_for(base_url)
    answer = client.completions.create(model="fake-model", prompt=["one", "two"], extra_body={"choices": ["a", "b"]})
    assert [json.loads(c.text)["prompt"] for c in answer.choices] == ["one", "two"]
    assert [c.index for c in answer.choices] == [0, 1]
    assert json.loads(answer.choices[0].text)["choices"] == ["a", "b"]


def test_tool_calls_shape(fake):
    generator, base_url = fake
    client = client_for(base_url)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    answer = chat(client, "call", tools=tools, tool_choice={"type": "function", "function": {"name": "f"}},
                  parallel_tool_calls=True)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None  # named tool_choice: as OpenAI
    assert generator.calls[-1][1]["parallel_tool_calls"] is True
    chat(client, "call", tools=tools)
    assert generator.calls[-1][1]["parallel_tool_calls"] is True  # OpenAI's default
    answer = chat(client, "call", tools=tools, tool_choice="required")
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.id, c.type, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("call_a", "function", "f", {"x": 1}), ("call_b", "function", "g", {})]
    chunks = list(chat(client, "call", tools=tools, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant" and deltas[0].content is None
    calls = [call for d in deltas for call in (d.tool_calls or [])]
    firsts = [c for c in calls if c.function.name]
    assert [(c.index, c.function.name, c.function.arguments) for c in firsts] == [(0, "f", ""), (1, "g", "")]
    assert all(c.id and c.type == "function" for c in firsts)
    assert len(calls) > len(firsts)  # the arguments come in further deltas, as fragments
    for index, expected in ((0, {"x": 1}), (1, {})):
        assert json.loads("".join(c.function.arguments for c in calls if c.index == index)) == expected
    assert not any(d.content for d in deltas)  # no call markup leaks into content
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_stream_framing(fake):
    _, base_url = fake
    with httpx.Client() as http:
        response = http.post(f"{base_url}/chat/completions", json={
            "messages": [{"role": "user", "content": "stream me"}], "stream": True,
            "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert json.loads(text)["prompt"] == "stream me"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    client = client_for(base_url)
    pieces = list(client.completions.create(model="fake-model", prompt="go", stream=True))
    assert json.loads("".join(p.choices[0].text for p in pieces))["prompt"] == "go"
    assert pieces[-1].choices[0].finish_reason == "stop"


DEEP: dict = {}
for _ in range(9):
    DEEP = {"items": DEEP}


@pytest.mark.parametrize(("kwargs", "code", "param", "words"), [
    ({"extra_body": {"grammar": "start: ("}}, "grammar_syntax_error", "grammar", "line 1 column 9"),
    ({"extra_body": {"regex": "(?<=a)b"}}, "unsupported_feature", "regex", "lookbehind"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "invalid_schema", "response_format", "nonsense"),
    ({"temperature": 1.9}, "invalid_value", None, "temperature too high"),
    ({"n": 9}, "invalid_value", "n", "n=9"),
    ({"n": 2, "stream": True}, "unsupported_parameter", "n", "cannot be streamed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_value", "stop", "at most 4 stop strings"),
    ({"max_tokens": 5000}, "invalid_value", "max_tokens", "limit of 4096"),
    ({"extra_body": {"regex": "a" * 70_000}}, "constraint_too_large", "regex", "at most"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP}}},
     "constraint_too_deep", "response_format", "deeper"),
    ({"extra_body": {"regex": "a", "choices": ["a"]}}, "conflicting_constraints", "choices", "at most one"),
    ({"stop": ["x" * 10_000]}, "invalid_value", "stop", "at most 256 characters"),
    ({"stream": True, "logprobs": True}, "unsupported_parameter", "logprobs", "cannot be streamed"),
])
def test_bad_requests_are_400(fake, kwargs, code, param, words):
    client = client_for(fake[1])
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, "x", **kwargs)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["code"] == code and error["param"] == param
    assert words in error["message"] and error["type"] == "invalid_request_error"


def test_a_fault_of_the_server_is_a_500_with_a_request_id_in_the_log(fake, caplog):
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client_for(fake[1]), "internal")
    error = caught.value.body
    request_id = caught.value.response.headers["x-request-id"]
    assert error["code"] == "internal_error" and error["type"] == "server_error"
    assert request_id in error["message"] and "RollbackError" in error["message"]
    assert any(request_id in record.getMessage() and record.exc_info for record in caplog.records)


def test_a_huge_prompt_list_is_refused_at_once_not_queued(fake):
    client = client_for(fake[1])
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="fake-model", prompt=[f"p{i}" for i in range(10_000)], max_tokens=2)
    assert caught.value.body["param"] == "prompt" and "10000 prompts" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="fake-model", prompt=["a"] * 3, n=6, max_tokens=2)  # 18 rows
    assert time.monotonic() - started < 10
    assert len(client.completions.create(model="fake-model", prompt=["a"] * 4, n=4, max_tokens=2).choices) == 16


def test_reading_a_client_grammar_does_not_stall_the_event_loop(fake, monkeypatch):
    import cdsl_struct.constraints.specs as specs

    checking = threading.Event()

    def slow_check(text, origin="<grammar text>"):
        checking.set()
        time.sleep(2.0)  # a large grammar being read by lark, found wrong in the end
        raise GrammarSyntaxError("syntax error at line 1 column 1", line=1, column=1)

    monkeypatch.setattr(specs, "check_lark_grammar", slow_check)
    root = fake[1].removesuffix("/v1")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(chat, client_for(fake[1]), "x", extra_body={"grammar": 'start: "a"'})
        assert checking.wait(10)
        started = time.monotonic()
        assert httpx.get(f"{root}/health").status_code == 200
        assert time.monotonic() - started < 1.0  # answered while the grammar is still being read
        with pytest.raises(openai.BadRequestError):
            pending.result()


def test_a_body_that_does_not_fit_the_request_schema_is_422(fake):
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        chat(client_for(fake[1]), "x", temperature=3)
    error = caught.value.body
    assert (error["code"], error["param"]) == ("invalid_request", "temperature")
    assert "less than or equal to 2" in error["message"]


def test_compile_timeout_is_400(fake):
    with pytest.raises(openai.BadRequestError, match="compile timeout") as caught:
        chat(client_for(fake[1]), "timeout", response_format={"type": "json_object"})
    assert caught.value.body["code"] == "compile_timeout" and caught.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="compile timeout"):  # before the stream starts
        list(chat(client_for(fake[1]), "timeout", stream=True))


def test_dead_end_is_reported(fake):
    answer = chat(client_for(fake[1]), "dead")
    assert answer.choices[0].finish_reason == "constraint_dead_end"


def test_http_level_errors(fake):
    _, base_url = fake
    with httpx.Client() as http:
        cases = {
            "malformed json": http.post(f"{base_url}/chat/completions", content=b'{"messages": [',
                                        headers={"content-type": "application/json"}),
            "missing field": http.post(f"{base_url}/chat/completions", json={"model": "fake-model"}),
            "oversize": http.post(f"{base_url}/completions", json={"prompt": "x" * 110_000}),
            "unknown model": http.post(f"{base_url}/completions", json={"prompt": "x", "model": "gpt-9"}),
            "unknown route": http.get(f"{base_url}/nowhere"),
            "model card 404": http.get(f"{base_url}/models/gpt-9"),
        }
    expected = {"malformed json": (422, "invalid_json"), "missing field": (422, "invalid_request"),
                "oversize": (413, "request_too_large"), "unknown model": (404, "model_not_found"),
                "unknown route": (404, "not_found"), "model card 404": (404, "model_not_found")}
    for name, response in cases.items():
        error = response.json()["error"]
        assert (response.status_code, error["code"]) == expected[name], name
        assert set(error) == {"message", "type", "param", "code"} and error["message"], name
    assert "messages" in cases["missing field"].json()["error"]["message"]


def test_queue_limit_is_429_and_nothing_is_lost(fake):
    generator, base_url = fake
    client = client_for(base_url)
    generator.release.clear()
    generator.started.clear()
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(chat, client, "block")
        assert generator.started.wait(10)
        waiting = pool.submit(chat, client, "queued")  # queue_limit=1: one may wait
        with httpx.Client() as http:  # wait until the second request is admitted and waiting
            deadline = time.monotonic() + 10
            while http.get(base_url.removesuffix("/v1") + "/health").json()["active_requests"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        with pytest.raises(openai.RateLimitError) as caught:
            chat(client, "refused")
        assert caught.value.status_code == 429 and caught.value.body["code"] == "queue_full"
        assert caught.value.response.headers["retry-after"] == "1"
        generator.release.set()
        assert json.loads(running.result(10).choices[0].message.content)["prompt"] == "block"
        assert json.loads(waiting.result(10).choices[0].message.content)["prompt"] == "queued"


def test_deadline_cancels_the_rows_and_answers_504(fake):
    generator, base_url = fake
    generator.started.clear()
    with pytest.raises(openai.APIStatusError) as caught:
        chat(client_for(base_url), "slow")
    assert caught.value.status_code == 504 and caught.value.body["code"] == "deadline_exceeded"
    assert generator.cancelled  # the cancel event reached the generation


def test_client_that_goes_away_has_its_rows_cancelled(fake):
    generator, base_url = fake
    generator.started.clear()
    generator.cancelled = None
    with httpx.Client(timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post(f"{base_url}/chat/completions", json={"messages": [{"role": "user", "content": "slow"}]})
    wait_cancelled(generator, 2.5, "the row was not cancelled when its client went away")  # within the 3 s deadline


def post_stream(base_url: str, content: str, timeout: float = 10) -> Any:
    """A raw streamed chat request (its whole body read)."""
    with httpx.Client(timeout=timeout) as http:
        return http.post(f"{base_url}/chat/completions",
                         json={"messages": [{"role": "user", "content": content}], "stream": True})


def wait_cancelled(generator: FakeGenerator, within: float, why: str) -> None:
    deadline = time.monotonic() + within
    while generator.cancelled is None:
        assert time.monotonic() < deadline, why
        time.sleep(0.02)
    assert generator.cancelled


def test_a_stream_past_its_deadline_before_any_text_is_504(fake):
    generator, base_url = fake
    generator.cancelled = None
    response = post_stream(base_url, "slow")
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    assert generator.cancelled


def test_a_stream_past_its_deadline_mid_text_ends_with_an_error_event(fake):
    generator, base_url = fake
    generator.cancelled = None
    response = post_stream(base_url, "slow after text")
    assert response.status_code == 200
    events = [line[len("data: "):] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "deadline_exceeded"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-2])
    assert text == "ab" and generator.cancelled


def test_a_stream_whose_client_leaves_before_any_text_is_cancelled(fake):
    generator, base_url = fake
    generator.cancelled = None
    with pytest.raises(httpx.ReadTimeout):
        post_stream(base_url, "slow", timeout=0.5)
    # before the 3 s request deadline: the disconnect did it
    wait_cancelled(generator, 2.0, "the stream's row was not cancelled when its client went away")


def test_reading_a_client_grammar_stops_at_the_compile_timeout(monkeypatch):
    import cdsl_struct.constraints.specs as specs
    from cdsl_struct.server import create_app

    def slow_check(text, origin="<grammar text>"):
        time.sleep(3.0)

    monkeypatch.setattr(specs, "check_lark_grammar", slow_check)
    generator = FakeGenerator()
    with running_server(create_app(generator, compile_timeout=0.5)) as base_url:
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError) as caught:
            chat(client_for(base_url), "x", extra_body={"grammar": 'start: "slow-read"'})
        assert caught.value.body["code"] == "compile_timeout"
        assert time.monotonic() - started < 2.5
        assert not hasattr(generator, "compile_timeout")  # the server's setting, not written into the generator


def test_generation_gets_the_servers_compile_timeout(fake):
    generator, base_url = fake
    chat(client_for(base_url), "hello")
    assert generator.calls[-1][1]["compile_timeout"] is None  # none configured: the Generator's own applies


def test_grammar_from_a_client_is_text_never_a_file(fake, tmp_path):
    secret = tmp_path / "secret.lark"
    secret.write_text('start: "top secret"\n')
    for named in (str(secret), f"../../{secret.name}"):  # read as Lark text: not a grammar, so a 400
        with pytest.raises(openai.BadRequestError) as caught:
            chat(client_for(fake[1]), "x", extra_body={"grammar": named})
        assert caught.value.body["code"] == "grammar_syntax_error" and "top secret" not in caught.value.message


def test_metrics_and_api_key():
    from cdsl_struct.server import create_app

    app = create_app(FakeGenerator(), api_key="s3cret")
    with running_server(app) as base_url, httpx.Client() as http:
        with pytest.raises(openai.AuthenticationError):
            chat(client_for(base_url), "x")
        answer = chat(openai.OpenAI(base_url=base_url, api_key="s3cret", max_retries=0), "counted")
        assert json.loads(answer.choices[0].message.content)["prompt"] == "counted"
        root = base_url.removesuffix("/v1")
        metrics = http.get(f"{root}/metrics").text  # open without the key, like /health
    assert 'cdsl_requests_total{route="/v1/chat/completions",status="401"} 1.0' in metrics
    assert 'cdsl_requests_total{route="/v1/chat/completions",status="200"} 1.0' in metrics
    assert "cdsl_completion_tokens_total 5.0" in metrics and "cdsl_time_to_first_token_seconds_count 1.0" in metrics


def test_shutdown_cancels_what_outlives_the_grace_period():
    from cdsl_struct.server import create_app

    generator = FakeGenerator()
    generator.cancelled = None
    with ThreadPoolExecutor(1) as pool:
        with running_server(create_app(generator), timeout_graceful_shutdown=1) as base_url:
            pending = pool.submit(chat, client_for(base_url, timeout=30), "slow")
            assert generator.started.wait(10)
        started = time.monotonic()  # the server has stopped: within the grace period plus a step
        while generator.cancelled is None:
            assert time.monotonic() - started < 5, "shutdown did not cancel the running request"
            time.sleep(0.02)
        assert generator.cancelled
        with pytest.raises(Exception):  # noqa: B017 - the client sees its connection end, whichever way
            pending.result(30)


def _raw_post(base_url: str, declared: int, sent: bytes) -> socket.socket:
    port = int(base_url.rsplit(":", 1)[1].split("/", 1)[0])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {declared}\r\n\r\n".encode() + sent)
    return sock


def test_a_client_stalled_mid_body_gets_408_at_the_deadline(fake):
    sock = _raw_post(fake[1], 100, b'{"prompt": "')
    answer = b""
    try:  # the fake server's deadline is 3 s; the socket waits up to 10; head and body may come apart
        while chunk := sock.recv(4096):
            answer += chunk
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer


def test_a_body_declared_over_the_limit_is_answered_without_waiting_for_it(fake):
    sock = _raw_post(fake[1], 10_000_000, b"{")
    started = time.monotonic()
    try:
        answer = sock.recv(4096)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 5.0


def test_a_body_that_is_not_utf8_is_invalid_json(fake):
    with httpx.Client(timeout=10) as http:
        response = http.post(f"{fake[1]}/chat/completions", content=b"\xff\xfe{",
                             headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_json"
