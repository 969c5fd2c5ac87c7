"""Function calling: tool definitions, tool_choice, the call constraint, parsing and validation,
and real calls by the embedded SmolLM2 for every tool_choice."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel

import cdsl_struct as cs
from cdsl_struct.api import Generator
from cdsl_struct.result import Result
from cdsl_struct.tools import (
    CALL_MARKER,
    CallStream,
    InvalidToolCall,
    ToolCall,
    ToolCallsGrammar,
    normalise_tools,
    parse_tool_output,
    tool_from_function,
    tool_request,
)


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name,
            for example Paris.
        unit (str): Temperature unit.

    Returns:
        A short report.
    """
    return f"sunny in {city}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


WEATHER = tool_from_function(get_weather)
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}


def call_of(city: str) -> dict:
    """An earlier get_weather call in OpenAI's message format."""
    return {"id": f"call_{city}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def previous_call(city: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [call_of(city)]}


# A conversation in which the assistant already answered a weather question with a call.
FEW_SHOT = [{"role": "user", "content": "What is the weather in Rome?"}, previous_call("Rome"),
            {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gen(smollm2, one_torch_thread):
    return Generator(smollm2)


# --- definitions -------------------------------------------------------------------------------


def test_tool_from_function():
    function = WEATHER["function"]
    assert WEATHER["type"] == "function" and function["name"] == "get_weather"
    assert function["description"] == "Get the current weather in a city."
    parameters = function["parameters"]
    assert parameters["required"] == ["city"] and parameters["additionalProperties"] is False
    assert parameters["properties"]["city"] == {"type": "string", "description": "The city's name, for example Paris."}
    assert parameters["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert parameters["properties"]["unit"]["default"] == "celsius"
    jsonschema.Draft202012Validator.check_schema(parameters)
    assert tool_from_function(add)["function"]["parameters"]["required"] == ["a", "b"]


def test_tool_from_function_refuses_what_it_cannot_describe():
    def untyped(x):
        """No hints."""

    def star(*values: int):
        """Varargs."""

    with pytest.raises(ValueError, match="no type hint"):
        tool_from_function(untyped)
    with pytest.raises(ValueError, match="args"):
        tool_from_function(star)


def test_normalise_tools_accepts_dicts_flat_dicts_and_functions():
    flat = {"name": "ping", "description": "Ping."}
    tools = normalise_tools([ADD, get_weather, flat])
    assert [t["function"]["name"] for t in tools] == ["add", "get_weather", "ping"]
    assert tools[2]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert all(t["type"] == "function" for t in tools)


@pytest.mark.parametrize(("tools", "error", "match"), [
    ("get_weather", ValueError, "list"),
    ([42], ValueError, "dict or a function"),
    ([{"type": "retrieval", "function": {"name": "x"}}], ValueError, "type 'function'"),
    ([{"function": {"name": "bad name!"}}], ValueError, "tool name"),
    ([{"description": "no name"}], ValueError, "'function'"),
    ([ADD, ADD], ValueError, "unique"),
    ([{"name": "f", "parameters": {"type": "array"}}], ValueError, "type 'object'"),
    ([{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "thing"}}}}], cs.InvalidSchema, ""),
])
def test_normalise_tools_rejects_bad_input(tools, error, match):
    with pytest.raises(error, match=match or None):
        normalise_tools(tools)


def test_tool_call_ids_and_openai_shape():
    call = ToolCall("add", {"a": 1, "b": 2})
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and call.id != ToolCall("add", {}).id
    assert call.to_openai() == {"id": call.id, "type": "function",
                                "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


# --- tool_choice and the constraint ------------------------------------------------------------


def test_tool_choice_resolution():
    assert tool_request(None) is None and tool_request([ADD], "none") is None
    auto = tool_request([ADD, WEATHER])
    assert (auto.mode, auto.allowed, auto.parallel, auto.named) == ("auto", ("add", "get_weather"), True, False)
    assert tool_request([ADD, WEATHER], "required", False).mode == "call"
    named = tool_request([ADD, WEATHER], {"type": "function", "function": {"name": "get_weather"}}, False)
    assert (named.mode, named.allowed, named.parallel, named.named) == ("call", ("get_weather",), False, True)
    assert tool_request([ADD, WEATHER], "add").allowed == ("add",)
    with pytest.raises(ValueError, match="not among"):
        tool_request([ADD], "get_weather")
    with pytest.raises(ValueError, match="needs tools"):
        tool_request([], "required")
    with pytest.raises(ValueError, match="tool_choice"):
        tool_request([ADD], {"type": "function"})


def test_call_schema_accepts_exactly_valid_calls():
    single = tool_request([ADD, WEATHER], "required").call_schema
    jsonschema.validate({"name": "add", "arguments": {"a": 1, "b": 2}}, single)
    for bad in ({"name": "add", "arguments": {"a": 1}}, {"name": "mul", "arguments": {}},
                {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}},
                {"name": "add", "arguments": {"a": 1, "b": 2}, "extra": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, single)


class Item(BaseModel):
    sku: str
    qty: int


def order(items: list[Item]) -> None:
    """Place an order."""


def test_nested_definitions_keep_resolving_inside_the_call_schema(gen):
    assert "$defs" in tool_from_function(order)["function"]["parameters"]
    schema = tool_request([order, add], "required").call_schema
    jsonschema.validate({"name": "order", "arguments": {"items": [{"sku": "a", "qty": 1}]}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "order", "arguments": {"items": [{"sku": "a"}]}}, schema)
    assert cs.compile(cs.JsonSchema(schema), gen.vocabulary).backend == "llguidance"


def _accepts(compiled, gen, text: str) -> bool:
    """Whether ``text`` (then EOS) is a complete output of ``compiled``."""
    tokens = gen.tokenizer.encode(text, add_special_tokens=False) + [gen.vocabulary.eos_token_ids[0]]
    return compiled.new_state().validate(tokens) == len(tokens)


CALL = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}'
WEATHER_CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}'


@pytest.mark.parametrize(("choice", "parallel", "answer", "accepted", "refused"), [
    ("auto", True, None, ["Hello", "", "Sure. " + CALL, CALL + WEATHER_CALL, "a <b> c"],
     ["a <tool_call> b", CALL + " and text", CALL[:-1], '<tool_call>{"name":"mul","arguments":{}}']),
    ("auto", False, None, ["Hello", CALL], [CALL + WEATHER_CALL]),
    ("required", True, None, [CALL, CALL + WEATHER_CALL], ["Hello", "", "Sure. " + CALL]),
    ("auto", True, {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
     ['{"x":3}', CALL], ["Hello", '{"x":"3"}', '{"x":3}' + CALL]),
])
def test_tool_grammar_admits_exactly_its_shapes(gen, choice, parallel, answer, accepted, refused):
    grammar = ToolCallsGrammar(tool_request([ADD, WEATHER], choice, parallel), answer_format=answer,
                               whitespace="compact")
    compiled = cs.compile(grammar, gen.vocabulary)
    assert compiled.backend == "llguidance"
    for text in accepted:
        assert _accepts(compiled, gen, text), text
    for text in refused:
        assert not _accepts(compiled, gen, text), text


def test_a_finished_tool_output_is_read_as_text_not_by_lark():
    from cdsl_struct.result import parse_value

    grammar = ToolCallsGrammar(tool_request([ADD, WEATHER], "auto", True), whitespace="compact")
    text = "Sure. " + CALL  # lark cannot build a parser for %json: the text goes to parse_tool_output
    assert parse_value(grammar, text) == text and grammar.parser().parse(text) == text


def test_parse_tool_output_validates_and_keeps_partial_calls():
    request = tool_request([ADD, WEATHER], "auto", True)
    out = parse_tool_output(request, "Let me see. " + CALL + WEATHER_CALL, complete=True)
    assert out.content == "Let me see." and [(c.name, c.arguments) for c in out.calls] == [
        ("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]
    assert parse_tool_output(request, "Just text <b>", complete=True).content == "Just text <b>"
    cut = parse_tool_output(request, CALL + WEATHER_CALL[:-5], complete=False)
    assert [c.complete for c in cut.calls] == [True, False] and cut.content is None
    assert cut.calls[1].name == "get_weather" and cut.calls[1].arguments_json() == '{"city":"Os'
    with pytest.raises(InvalidToolCall, match="invalid arguments"):
        parse_tool_output(request, '<tool_call>{"name":"add","arguments":{"a":"one","b":2}}', complete=True)
    with pytest.raises(InvalidToolCall, match="allowed tool"):
        parse_tool_output(request, '<tool_call>{"name":"mul","arguments":{}}', complete=True)
    with pytest.raises(InvalidToolCall, match="not finished"):
        parse_tool_output(request, CALL[:-3], complete=True)


@pytest.mark.parametrize("seed", range(5))
def test_call_stream_gives_content_then_call_deltas_in_any_split(seed):
    import random

    text = 'Checking. <tool_call>{"name":"add","arguments":{"a":1,"b":2}}' \
           '<tool_call>{"name": "get_weather", "arguments": {"city": "O\\"slo}<tool_call>"}}'
    rng = random.Random(seed)
    stream, content, names, arguments = CallStream(), "", {}, {}
    at = 0
    while at < len(text):
        step = rng.randint(1, 6)
        shown, pieces = stream.push(text[at:at + step])
        at += step
        content += shown
        for piece in pieces:
            if piece.name:
                assert piece.index not in names and piece.id.startswith("call_")
                names[piece.index] = piece.name
            arguments[piece.index] = arguments.get(piece.index, "") + piece.arguments
    content += stream.flush()
    assert content == "Checking. " and names == {0: "add", 1: "get_weather"}
    assert {i: json.loads(a) for i, a in arguments.items()} == {0: {"a": 1, "b": 2}, 1: {"city": 'O"slo}<tool_call>'}}


# --- real calls --------------------------------------------------------------------------------


def assert_valid_calls(result: Result, names: tuple[str, ...]) -> None:
    assert result.finish_reason == "stop" and result.complete, result.text
    assert result.tool_calls and result.value == result.tool_calls
    for call in result.tool_calls:
        assert call.name in names
        tool = next(t for t in (ADD, WEATHER) if t["function"]["name"] == call.name)
        jsonschema.validate(call.arguments, tool["function"]["parameters"])


def test_required_makes_a_valid_call(gen):
    result = gen.generate("What is the weather in Paris?", tools=[add, get_weather], tool_choice="required",
                          max_tokens=40)
    assert_valid_calls(result, ("add", "get_weather"))
    assert result.text.startswith(CALL_MARKER) and result.content is None


def test_named_tool_is_the_one_called(gen):
    result = gen.generate("What is the weather in Paris?", tools=[ADD, WEATHER],
                          tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=40)
    assert_valid_calls(result, ("add",))
    assert set(result.tool_calls[0].arguments) == {"a", "b"}


def test_parallel_calls_parse(gen):
    earlier = {"role": "assistant", "content": None,
               "tool_calls": [call_of("Rome"), call_of("Oslo")]}
    messages = [{"role": "user", "content": "What is the weather in Rome and in Oslo?"}, earlier,
                {"role": "user", "content": "What is the weather in Paris and in Berlin?"}]
    result = gen.generate(messages, tools=[WEATHER], tool_choice="get_weather", parallel_tool_calls=True,
                          max_tokens=50)
    assert_valid_calls(result, ("get_weather",))
    assert result.text.count(CALL_MARKER) == 2
    assert [c.arguments["city"] for c in result.tool_calls] == ["Paris", "Berlin"]
    assert len({c.id for c in result.tool_calls}) == 2


def test_none_answers_in_text(gen):
    result = gen.generate("Say hello.", tools=[WEATHER], tool_choice="none", max_tokens=16)
    assert result.tool_calls == [] and not result.text.startswith(CALL_MARKER)
    assert result.value is None or result.value == result.text


def test_auto_answers_in_text_or_calls(gen):
    text = gen.generate("Say hello to me.", tools=[WEATHER], max_tokens=16)
    assert text.tool_calls == [] and text.text and not text.text.startswith(CALL_MARKER)
    call = gen.generate(FEW_SHOT, tools=[WEATHER], max_tokens=30)
    assert_valid_calls(call, ("get_weather",))
    assert call.tool_calls[0].arguments["city"] == "Paris"


def test_auto_streams_the_raw_output(gen):
    stream = gen.stream(FEW_SHOT, tools=[WEATHER], max_tokens=30)
    deltas, result = list(stream), stream.result
    assert isinstance(result, Result) and result.tool_calls
    assert "".join(deltas) == result.text and len(deltas) > 3
