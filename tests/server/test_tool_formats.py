"""The server writing tool calls in a family's own format (``serve --tool-format``): streamed as OpenAI
deltas with no markup in the content, and whole, parsed into the declared calls."""

from __future__ import annotations

import json

import jsonschema
import pytest

from .conftest import SERVER_EXTRA, client_for, running_server

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
pytest.importorskip("openai", reason=SERVER_EXTRA)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]


@pytest.fixture(scope="module", params=["hermes", "mistral"])
def client(request, smollm2):
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    generator = Generator(smollm2, tool_format=request.param)
    with running_server(create_app(generator, default_max_tokens=60)) as base_url:
        yield client_for(base_url, timeout=120)
    generator.close()


def test_streamed_calls_in_the_format_arrive_as_deltas(client):
    chunks = list(client.chat.completions.create(model="smollm2", messages=QUESTION, tools=[WEATHER],
                                                 tool_choice="required", stream=True, max_tokens=120))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for d in deltas for call in (d.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather" and calls[0].id
    assert not any(d.content for d in deltas)  # no marker, separator or close leaks into the content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    for index in sorted({c.index for c in calls}):
        arguments = json.loads("".join(c.function.arguments or "" for c in calls if c.index == index))
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])


def test_whole_answer_parses_into_declared_calls(client):
    answer = client.chat.completions.create(model="smollm2", messages=QUESTION, tools=[WEATHER],
                                            tool_choice="required", max_tokens=120)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    for call in choice.message.tool_calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_request_may_ask_for_another_format(client):
    """Our ``tool_format`` extension: this request's calls in mistral's format whatever the server's,
    streamed and whole alike; an unknown name is a 400 naming the field."""
    import openai

    asked = dict(model="smollm2", messages=QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=120,
                 extra_body={"tool_format": "mistral"})
    choice = client.chat.completions.create(**asked).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert all(call.function.name == "get_weather" for call in choice.message.tool_calls)
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**asked, stream=True) if c.choices]
    streamed = [call for d in deltas for call in (d.tool_calls or [])]
    assert streamed and not any(d.content for d in deltas)  # no [TOOL_CALLS] leaks into the content
    with pytest.raises(openai.BadRequestError, match="tool_format"):
        client.chat.completions.create(**{**asked, "extra_body": {"tool_format": "klingon"}})
