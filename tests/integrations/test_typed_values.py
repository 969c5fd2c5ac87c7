"""Every output type gives ``Result.value`` as a value of that type: ``list[int]`` a list of ints, an
``Enum`` its member, ``date`` a ``datetime.date``... read from exactly the texts Outlines' constraint admits."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, Literal, Optional, Union

import pytest

import cdsl_struct as cs
from cdsl_struct.integrations.outlines_types import TypedChoice, TypedGrammar, TypedRegex, to_spec
from cdsl_struct.integrations.typed_values import value_reader
from cdsl_struct.result import parse_value

pytest.importorskip("outlines.types")  # the extra `outlines`, installed by `make test`
from outlines.types import dsl  # noqa: E402

from tests.integrations.test_outlines_types import Movie, Person, Point  # noqa: E402


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 20


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Mixed(enum.Enum):
    ONE = 1
    B = "b"


CASES: list[tuple[Any, str, Any]] = [
    (int, "-12", -12),
    (int, "+7", 7),
    (float, "1.5e3", 1500.0),
    (float, "3", 3.0),
    (bool, "False", False),
    (str, '"a, b"', "a, b"),
    (dt.date, "2024-02-29", dt.date(2024, 2, 29)),
    (dt.time, "12:30:05", dt.time(12, 30, 5)),
    (dt.datetime, "2024-01-02 03:04:05", dt.datetime(2024, 1, 2, 3, 4, 5)),
    (list[int], "[1]", [1]),
    (list[int], "[1, -2, 30]", [1, -2, 30]),
    (list[str], '["a", "b, c"]', ["a", "b, c"]),
    (list[float], "[1, 2.5]", [1.0, 2.5]),
    (list[list[int]], "[[1, 2], [3]]", [[1, 2], [3]]),
    (list[Literal["a", "b"]], '["a", "b"]', ["a", "b"]),
    (list[Size], "[1, 20]", [Size.SMALL, Size.LARGE]),
    (list[Mood], '["sad"]', [Mood.SAD]),
    (list[Optional[bool]], "[None, True]", [None, True]),  # noqa: UP045 - the typing form users write
    (list[dt.date], "[2024-01-01]", [dt.date(2024, 1, 1)]),
    (list[Person], '[{"name":"A","age":1}]', [Person(name="A", age=1)]),
    (list[Point], '[{"x":1,"y":2}]', [Point(1, 2)]),
    (tuple[int, str], '(1, "x")', (1, "x")),
    (tuple[int, ...], "(1, 2, 3)", (1, 2, 3)),
    (tuple[()], "()", ()),
    (dict[str, int], '{"a":1, "b":2}', {"a": 1, "b": 2}),
    (dict[str, int], "{}", {}),
    (dict[int, bool], '{"1":True}', {1: True}),
    (dict[Literal[1, 2], str], '{"2":"x"}', {2: "x"}),
    (dict[str, list[int]], '{"k":[1, 2]}', {"k": [1, 2]}),
    (dict, '{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
    (Literal[1, 2], "2", 2),
    (Literal[True, "x"], "x", "x"),
    (Literal["yes", "no"], "no", "no"),
    (Size, "20", Size.LARGE),
    (Mood, "happy", Mood.HAPPY),
    (Mixed, "b", Mixed.B),
    (Mixed, "1", Mixed.ONE),
    (Optional[int], "None", None),  # noqa: UP045
    (int | None, "7", 7),
    (Union[int, float], "1.5", 1.5),  # noqa: UP007 - the typing form users write
    (Union[int, float], "1", 1),  # noqa: UP007 - the first alternative that reads it all
    (Person, '{"name":"A","age":1}', Person(name="A", age=1)),
    (Point, '{"x":1,"y":2}', Point(1, 2)),
    (Movie, '{"title":"T","year":1999}', {"title": "T", "year": 1999}),
]


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same type all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) and same(k, k2) for (k, k2) in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize(("output_type", "text", "value"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_every_output_type_gives_a_value_of_that_type(output_type, text, value):
    spec = to_spec(output_type)
    pattern = getattr(spec, "pattern", None)
    if pattern is not None and not isinstance(spec, cs.JsonSchema):
        assert dsl.Regex(pattern).matches(text), "the text is one the constraint admits"
    assert same(parse_value(spec, text), value)


def test_typed_specs_keep_the_constraint():
    assert isinstance(to_spec(list[int]), TypedRegex) and to_spec(list[int]).pattern == dsl.to_regex(
        dsl.python_types_to_terms(list[int]))
    assert isinstance(to_spec(Mood), TypedChoice) and to_spec(Mood).options == ("happy", "sad")
    assert isinstance(to_spec(dict), TypedGrammar) and to_spec(dict).kind == "grammar"
    assert to_spec(Literal["yes", "no"]) == cs.Choice(["yes", "no"])  # the chosen string is the value already
    assert to_spec(dsl.Regex("[0-9]+")) == cs.Regex("[0-9]+")  # Outlines' own terms stay text, as in Outlines
    assert parse_value(to_spec(dsl.Regex("[0-9]+")), "12") == "12"


def test_a_text_that_names_no_value_is_output_invalid():
    with pytest.raises(cs.OutputInvalid):  # the date regex admits February 30th
        parse_value(to_spec(dt.date), "2024-02-30")
    with pytest.raises(cs.OutputInvalid):
        value_reader(list[int]).read("[1,2]")  # Outlines' separator is ", "


def test_compiled_typed_spec_reads_values_and_shares_the_engine_program(tokenizer):
    typed = cs.compile(list[int], tokenizer)
    plain = cs.compile(cs.Regex(typed.spec.pattern), tokenizer)
    assert typed.program is plain.program  # the reader is no part of the constraint
    assert parse_value(typed.spec, "[1, 2]") == [1, 2] and parse_value(plain.spec, "[1, 2]") == "[1, 2]"
    assert cs.compile(list[int], tokenizer) is typed  # one reader per type: cached like a pydantic model


@pytest.fixture(scope="module")
def tokenizer():
    return cs.load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def gen(smollm2):
    generator = cs.Generator(smollm2, draft=None)
    yield generator
    generator.close()


def test_generate_gives_typed_values_on_the_embedded_model(gen):
    listed = gen.generate("Copy this list: [2, 3, 5]", schema=list[int], max_tokens=16)
    assert listed.finish_reason == "stop" and listed.text == "[2, 3, 5]" and same(listed.value, [2, 3, 5])
    size = gen.generate("Is an elephant small (1) or large (20)?", schema=Size, max_tokens=4)
    assert size.finish_reason == "stop" and isinstance(size.value, Size)
