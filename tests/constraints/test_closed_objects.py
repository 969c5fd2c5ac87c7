"""Objects closed to undeclared keys: the rule ``compile()`` applies for every entry point, what it
leaves as given (where closing would widen a schema), and its opt-out."""

from __future__ import annotations

from typing import Literal, Union

import jsonschema
import pytest
from pydantic import BaseModel, Field

import cdsl_struct as cs
from cdsl_struct.constraints.closed_objects import close_objects, closed_spec


class Person(BaseModel):
    """README's model: ``occupation`` is undeclared."""

    name: str
    age: int


def accepts(compiled: cs.CompiledConstraint, text: str) -> bool:
    """True if every token of ``text`` is allowed and the output is then complete."""
    tokens = compiled.vocabulary.encode(text)
    state = compiled.new_state()
    if state.validate(tokens) != len(tokens):
        return False
    state.advance(tokens)
    return state.is_complete()


GOOD = '{"name": "Ada", "age": 36}'
REPEATED = '{"name": "Ada", "age": 36, "occupation": "mathematician", "occupation": "poet"}'  # what a user met
EXTRA = '{"name": "Ada", "age": 36, "born": 1815}'


def test_compile_closes_a_pydantic_model_like_generate(vocab_of):
    vocabulary = vocab_of("smollm2")
    closed = cs.compile(Person, vocabulary)
    assert closed.spec.schema["additionalProperties"] is False and closed.spec.model is Person
    assert accepts(closed, GOOD)
    assert not accepts(closed, REPEATED) and not accepts(closed, EXTRA)
    as_given = cs.compile(Person, vocabulary, extra_properties=True)  # the opt-out keeps the schema as given
    assert "additionalProperties" not in as_given.spec.schema
    assert accepts(as_given, GOOD) and accepts(as_given, REPEATED) and accepts(as_given, EXTRA)


def test_tool_calls_grammar_closes_arguments_in_compile(vocab_of):
    from cdsl_struct.tools import ToolCallsGrammar, tool_request

    add = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    grammar = ToolCallsGrammar(tool_request([add], "required", False), whitespace="compact")
    closed = grammar.with_closed_objects()
    assert closed.request.tools[0]["function"]["parameters"]["additionalProperties"] is False
    assert closed.with_closed_objects() is closed and closed_spec(closed) is closed
    call = '<tool_call>{"name":"add","arguments":{"a":1,"b":2,"c":3}}'
    assert not accepts(cs.compile(grammar, vocab_of("smollm2")), call)
    assert accepts(cs.compile(grammar, vocab_of("smollm2"), extra_properties=True), call)


def test_other_specs_are_not_touched():
    regex = cs.Regex("[0-9]+")
    assert closed_spec(regex) is regex
    schema = cs.JsonSchema({"type": "object", "additionalProperties": False, "properties": {"a": {}}})
    assert closed_spec(schema) is schema


ORDER = {"type": "object", "properties": {"kind": {"type": "string"}, "qty": {"type": "integer"}},
         "if": {"properties": {"kind": {"const": "gift"}}, "required": ["kind"]}, "then": {"required": ["note"]}}


@pytest.mark.parametrize(("schema", "instance"), [
    # closing the condition would make it false for {"kind": "gift", "qty": 1}: "then" would not apply
    (ORDER, {"kind": "gift", "qty": 1}),
    # closing inside "not" would refuse less
    ({"type": "object", "not": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}}, {"a": 1, "b": 2}),
    # a definition referred to from "not" stays as given too
    ({"type": "object", "not": {"$ref": "#/$defs/a"},
      "$defs": {"a": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}}}, {"a": 1, "b": 2}),
    # {"a": 1} matches both open branches (refused); closed, it would match only the first
    ({"oneOf": [{"type": "object", "properties": {"a": {}}}, {"type": "object", "properties": {"b": {}}}]}, {"a": 1}),
    # two matches of the open "contains" exceed maxContains; closed, only one would match
    ({"type": "array", "contains": {"properties": {"a": {}}}, "maxContains": 1}, [{"a": 1}, {"a": 1, "b": 2}]),
])
def test_closing_never_admits_what_the_schema_refuses(schema, instance):
    assert not jsonschema.Draft202012Validator(schema).is_valid(instance)
    closed = close_objects(schema)
    assert not jsonschema.Draft202012Validator(closed).is_valid(instance)


def test_discriminated_union_branches_are_closed():
    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int

    class Dog(BaseModel):
        kind: Literal["dog"]
        bark: str

    class Pet(BaseModel):
        pet: Union[Cat, Dog] = Field(discriminator="kind")  # noqa: UP007 - pydantic's discriminated union

    closed = close_objects(Pet.model_json_schema())
    assert "oneOf" in closed["properties"]["pet"]
    assert closed["$defs"]["Cat"]["additionalProperties"] is False
    assert closed["$defs"]["Dog"]["additionalProperties"] is False
