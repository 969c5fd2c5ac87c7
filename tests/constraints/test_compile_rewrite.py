"""compile(backend="auto") rewrites what llguidance refuses, exactly, and says so; explicit
engines compile schemas as given; the dev data's own test instances judge rewrites alike."""

import json

import pytest

from benchmarks.fuzz_rewrite import compare, validator
from cdsl_struct import UnsupportedFeature, compile
from cdsl_struct.bench.maskbench import load_cases, split_of
from cdsl_struct.constraints import allocate_bitmask, is_allowed
from cdsl_struct.constraints.schema_rewrite import rewrite_schema
from cdsl_struct.errors import CompileError
from tests.conftest import MASKBENCH_DIR

ORDER = {
    "type": "object",
    "properties": {
        "kind": {"oneOf": [{"type": "string", "not": {"enum": ["draft", ""]}}, {"type": "null"}]},
        "qty": {"type": "integer", "not": {"minimum": 100}},
        "note": {"type": "string", "format": "free-text"},
    },
    "required": ["kind", "qty"],
    "additionalProperties": False,
    "if": {"properties": {"kind": {"const": "gift"}}, "required": ["kind"]},
    "then": {"required": ["note"]},
}


def accepts(compiled, text):
    state, row = compiled.new_state(), allocate_bitmask(compiled.vocabulary.size)
    for token in compiled.vocabulary.encode(text):
        state.fill_mask(row)
        if not is_allowed(row, token):
            return False
        state.advance(token)
    return state.is_complete()


def test_auto_compiles_the_rewrite_and_its_masks_follow_the_original(vocab_of):
    compiled = compile(ORDER, vocab_of("llama3"), timeout=None, cache=False, whitespace="compact")
    assert compiled.backend == "llguidance"
    assert {"not", "oneOf->anyOf", "if-then-else", "format-annotation"} <= set(compiled.rewrites)
    assert compiled.skipped and compiled.skipped[0][0] == "llguidance"
    assert compiled.spec.schema == ORDER  # results are validated against the user's schema
    check = validator(ORDER)
    texts = ['{"kind":"sale","qty":3}', '{"kind":null,"qty":99}', '{"kind":"gift","qty":1,"note":"hi"}',
             '{"kind":"draft","qty":3}', '{"kind":"","qty":3}', '{"kind":"sale","qty":100}',
             '{"kind":"gift","qty":1}', '{"kind":"sale","qty":3.5}', '{"qty":3}', '{"kind":"sale","qty":3,"x":1}']
    verdicts = [accepts(compiled, t) for t in texts]
    assert verdicts == [check.is_valid(json.loads(t)) for t in texts]
    assert verdicts.count(True) == 3


def test_explicit_engine_does_not_rewrite(vocab_of):
    with pytest.raises(UnsupportedFeature) as info:
        compile(ORDER, vocab_of("llama3"), backend="llguidance", timeout=None, cache=False)
    assert not any(name == "rewrite" for name, _ in getattr(info.value, "attempts", []))


def test_schema_the_engine_takes_is_not_rewritten(vocab_of):
    compiled = compile({"type": "object", "properties": {"a": {"type": "string"}}}, vocab_of("llama3"),
                       timeout=None, cache=False)
    assert compiled.rewrites == () and compiled.skipped == []


def test_refused_rewrite_is_one_more_named_attempt(vocab_of):
    with pytest.raises(CompileError) as info:
        compile({"type": "integer", "not": {"multipleOf": 3}}, vocab_of("llama3"), timeout=5, cache=False)
    attempts = dict(info.value.attempts)
    assert "rewrite" in attempts and "multipleOf" in attempts["rewrite"]


needs_data = pytest.mark.skipif(not MASKBENCH_DIR.is_dir(), reason=f"MaskBench data absent at {MASKBENCH_DIR}")


@pytest.fixture(scope="module")
def rewritten_dev_cases():
    """Dev cases of the tune split whose schema the rewriter changes, in a fixed order."""
    picked = []
    for case in load_cases(MASKBENCH_DIR, limit=900, seed=14):
        if split_of(case["id"]) != "tune":
            continue
        try:
            rewrite = rewrite_schema(case["schema"])
        except CompileError:
            continue
        if rewrite.rules:
            picked.append((case, rewrite))
    return picked


@needs_data
def test_dev_test_instances_get_the_same_verdicts(rewritten_dev_cases):
    assert len(rewritten_dev_cases) >= 30
    checked = 0
    for case, rewrite in rewritten_dev_cases:
        original, rewritten = validator(case["schema"]), validator(rewrite.schema, rewrite_of=case["schema"])
        for test in case["tests"]:
            assert original.is_valid(test["data"]) == rewritten.is_valid(test["data"]), (case["id"], test)
            checked += 1
    assert checked >= 150


@needs_data
def test_dev_schemas_survive_fuzzing(rewritten_dev_cases):
    for case, rewrite in rewritten_dev_cases[:4]:
        stats = compare(case["schema"], rewrite.schema, examples=20)
        assert stats["mismatches"] == [], (case["id"], rewrite.rules, stats["mismatches"][:2])
