"""The schema rewriter: each rule is exact (fuzzed with hypothesis + hypothesis-jsonschema,
judged by jsonschema), removes the keyword it targets, and refuses by name what it cannot do."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_rewrite import compare, validator
from cdsl_struct.constraints.schema_rewrite import rewrite_schema
from cdsl_struct.constraints.schema_rewrite.regexes import complement_of_strings, literal_alternatives
from cdsl_struct.errors import UnsupportedFeature

EXAMPLES = 30  # per rule; `python -m benchmarks fuzz-rewrite` runs the larger fuzz
DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT4 = "http://json-schema.org/draft-04/schema#"

# (name, schema, rules that must fire, keywords that must be gone from the rewrite)
RULE_CASES = [
    ("not-enum", {"type": "object", "properties": {"a": {"not": {"enum": ["x", "yz", 3, None]}}}},
     {"not"}, {"not"}),
    ("not-type", {"not": {"type": ["string", "null"]}}, {"not"}, {"not"}),
    ("not-required", {"type": "object", "not": {"required": ["a", "b"]}}, {"not"}, {"not"}),
    ("not-bounds", {"not": {"minimum": 3, "maxLength": 2}}, {"not"}, {"not"}),
    ("not-properties", {"not": {"properties": {"a": {"const": 1}, "b": {"type": "string"}}}}, {"not"}, {"not"}),
    ("not-pattern", {"type": "string", "not": {"pattern": "^(ab|c)$"}}, {"not"}, {"not"}),
    ("not-anyOf", {"not": {"anyOf": [{"type": "number"}, {"type": "string", "minLength": 2}]}}, {"not"}, {"not"}),
    ("not-not", {"not": {"not": {"type": "boolean"}}}, {"not"}, {"not"}),
    ("not-ref", {"definitions": {"s": {"type": "string"}}, "not": {"$ref": "#/definitions/s"}}, {"not"}, {"not"}),
    ("oneOf-types", {"oneOf": [{"type": "string"}, {"type": "null"}, {"type": "integer"}]},
     {"oneOf->anyOf"}, {"oneOf"}),
    ("oneOf-discriminator", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]},
    ]}, {"oneOf->anyOf"}, {"oneOf"}),
    ("oneOf-required-forbidden", {"oneOf": [
        {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": False},
        {"type": "object", "properties": {"b": {}}, "required": ["b"], "additionalProperties": False},
    ]}, {"oneOf->anyOf"}, {"oneOf"}),
    ("oneOf-closed-objects", {"oneOf": [
        {"type": "object", "properties": {"set": {"type": "object"}, "delete": {"type": "array"}},
         "additionalProperties": False},
        {"type": "object", "properties": {"replace": {"type": "object"}}, "additionalProperties": False},
    ]}, {"oneOf-exclusion"}, {"oneOf"}),
    ("not-closed-object", {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False,
                           "not": {"properties": {"a": {"type": "string"}}, "additionalProperties": False}},
     {"not"}, {"not"}),
    ("oneOf-overlap", {"oneOf": [{"type": "number", "minimum": 0}, {"type": "number", "maximum": 10}]},
     {"oneOf-exclusion"}, {"oneOf"}),
    ("oneOf-enum-overlap", {"oneOf": [{"enum": ["a", "b", 1]}, {"type": "string", "maxLength": 1}]},
     {"oneOf-exclusion"}, {"oneOf"}),
    ("if-then-else", {"type": "object", "if": {"properties": {"t": {"const": "a"}}, "required": ["t"]},
                      "then": {"required": ["x"]}, "else": {"required": ["y"]}}, {"if-then-else"}, {"if", "then"}),
    ("if-then", {"if": {"type": "number"}, "then": {"minimum": 5}}, {"if-then-else"}, {"if"}),
    ("dependencies", {"$schema": DRAFT7, "type": "object", "dependencies": {
        "a": ["b", "c"], "d": {"properties": {"e": {"type": "integer"}}, "required": ["e"]}}},
     {"dependencies"}, {"dependencies"}),
    ("dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]},
                           "dependentSchemas": {"b": {"maxProperties": 2}}},
     {"dependentRequired", "dependentSchemas"}, {"dependentRequired", "dependentSchemas"}),
    ("format-unknown", {"type": "string", "format": "topic"}, {"format-annotation"}, {"format"}),
    ("draft4-bounds", {"$schema": DRAFT4, "type": "number", "maximum": 5, "exclusiveMaximum": True,
                       "minimum": 1, "exclusiveMinimum": False}, {"draft4-bounds"}, set()),
    ("uniqueItems-finite", {"type": "array", "items": {"enum": [1, 2, "a"]}, "uniqueItems": True},
     {"uniqueItems-finite"}, {"uniqueItems"}),
    ("uniqueItems-vacuous", {"type": "array", "maxItems": 1, "uniqueItems": True}, {"uniqueItems-vacuous"},
     {"uniqueItems"}),
    ("min/maxProperties", {"type": "object", "properties": {"a": {}, "b": {"type": "integer"}, "c": {}},
                           "additionalProperties": False, "minProperties": 2, "maxProperties": 2},
     {"min/maxProperties"}, {"minProperties", "maxProperties"}),
    ("propertyNames-pattern", {"type": "object", "propertyNames": {"pattern": "^x"},
                               "properties": {"ya": {"type": "integer"}, "b": {}},
                               "additionalProperties": {"type": "string"}}, {"propertyNames"}, {"propertyNames"}),
    ("propertyNames-open", {"type": "object", "propertyNames": {"pattern": "^x"},
                            "properties": {"xa": {"type": "integer"}, "b": {}}}, {"propertyNames"}, {"propertyNames"}),
    ("propertyNames-enum", {"propertyNames": {"enum": ["a", "b"]}, "properties": {"a": {"type": "integer"}}},
     {"propertyNames"}, {"propertyNames"}),
]


def keywords_in(schema):
    if isinstance(schema, dict):
        found = set(schema)
        for key, value in schema.items():
            if key in ("properties", "patternProperties", "definitions", "$defs"):
                for sub in value.values():
                    found |= keywords_in(sub)
            elif key not in ("enum", "const", "default", "examples"):
                found |= keywords_in(value)
        return found
    if isinstance(schema, list):
        return set().union(*(keywords_in(s) for s in schema)) if schema else set()
    return set()


@pytest.mark.parametrize("name,schema,rules,gone", RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_rule_is_exact_under_fuzzing(name, schema, rules, gone):
    rewrite = rewrite_schema(schema)
    assert rules <= set(rewrite.rules)
    assert not gone & keywords_in(rewrite.schema), rewrite.schema
    validator(rewrite.schema).check_schema(rewrite.schema)
    stats = compare(schema, rewrite.schema, examples=EXAMPLES)
    assert stats["mismatches"] == [], (json.dumps(rewrite.schema), stats["mismatches"])
    assert stats["instances"] >= EXAMPLES // 2 and 0 < stats["valid"] < stats["instances"]  # both verdicts were seen


def test_rule_catches_a_wrong_rewrite():
    """The fuzzing sees a rewrite that is off by one value (so a passing rule test means something)."""
    schema = {"type": "object", "properties": {"a": {"not": {"enum": ["x", "yz", 3]}}}}
    wrong = {"type": "object", "properties": {"a": {"not": {"enum": ["x", "yz"]}}}}
    assert compare(schema, wrong, examples=150)["mismatches"]


def test_schema_the_engine_reads_is_left_alone():
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "date"}}, "required": ["a"]}
    rewrite = rewrite_schema(schema)
    assert rewrite.rules == () and rewrite.schema == schema


@pytest.mark.parametrize("schema,keyword", [
    ({"not": {"multipleOf": 3}}, "not"),
    ({"not": {"type": "integer"}}, "not"),
    ({"type": "array", "not": {"items": {"type": "string"}}}, "not"),
    ({"not": {"additionalProperties": False, "properties": {"a": {}}}}, "not"),
    ({"not": {"pattern": "^a+$"}}, "not"),
    ({"not": {"const": {"a": 1}}}, "not"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "not"),  # number-but-not-integer is not expressible
    ({"type": "object", "minProperties": 2, "properties": {"a": {}}}, "minProperties"),
    ({"propertyNames": {"pattern": "^x"}, "properties": {"xa": {}}, "additionalProperties": {"type": "string"}},
     "propertyNames"),
    ({"type": "array", "items": {"enum": list(range(9))}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "items": {"enum": list(range(200))}, "minItems": 150, "uniqueItems": True}, "uniqueItems"),
    ({"definitions": {"t": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#/definitions/t"}},
                                      {"properties": {"n": {"$ref": "#/definitions/t"}}}]}},
      "not": {"$ref": "#/definitions/t"}}, "not"),
])
def test_what_cannot_be_exact_is_refused_by_name(schema, keyword):
    with pytest.raises(UnsupportedFeature) as info:
        rewrite_schema(schema)
    assert info.value.feature == keyword
    assert info.value.backend == "rewrite"


@settings(max_examples=200, deadline=None)
@given(words=st.sets(st.text(alphabet="ab\\.^$[]-é", max_size=4), min_size=1, max_size=4),
       probe=st.text(alphabet="ab\\.^$[]-é\n", max_size=6))
def test_string_complement_matches_exactly_the_other_strings(words, probe):
    pattern = complement_of_strings(words, "not")
    assert (re.search(pattern, probe) is not None) == (probe not in words)


def test_a_huge_enum_with_unique_items_is_refused_at_once():
    """10,700 values (64 KB): the exact count of arrays has more digits than Python will print
    (it raised ValueError) and comparing every pair of values is quadratic; both stop early now."""
    schema = {"type": "array", "items": {"enum": list(range(10_700))}, "uniqueItems": True}
    with pytest.raises(UnsupportedFeature, match="more than 64"):
        rewrite_schema(schema)


def test_unique_items_with_no_room_keeps_only_the_empty_array():
    rewritten = rewrite_schema({"type": "array", "items": {"enum": list(range(500))}, "maxItems": 0,
                                "uniqueItems": True}).schema
    assert "uniqueItems" not in json.dumps(rewritten)


def test_literal_pattern_reader():
    assert literal_alternatives("^(ab|c)$") == {"ab", "c"}
    assert literal_alternatives("^a\\.b$") == {"a.b"}
    assert literal_alternatives("^a+$") is None
    assert literal_alternatives("ab") is None
