"""Partial values while JSON streams: at every prefix of a document, what ``partial_json`` says
is a prefix of the final value (never taken back), grows as the text does, and is the whole value
at the end."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import BaseModel

from cdsl_struct.partial import NOTHING, consistent_with, partial_json, partial_model

DOCUMENTS = [
    {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"], "alive": False, "note": None},
    {"a": {"b": {"c": [1, 2.5, -3e2, {"d": "x\"y\\z\n"}]}}, "e": []},
    [{"id": 1}, {"id": 22, "v": "é€😀"}, [], [[True]]],
    {"empty": "", "unicode": "\u00e9\U0001F600", "n": 0, "f": -0.125},
    "just a string",
]


def _prefixes(text):
    return [text[:end] for end in range(len(text) + 1)]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_every_prefix_is_consistent_with_the_final_value(document, indent, ascii_only):
    text = json.dumps(document, indent=indent, ensure_ascii=ascii_only)
    seen = NOTHING
    for prefix in _prefixes(text):
        value = partial_json(prefix)
        assert consistent_with(value, document), (prefix, value)
        assert consistent_with(seen, value) or value is NOTHING is seen, (prefix, seen, value)  # only grows
        seen = value
    if not isinstance(document, (int, float)):
        assert partial_json(text) == document


def test_numbers_and_literals_appear_only_when_whole():
    assert partial_json('{"age": 3') == {}
    assert partial_json('{"age": 36') == {}
    assert partial_json('{"age": 36,') == {"age": 36}
    assert partial_json('{"x": 1.') == {} and partial_json('{"x": 1.5}') == {"x": 1.5}
    assert partial_json('[1e') == [] and partial_json("[1e3 ") == [1000.0]
    assert partial_json('{"ok": tru') == {} and partial_json('{"ok": true') == {"ok": True}
    assert partial_json('{"na') == {} and partial_json('{"name"') == {} and partial_json('{"name": ') == {}
    assert partial_json('{"name": "Ad') == {"name": "Ad"}
    assert partial_json('{"s": "a\\u00') == {"s": "a"} and partial_json('{"s": "a\\u00e9') == {"s": "aé"}
    assert partial_json("") is NOTHING and partial_json("  ") is NOTHING and partial_json("12") is NOTHING


def test_the_consistency_rule_refuses_what_would_be_taken_back():
    assert not consistent_with({"a": "xy"}, {"a": "xz"})
    assert not consistent_with({"b": 1}, {"a": 1})
    assert not consistent_with([1, 2, 3], [1, 2])
    assert not consistent_with(1, 1.0) and consistent_with({}, {"a": 1})


def test_random_documents_stay_consistent():
    rng = random.Random(7)

    def make(depth):
        kind = rng.choice(["obj", "arr", "str", "int", "float", "lit"] if depth < 3 else ["str", "int", "lit"])
        if kind == "obj":
            return {f"k{rng.randint(0, 99)}": make(depth + 1) for _ in range(rng.randint(0, 3))}
        if kind == "arr":
            return [make(depth + 1) for _ in range(rng.randint(0, 3))]
        if kind == "str":
            return "".join(rng.choice('ab "\\\n\té😀') for _ in range(rng.randint(0, 6)))
        if kind == "int":
            return rng.randint(-1000, 1000)
        if kind == "float":
            return round(rng.uniform(-10, 10), 3)
        return rng.choice([True, False, None])

    for _ in range(200):
        document = {"root": make(0)}
        text = json.dumps(document, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        for prefix in _prefixes(text):
            assert consistent_with(partial_json(prefix), document), prefix


class Address(BaseModel):
    city: str
    zip: str


class Person(BaseModel):
    name: str
    age: int
    addresses: list[Address]
    home: Address | None = None


def test_a_partial_model_has_the_fields_so_far_nested_models_built_the_same_way():
    text = json.dumps({"name": "Ada", "age": 36, "addresses": [{"city": "London", "zip": "N1"}],
                       "home": {"city": "Paris", "zip": "75"}})
    cut = text[:text.index("London") + 3]
    partial = partial_model(Person, partial_json(cut))
    assert isinstance(partial, Person) and partial.name == "Ada" and partial.age == 36
    assert isinstance(partial.addresses[0], Address) and partial.addresses[0].city == "Lon"
    assert partial.model_fields_set == {"name", "age", "addresses"}
    assert partial.addresses[0].model_fields_set == {"city"}
    whole = partial_model(Person, partial_json(text))
    assert isinstance(whole.home, Address) and whole == Person.model_validate_json(text)
