"""The server on the real embedded SmolLM2 behind a real uvicorn, spoken to with the official openai
client: structured answers validate, tool calls parse, streams concatenate, concurrent requests
are all answered, and errors arrive with OpenAI's status codes."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from .conftest import SERVER_EXTRA, client_for, running_server

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
openai = pytest.importorskip("openai", reason=SERVER_EXTRA)

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PASSAGE = "Extract the person as JSON: Tom Baker, 52, teaches history."
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
MAX_REQUEST_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def server(smollm2):
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    generator = Generator(smollm2)
    app = create_app(generator, max_request_bytes=MAX_REQUEST_BYTES, default_max_tokens=48)
    with running_server(app) as base_url:
        yield generator, base_url


@pytest.fixture(scope="module")
def client(server):
    return client_for(server[1], timeout=120)


def ask(client, content, **kwargs):
    return client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": content}], **kwargs)


def test_models_list(server, client):
    generator, _ = server
    models = client.models.list().data
    assert [m.id for m in models] == [generator.model_name] and models[0].object == "model"
    assert client.models.retrieve(generator.model_name).id == generator.model_name


def test_chat_json_schema(client):
    answer = ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=30)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert answer.object == "chat.completion" and answer.model == "smollm2"
    assert answer.usage.completion_tokens > 0 and answer.usage.prompt_tokens > 20
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_chat_json_object(client):
    answer = ask(client, 'Reply with the JSON object {"ok": true}.', response_format={"type": "json_object"},
                 max_tokens=24)
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


def test_completions_with_regex_extension(client):
    answer = client.completions.create(model="smollm2", prompt="The Moon landing (20 July 1969) as YYYY-MM-DD:",
                                       max_tokens=16, extra_body={"regex": r" ?\d{4}-\d{2}-\d{2}"})
    choice = answer.choices[0]
    assert answer.object == "text_completion" and choice.finish_reason == "stop"
    assert re.fullmatch(r" ?\d{4}-\d{2}-\d{2}", choice.text)


def test_tool_calls(client):
    answer = ask(client, "What is the weather in Paris?", tools=[WEATHER], tool_choice="required", max_tokens=32)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])


def test_streamed_chat(client):
    chunks = list(ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=30, stream=True,
                      stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3  # really streamed in pieces
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.completion_tokens > 0


def test_eight_concurrent_requests(client):
    def one(i: int):
        options = [f"item-{i}-yes", f"item-{i}-no"]
        if i % 4 == 0:
            answer = ask(client, f"Say yes to {i}.", max_tokens=12, extra_body={"choices": options})
            return answer.choices[0].message.content, options
        answer = client.completions.create(model="smollm2", prompt=f"Request {i}:", max_tokens=12,
                                           extra_body={"choices": options})
        return answer.choices[0].text, options

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert len(answers) == 8
    for text, options in answers:
        assert text in options


def test_invalid_schema_is_400_with_reason(client):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "minProperties": -1}}}
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "x", response_format=bad)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["code"] == "invalid_schema" and error["param"] == "response_format"
    assert "minProperties" in error["message"]


def test_oversize_body_is_413(client):
    with pytest.raises(openai.APIStatusError) as caught:
        ask(client, "x" * (MAX_REQUEST_BYTES + 1))
    assert caught.value.status_code == 413 and caught.value.body["code"] == "request_too_large"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-nonexistent", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["code"] == "model_not_found"


def test_max_tokens_too_small_is_length(client):
    answer = ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=3)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and answer.usage.completion_tokens == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)
