"""Outlines output types become specs that constrain exactly what Outlines constrains."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Literal, Optional

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

import cdsl_struct as cs
from cdsl_struct.constraints.specs import as_spec
from cdsl_struct.integrations.outlines_types import to_spec

outlines_types = pytest.importorskip("outlines.types")  # the extra `outlines`, installed by `make test`
from outlines.types import dsl  # noqa: E402


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 20


class Person(BaseModel):
    name: str
    age: int


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Movie(TypedDict):
    title: str
    year: int


@pytest.fixture(scope="module")
def tokenizer():
    return cs.load_tokenizer("smollm2")


def compiled_accepts(spec, tokenizer, text: str) -> bool:
    compiled = cs.compile(spec, tokenizer, whitespace="compact")
    ids = tokenizer.encode(text, add_special_tokens=False)
    eos = compiled.vocabulary.eos_token_ids[0]
    return compiled.new_state().validate([*ids, eos]) == len(ids) + 1


@pytest.mark.parametrize(
    ("output_type", "kind"),
    [
        (Literal["yes", "no"], "choice"),
        (Color, "choice"),
        (Person, "json_schema"),
        (Point, "json_schema"),
        (Movie, "json_schema"),
        (int, "regex"),
        (Size, "regex"),
        (Optional[int], "regex"),  # noqa: UP045 - the typing form users write
        (int | None, "regex"),
        (list[Literal["a", "b"]], "regex"),
        (dict, "grammar"),
    ],
)
def test_python_type_forms_become_specs(output_type, kind):
    assert to_spec(output_type).kind == kind
    assert as_spec(output_type).kind == kind  # compile() and the constraint API take them as they are


@pytest.mark.parametrize(
    ("output_type", "good", "bad"),
    [
        (int, ["0", "-12", "+7"], ["01", "1.5", "x"]),
        (float, ["1.5", "-2e3", "7"], ["1.", ".5"]),
        (bool, ["True", "False"], ["true", "1"]),
        (dt.date, ["2024-02-29"], ["2024-13-01", "24-01-01"]),
        (Size, ["1", "20"], ["2", "SMALL"]),
        (int | None, ["5", "None"], ["null", ""]),
        (list[Literal["a", "b"]], ['["a", "b", "a"]', '["b"]'], ['[a]', '["c"]', '["a","b"]']),
        (Literal[1, "x"], ["1", "x"], ['"x"', "2"]),
        (outlines_types.integer, ["42"], ["4 2"]),
        (dsl.either("cat", "dog") + dsl.optional("s"), ["cat", "dogs"], ["cow", "cats!"]),
        (dsl.between(2, 3, outlines_types.digit), ["12", "123"], ["1", "1234"]),
        (outlines_types.ipv4, ["10.0.0.255"], ["256.1.1.1"]),
    ],
)
def test_regex_types_match_what_outlines_matches(output_type, good, bad, tokenizer):
    term = dsl.python_types_to_terms(output_type)
    for text in good:
        assert term.matches(text), text  # Outlines' own judgement
        assert compiled_accepts(to_spec(output_type), tokenizer, text), text
    for text in bad:
        assert not term.matches(text), text
        assert not compiled_accepts(to_spec(output_type), tokenizer, text), text


def test_outlines_terms_json_schema_regex_cfg_choice(tokenizer):
    spec = to_spec(dsl.JsonSchema(Person))
    assert spec.kind == "json_schema" and spec.schema["required"] == ["name", "age"]
    assert compiled_accepts(spec, tokenizer, '{"name":"Ann","age":3}')
    assert not compiled_accepts(spec, tokenizer, '{"name":"Ann"}')

    assert to_spec(dsl.Regex(r"[a-z]{3}")) == cs.Regex(r"[a-z]{3}")
    assert to_spec(dsl.Choice(["left", "right"])) == cs.Choice(["left", "right"])

    grammar = to_spec(dsl.CFG('?start: "a" | "b" start'))
    assert grammar.kind == "grammar"
    assert compiled_accepts(grammar, tokenizer, "bba") and not compiled_accepts(grammar, tokenizer, "bb")


def test_json_schema_with_outlines_whitespace_keeps_it(tokenizer):
    spec = to_spec(dsl.JsonSchema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                                  whitespace_pattern=r"[ ]?"))
    assert spec.kind == "regex"  # Outlines' whitespace rule is part of its constraint
    assert compiled_accepts(spec, tokenizer, '{ "n": 1}')
    assert not compiled_accepts(spec, tokenizer, '{\n"n":1}')


def test_structured_values_come_back_typed():
    from cdsl_struct.result import parse_value

    assert parse_value(to_spec(Person), '{"name":"A","age":1}') == Person(name="A", age=1)
    assert parse_value(to_spec(Point), '{"x":1,"y":2}') == Point(1, 2)
    assert parse_value(to_spec(Movie), '{"title":"T","year":1999}') == {"title": "T", "year": 1999}


def test_callables_give_the_schema_of_their_signature():
    def add(a: int, b: int): ...

    spec = to_spec(add)
    assert spec.kind == "json_schema" and set(spec.schema["properties"]) == {"a", "b"}


def test_unsupported_forms_raise_typed_errors():
    with pytest.raises(cs.UnsupportedFeature):  # Outlines' isbn uses a lookahead: no engine can express it
        cs.compile(outlines_types.isbn, "smollm2")
    with pytest.raises(cs.UnsupportedFeature):
        to_spec(dsl.CFG('?start: "a"') + dsl.String("b"))
    with pytest.raises(TypeError):
        as_spec(object())
