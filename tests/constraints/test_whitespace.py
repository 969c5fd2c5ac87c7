"""Named whitespace policies: the ``newlines`` layout is allowed, and bounded."""

from __future__ import annotations

import json

import pytest

from cdsl_struct.constraints import JsonSchema, WhitespacePolicy, compile
from cdsl_struct.constraints.whitespace import (
    DEFAULT_WHITESPACE,
    NAMED_POLICIES,
    NEWLINES_PATTERN,
    _check_bounded_whitespace,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_named_policies_parse_and_are_bounded():
    assert DEFAULT_WHITESPACE in NAMED_POLICIES
    assert WhitespacePolicy.parse("newlines").pattern == NEWLINES_PATTERN
    _check_bounded_whitespace(NEWLINES_PATTERN)  # would raise CompileError if unbounded


@pytest.mark.parametrize("backend", ["llguidance", "outlines-core"])
def test_newlines_allows_indented_json_but_not_runs(vocab_of, backend):
    vocab = vocab_of("gpt2")
    compiled = compile(JsonSchema(PERSON), vocab, backend=backend, whitespace="newlines")
    value = {"name": "Ada", "age": 36}

    def accepted(text: str) -> bool:
        tokens = vocab.encode(text)
        return compiled.new_state().validate([*tokens, vocab.eos_token_id]) == len(tokens) + 1

    assert accepted(json.dumps(value, indent=2))
    assert accepted(json.dumps(value))
    assert accepted(json.dumps(value, separators=(",", ":")))
    assert not accepted(json.dumps(value, indent=12))  # indent beyond the bound of 8
    assert not accepted('{"name": "Ada",\n\n"age": 36}')  # one newline per slot
