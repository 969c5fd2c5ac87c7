"""Tool-call formats per model family: picked from the real chat templates, their grammars on the real
tokenizers (each family's call text accepted, malformed text refused, special-token markers allowed
as the token or spelled out), parsed back into the declared calls whole and streamed, and the
embedded SmolLM2 calling tools in every format with every finished output parsing into valid calls."""

from __future__ import annotations

import json

import jsonschema
import pytest

import cdsl_struct as cs
from cdsl_struct.errors import InvalidArgument
from cdsl_struct.tools import CallStream, ToolCallsGrammar, parse_tool_output, tool_request
from cdsl_struct.tools.formats import FORMATS, GEMMA, GENERIC, HERMES, LLAMA3, MISTRAL, detect_format, resolve_format

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 30}},
                                                "required": ["city"], "additionalProperties": False}}}
TOOLS = [ADD, WEATHER]
CALLS = [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]
FAMILY = {"qwen3": HERMES, "llama3": LLAMA3, "gemma3": GEMMA, "smollm2": GENERIC}
"""The format each real tokenizer's chat template picks."""


@pytest.fixture(scope="module")
def tokenizer_of():
    from cdsl_struct.models.tokenizers import load_tokenizer

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_tokenizer(name)
        return cache[name]

    return get


@pytest.mark.parametrize(("name", "expected"), FAMILY.items())
def test_format_is_detected_from_the_real_template(tokenizer_of, name, expected):
    assert resolve_format("auto", tokenizer_of(name)) is expected


def test_detection_markers_and_overrides():
    assert detect_format("... [TOOL_CALLS] ...") is MISTRAL
    assert detect_format("{{ '<|python_tag|>' }}") is LLAMA3
    assert detect_format("```tool_code") is GEMMA
    assert detect_format("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}") is FORMATS["deepseek"]
    assert detect_format(None) is GENERIC and detect_format("plain {{ messages }}") is GENERIC
    assert resolve_format("mistral") is MISTRAL and resolve_format(HERMES) is HERMES
    with pytest.raises(InvalidArgument, match="unknown tool format") as caught:
        resolve_format("harmony")
    assert caught.value.param == "tool_format" and isinstance(caught.value, cs.CdslError)


def accepts(compiled, vocabulary, text: str) -> bool:
    tokens = vocabulary.encode(text) + [vocabulary.eos_token_id]
    return compiled.new_state().validate(tokens) == len(tokens)


def spelled(vocabulary, text: str) -> list[int]:
    """``text``'s tokens with every special-token marker written character by character."""
    tokens: list[int] = []
    for char in text:
        tokens += vocabulary.encode(char)
    return tokens


def malformed(fmt, one: str) -> list[str]:
    """Texts each format must refuse: a cut call, text after the calls, an unknown tool, bad arguments,
    the trigger in text without a call after it."""
    wrong_tool = fmt.written([{"name": "mul", "arguments": {"a": 1, "b": 2}}])
    bad_arguments = fmt.written([{"name": "add", "arguments": {"a": "one", "b": 2}}])
    return [one[:-2], one + " trailing text", wrong_tool, bad_arguments, f"Sure. {fmt.trigger} hello"]


@pytest.mark.parametrize("tokenizer", ["qwen3", "llama3", "gemma3", "smollm2"])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_grammar_accepts_the_family_text_and_refuses_malformed(vocab_of, tokenizer, name):
    fmt, vocabulary = FORMATS[name], vocab_of(tokenizer)
    auto = cs.compile(ToolCallsGrammar(tool_request(TOOLS, "auto", True, fmt)), vocabulary)
    required = cs.compile(ToolCallsGrammar(tool_request(TOOLS, "required", False, fmt)), vocabulary)
    named = cs.compile(ToolCallsGrammar(tool_request(TOOLS, "get_weather", True, fmt)), vocabulary)
    one, two = fmt.written(CALLS[:1]), fmt.written(CALLS)
    if vocabulary.decode(vocabulary.encode(two)) != two.encode():
        pytest.skip(f"{tokenizer} cannot write {name}'s markers (SentencePiece reads DeepSeek's ▁ as a space)")
    for text in ["Hello there.", "", "Sure. " + one, two, one]:
        assert accepts(auto, vocabulary, text), text
    for text in malformed(fmt, one):
        assert not accepts(auto, vocabulary, text), text
    assert accepts(required, vocabulary, one) and not accepts(required, vocabulary, two)
    assert not accepts(required, vocabulary, "Hello") and not accepts(required, vocabulary, "Sure. " + one)
    assert accepts(named, vocabulary, fmt.written(CALLS[1:])) and not accepts(named, vocabulary, one)
    spelled_out = spelled(vocabulary, two) + [vocabulary.eos_token_id]  # markers as plain characters
    assert auto.new_state().validate(spelled_out) == len(spelled_out)


def test_none_is_no_constraint_in_any_format():
    for fmt in FORMATS.values():
        assert tool_request(TOOLS, "none", True, fmt) is None


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_parse_back_whole_and_streamed(name):
    fmt = FORMATS[name]
    request = tool_request(TOOLS, "auto", True, fmt)
    text = "Let me check. " + fmt.written(CALLS)
    output = parse_tool_output(request, text, complete=True)
    assert output.content == "Let me check."
    assert [(c.name, c.arguments) for c in output.calls] == [(c["name"], c["arguments"]) for c in CALLS]
    stream = CallStream(fmt)
    content, names, arguments = "", {}, {}
    for i in range(0, len(text), 3):  # three characters a delta: markers arrive in pieces
        shown, pieces = stream.push(text[i:i + 3])
        content += shown
        for piece in pieces:
            if piece.name:
                names[piece.index] = piece.name
            arguments[piece.index] = arguments.get(piece.index, "") + piece.arguments
    content += stream.flush()
    assert content == "Let me check. " and fmt.trigger not in content
    assert names == {0: "add", 1: "get_weather"}
    assert [json.loads(arguments[i]) for i in (0, 1)] == [c["arguments"] for c in CALLS]
    plain = parse_tool_output(request, "No call here.", complete=True)
    assert plain.content == "No call here." and plain.calls == []


def test_llama3_answer_that_opens_like_a_call_is_an_answer():
    request = tool_request(TOOLS, "auto", True, LLAMA3)
    answer = '{"name": "Bob", "age": 3}'
    assert parse_tool_output(request, answer, complete=True).content == answer


def test_earlier_calls_are_written_in_the_format(tokenizer_of):
    from cdsl_struct.prompts import prompt_ids

    tokenizer = tokenizer_of("qwen3")
    request = tool_request(TOOLS, "auto", True, HERMES)
    earlier = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    messages = [{"role": "user", "content": "1+2?"}, earlier, {"role": "user", "content": "and 3+4?"}]
    text = tokenizer.decode(prompt_ids(tokenizer, messages, system=request.system_prompt()))
    assert HERMES.written(CALLS[:1]) in text
    assert "<tool_call>\n{\"name\": <function name>" in text  # the prompt shows the format's shape


# --- SmolLM2 in every format -------------------------------------------------------------------


def call_shot(fmt) -> list[dict]:
    """One earlier exchange in which the assistant called get_weather, in the format under test."""
    earlier = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_rome", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Rome"})}}]}
    return [{"role": "user", "content": "What is the weather in Rome?"}, earlier]


QUESTIONS = ["What is the weather in Paris?", "What is 2 plus 3?", "What is the weather in Oslo?"]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_smollm2_calls_parse_in_every_format(smollm2, one_torch_thread, name):
    """Every finished output, with calls required, named or optional, parses into declared calls whose
    arguments satisfy the tools' schemas."""
    from cdsl_struct.api import Generator

    generator = Generator(smollm2, tool_format=name)
    try:
        assert generator.tool_format is FORMATS[name]
        fmt = FORMATS[name]
        markup = len(generator.tokenizer.encode(fmt.open + fmt.close, add_special_tokens=False))
        finished = 0
        for choice in ("required", "auto", {"type": "function", "function": {"name": "get_weather"}}):
            prompts = [[*call_shot(FORMATS[name]), {"role": "user", "content": q}] for q in QUESTIONS]
            for result in generator.generate_batch(prompts, tools=TOOLS, tool_choice=choice,
                                                     max_tokens=32 + markup):
                if result.finish_reason != "stop":
                    continue
                finished += 1
                assert result.complete, result.text
                if choice != "auto":
                    assert result.tool_calls, result.text
                for call in result.tool_calls:
                    tool = next(t for t in TOOLS if t["function"]["name"] == call.name)
                    jsonschema.validate(call.arguments, tool["function"]["parameters"])
                    if isinstance(choice, dict):
                        assert call.name == "get_weather"
        assert finished >= 6
    finally:
        generator.close()


def test_auto_is_the_default_everywhere_and_the_cli_takes_a_name():
    import argparse
    import inspect

    from cdsl_struct.api import Generator
    from cdsl_struct.server.app import serve
    from cdsl_struct.server.cli import add_serve_parser

    for function in (Generator.__init__, serve):
        assert inspect.signature(function).parameters["tool_format"].default == "auto"
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["serve"]).tool_format == "auto"
    assert parser.parse_args(["serve", "--tool-format", "llama3"]).tool_format == "llama3"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--tool-format", "harmony"])


def test_one_call_may_write_its_tools_in_another_format(smollm2, one_torch_thread):
    from cdsl_struct.api import Generator
    from cdsl_struct.errors import InvalidArgument

    generator = Generator(smollm2, tool_format="hermes")
    try:
        prompt = [*call_shot(FORMATS["mistral"]), {"role": "user", "content": QUESTIONS[0]}]
        result = generator.generate(prompt, tools=TOOLS, tool_choice="required", max_tokens=48,
                                    tool_format="mistral")
        assert result.text.startswith(FORMATS["mistral"].open) and "<tool_call>" not in result.text
        assert result.tool_calls and result.tool_calls[0].name in {t["function"]["name"] for t in TOOLS}
        assert generator.generate(prompt, tools=TOOLS, tool_choice="required",
                                  max_tokens=48).text.startswith("<tool_call>")  # the Generator's own
        with pytest.raises(InvalidArgument, match="tool format"):
            generator.generate(prompt, tools=TOOLS, tool_format="klingon")
    finally:
        generator.close()
