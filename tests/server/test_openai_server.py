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


# --- the OpenAI conventions function-calling clients rely on -------------------------------------

OPEN_PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                "age": {"type": "integer", "maximum": 150}}, "required": ["name"]}


def test_parse_into_a_pydantic_model(client):
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(le=150)

    answer = client.chat.completions.parse(model="smollm2", messages=[{"role": "user", "content": PASSAGE}],
                                           response_format=Person, max_tokens=30)
    person = answer.choices[0].message.parsed
    assert isinstance(person, Person) and person.age <= 150


def test_schema_without_additional_properties_gets_only_declared_keys(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": OPEN_PERSON}}
    answer = ask(client, PASSAGE + " Add any other details you know.", response_format=fmt, max_tokens=40)
    value = json.loads(answer.choices[0].message.content)
    assert answer.choices[0].finish_reason == "stop" and set(value) <= {"name", "age"}
    jsonschema.validate(value, OPEN_PERSON)


def test_streamed_tool_call_arrives_as_openai_deltas(client):
    chunks = list(ask(client, "What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                      max_tokens=32, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and deltas[0].content is None
    calls = [call for d in deltas for call in (d.tool_calls or [])]
    first, rest = calls[0], calls[1:]
    assert first.id and first.type == "function" and first.function.name == "get_weather"
    assert first.function.arguments == "" and len(rest) >= 2  # then fragments of the arguments
    assert all(c.index == 0 and c.id is None and c.function.name is None for c in rest if c.index == 0)
    arguments = json.loads("".join(c.function.arguments for c in calls if c.index == 0))
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert not any(d.content for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0


def test_tool_call_cut_by_max_tokens_is_a_tool_call_with_length(client):
    answer = ask(client, "What is the weather in Paris?", tools=[WEATHER], tool_choice="required", max_tokens=20)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert '"name"' not in call.function.arguments  # the partial arguments, not the internal call JSON
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)


def test_named_tool_choice_finishes_with_stop(client):
    answer = ask(client, "Weather in Oslo?", tools=[WEATHER], max_tokens=32,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls[0].function.name == "get_weather"


def test_response_format_beside_tools_gives_a_call_or_the_format(client):
    for content in ("What is the weather in Paris?", PASSAGE):
        answer = ask(client, content, tools=[WEATHER], response_format=PERSON_FORMAT, max_tokens=40)
        message = answer.choices[0].message
        if message.tool_calls:
            assert answer.choices[0].finish_reason == "tool_calls"
            jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])
        else:
            assert answer.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(message.content), PERSON)


def test_stop_ends_free_text_but_not_inside_a_constrained_value(client):
    answer = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=16, stop=["7"])
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and "7" not in choice.text and "6" in choice.text
    answer = ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=30, stop=[","])
    choice = answer.choices[0]  # "," between the keys cannot end the JSON: the answer runs to its end
    assert choice.finish_reason == "stop" and "," in choice.message.content
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_n_choices_are_rows_of_one_batch(client):
    answer = ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=30, n=3, temperature=1.0, seed=7)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    for choice in answer.choices:
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert answer.usage.completion_tokens > 3


def test_logprobs_are_of_the_masked_distribution(client):
    answer = ask(client, "Is the sky blue?", max_tokens=4, logprobs=True, top_logprobs=6,
                 extra_body={"choices": ["yes", "no"]})
    content = answer.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == answer.choices[0].message.content
    first = content[0]
    assert first.logprob <= 0 and {alt.token for alt in first.top_logprobs} <= {"yes", "no", "y", "n", "ye"}
    assert 0.99 <= sum(2.718281828 ** alt.logprob for alt in first.top_logprobs) <= 1.0001
    assert all(entry.logprob == 0 for entry in content[1:])  # forced by the choice: probability 1


def test_metrics_count_what_was_served(server):
    import httpx

    root = server[1].removesuffix("/v1")
    text = httpx.get(f"{root}/metrics").text
    assert 'cdsl_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert "cdsl_batch_rows" in text and "cdsl_draft_accepted_tokens_total" in text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(values["cdsl_engine_steps"]) >= 1  # requests were answered by the engine's forwards
    assert float(values["cdsl_engine_forward_seconds"]) >= float(values["cdsl_engine_prefill_seconds"]) >= 0
    assert float(values["cdsl_engine_prefill_positions"]) > 0  # prompts were computed, inside the steps or apart
    assert float(values["cdsl_engine_compiled"]) == 0 and float(values["cdsl_engine_compiled_steps"]) == 0  # eager
    assert float(values["cdsl_engine_ahead_steps"]) == 0  # a CPU runs each step as it is launched


def test_a_huge_seed_beside_ordinary_requests_fails_no_one(client):
    """A seed beyond 64 bits once ended every running row with a 400; now each request stands alone."""
    with ThreadPoolExecutor(3) as pool:
        ordinary = [pool.submit(ask, client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=30) for _ in range(2)]
        seeded = pool.submit(ask, client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=30, seed=2**70,
                             temperature=0.7)
        answers = [future.result() for future in (*ordinary, seeded)]
    for answer in answers:
        if answer.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)
    assert all(a.choices[0].finish_reason in ("stop", "length") for a in answers)


@pytest.mark.parametrize("extra", [{"regex": "(" * 400 + "a" + ")" * 400},
                                   {"grammar": "start: " + "(" * 400 + '"a"' + ")" * 400}])
def test_deeply_nested_regex_or_grammar_is_a_400_not_a_500(client, extra):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "x", max_tokens=4, extra_body=extra)
    error = caught.value.body
    assert error["code"] == "unsupported_feature" and "nests 400 levels" in error["message"]
    assert ask(client, "Say hi.", max_tokens=2).choices[0].finish_reason in ("stop", "length")  # still serving


def test_a_json_answer_over_its_budget_is_closed_valid_and_says_so(client):
    """Issue 40: ``max_tokens`` short of the answer: by default a valid, closed answer with our
    ``closed_by_budget`` field; ``on_budget: "cut"`` cuts it as before; a bad value is a 400."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "bio": {"type": "string"},
                                               "age": {"type": "integer"}}, "required": ["name", "bio", "age"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    prompt = "Tom Baker, 52, teaches history. Give him as JSON with a long bio."
    closed = ask(client, prompt, response_format=fmt, max_tokens=24)
    choice = closed.choices[0]
    assert choice.finish_reason == "length" and choice.model_extra.get("closed_by_budget") is True
    jsonschema.validate(json.loads(choice.message.content), schema)
    assert closed.usage.completion_tokens <= 24
    cut = ask(client, prompt, response_format=fmt, max_tokens=24, extra_body={"on_budget": "cut"}).choices[0]
    assert cut.finish_reason == "length" and "closed_by_budget" not in (cut.model_extra or {})
    with pytest.raises(openai.BadRequestError, match="on_budget"):
        ask(client, prompt, response_format=fmt, max_tokens=24, extra_body={"on_budget": "later"})


def test_reasoning_comes_back_as_reasoning_content(client):
    think = {"reasoning": {"budget": 8, "required": True}}
    answer = ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=80, temperature=0, extra_body=think)
    message = answer.choices[0].message
    jsonschema.validate(json.loads(message.content), PERSON)
    assert message.model_extra["reasoning_content"] and "<think>" not in message.content
    chunks = list(ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=80, temperature=0,
                      extra_body=think, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert thought == message.model_extra["reasoning_content"] and content == message.content


def test_a_bad_reasoning_extension_is_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "hi", extra_body={"reasoning": {"budget": -2}})
    assert caught.value.body["param"] == "reasoning"


def test_partial_values_ride_in_the_chunks_and_never_contradict_the_answer(client):
    from cdsl_struct.partial import consistent_with

    chunks = list(ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=48, temperature=0, stream=True,
                      stream_options={"partial_values": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    final = json.loads("".join(d.content or "" for d in deltas))
    partials = [d.model_extra["partial_value"] for d in deltas if d.model_extra and "partial_value" in d.model_extra]
    assert len(partials) >= 3 and partials[-1] in (final, partials[-1])
    assert all(consistent_with(p, final) for p in partials)
    assert any(isinstance(p, dict) and "age" not in p for p in partials)  # the value grows as it is written
    plain = list(ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=48, temperature=0, stream=True))
    assert not any("partial_value" in (c.choices[0].delta.model_extra or {}) for c in plain if c.choices)


def test_partial_arguments_of_a_streamed_call(client):
    from cdsl_struct.partial import consistent_with

    chunks = list(ask(client, "What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                      max_tokens=32, stream=True, stream_options={"partial_values": True}))
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
    final = json.loads("".join(c.function.arguments for c in calls))
    partials = [c.model_extra["partial_arguments"] for c in calls if c.model_extra and "partial_arguments" in
                c.model_extra]
    assert partials and partials[-1] == final and all(consistent_with(p, final) for p in partials)


def test_a_stream_closed_by_budget_says_so_in_its_last_chunk(client):
    def streamed(max_tokens):
        chunks = list(ask(client, PASSAGE, response_format=PERSON_FORMAT, max_tokens=max_tokens, temperature=0,
                          stream=True, extra_body={"on_budget": "close"}))
        choices = [c.choices[0] for c in chunks if c.choices]
        return choices[-1], "".join(c.delta.content or "" for c in choices)

    last, content = streamed(16)  # a valid ending fits: closed (SmolLM2 writes ~20 tokens here)
    assert last.model_extra.get("closed_by_budget") is True and last.finish_reason == "length"
    jsonschema.validate(json.loads(content), PERSON)
    last, content = streamed(6)  # none fits in 6 tokens: cut, as without closing
    assert not last.model_extra.get("closed_by_budget") and last.finish_reason == "length"
