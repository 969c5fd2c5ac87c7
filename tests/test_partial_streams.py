"""Typed partial values while a real model streams JSON (issue 40): ``TextStream.partials()`` and
``AsyncTextStream.partials()`` give values that only grow, each consistent with the final value,
the last of them the final value itself; a pydantic schema's partials are its model."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from cdsl_struct.api import Generator
from cdsl_struct.partial import consistent_with


class Pet(BaseModel):
    name: str
    species: str


class Owner(BaseModel):
    name: str
    age: int
    pets: list[Pet]


PROMPT = "Ada Lovelace, 36, has a cat called Tom and a dog called Rex. Give her as JSON."


@pytest.fixture(scope="module")
def gen(smollm2, one_torch_thread):
    generator = Generator(smollm2)
    yield generator
    generator.close()


def _dump(value):
    return value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value


def test_a_pydantic_stream_gives_growing_partial_models_ending_in_the_result(gen):
    stream = gen.stream(PROMPT, schema=Owner, max_tokens=80)
    values = list(stream.partials())
    result = stream.result
    assert result.finish_reason == "stop" and isinstance(result.value, Owner)
    assert len(values) > 5 and all(isinstance(v, Owner) for v in values)
    final = result.value.model_dump()
    for earlier, later in zip(values, values[1:], strict=False):
        assert consistent_with(_dump(earlier), _dump(later))
    assert all(consistent_with(_dump(v), final) for v in values)
    assert values[-1] == result.value
    grown = [v for v in values if "pets" in v.model_fields_set and v.pets]
    assert grown and isinstance(grown[0].pets[0], Pet)  # nested models as deep as written


def test_partial_is_read_alongside_the_deltas_and_plain_schemas_give_dicts(gen):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    seen = []
    with gen.stream(PROMPT, schema=schema, max_tokens=40) as stream:
        for _delta in stream:
            if stream.partial is not None:
                seen.append(stream.partial)
        result = stream.result
    assert seen and all(isinstance(v, dict) and consistent_with(v, result.value) for v in seen)
    assert seen[-1] == result.value


def test_other_constraints_have_no_partial_values(gen):
    stream = gen.stream("Say yes or no.", choices=["yes", "no"], max_tokens=4)
    assert list(stream.partials()) == [] and stream.partial is None and stream.result.text in ("yes", "no")


def test_async_partials_match_the_sync_ones(gen):
    expected = list(gen.stream(PROMPT, schema=Owner, max_tokens=80).partials())

    async def collect():
        return [value async for value in gen.astream(PROMPT, schema=Owner, max_tokens=80).partials()]

    assert asyncio.run(collect()) == expected


def test_tool_call_arguments_stream_as_partial_values(gen):
    from cdsl_struct.partial import consistent_with

    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                       "required": ["city"], "additionalProperties": False}}}
    stream = gen.stream("What is the weather in Paris?", tools=[weather], tool_choice="required", max_tokens=40,
                        temperature=0)
    partials = list(stream.partials())
    final = stream.result.tool_calls
    assert final and partials[-1] == final  # the last value is the Result's own calls
    assert len(partials) >= 3
    for calls in partials[:-1]:
        assert all(c.name == f.name and consistent_with(c.arguments, f.arguments)
                   for c, f in zip(calls, final, strict=False))
    assert any(c.arguments == {} for c in partials[0])  # the name is whole before any argument
