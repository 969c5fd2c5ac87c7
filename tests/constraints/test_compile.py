"""compile() on real tokenizers: every spec type, both engines, errors, caching, fallback."""

import json
import threading
import time

import lark
import numpy as np
import pytest

from cdsl_struct import (
    Choice,
    CompileError,
    CompileTimeout,
    Grammar,
    JsonSchema,
    Regex,
    UnsatisfiableSchema,
    UnsupportedFeature,
    compile,
)
from cdsl_struct.constraints import allocate_bitmask, allowed_tokens, is_allowed
from cdsl_struct.constraints.backends import base as backends_base

TOKENIZERS = ("gpt2", "smollm2", "llama3", "gemma3", "qwen3")
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
# (spec, valid outputs, invalid outputs, backends able to compile it)
CASES = [
    (JsonSchema(PERSON), ['{"name":"Ann","age":31}', '{"name":"Bé","age":-2,"tags":["a","b"]}'],
     ['{"name":"Ann"}', '{"name":"Ann","age":3.5}', '{"name":"Ann","age":1,"x":1}', '{"name": "Ann","age":1}'],
     ("llguidance", "outlines-core")),
    (Regex(r"\d{4}-\d{2}-\d{2}"), ["2024-01-31"], ["2024-1-31", "2024-01-311"], ("llguidance", "outlines-core")),
    (Choice(["yes", "no", "maybe later"]), ["yes", "maybe later"], ["ye", "yes!", "Maybe later"],
     ("llguidance", "outlines-core")),
    (Grammar("arithmetic"), ["1 + 2 * (3 - 4)", "-(2.5)/7"], ["1 +", "(1", "1 ++ 2"], ("llguidance",)),
]


def run_text(compiled, text):
    """Walk ``text``'s tokens through the masks; (all allowed, complete at end)."""
    vocab = compiled.vocabulary
    state = compiled.new_state()
    row = allocate_bitmask(vocab.size)
    for token in vocab.encode(text):
        state.fill_mask(row)
        if not is_allowed(row, token):
            return False, False
        state.advance(token)
    state.fill_mask(row)
    complete = state.is_complete()
    assert is_allowed(row, vocab.eos_token_id) == complete
    allowed = set(allowed_tokens(row, vocab.size))
    assert not (allowed & vocab.special_ids) - set(vocab.eos_token_ids)
    return True, complete


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("backend", ["llguidance", "outlines-core"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_spec_accepts_valid_and_rejects_invalid(vocab_of, tokenizer, backend, case):
    spec, valid, invalid, engines = CASES[case]
    if backend not in engines:
        with pytest.raises(UnsupportedFeature):
            compile(spec, vocab_of(tokenizer), backend=backend, whitespace="compact")
        return
    compiled = compile(spec, vocab_of(tokenizer), backend=backend, whitespace="compact")
    assert compiled.backend == backend
    for text in valid:
        assert run_text(compiled, text) == (True, True), text
    for text in invalid:
        assert run_text(compiled, text) != (True, True), text


@pytest.mark.parametrize("backend", ["llguidance", "outlines-core"])
def test_flexible_whitespace_is_bounded(vocab_of, backend):
    compiled = compile(JsonSchema(PERSON), vocab_of("llama3"), backend=backend, whitespace="flexible")
    assert run_text(compiled, json.dumps({"name": "A", "age": 1})) == (True, True)
    assert run_text(compiled, '{"name":"A", "age":1}') == (True, True)
    assert run_text(compiled, '{"name":"A",  "age":1}') != (True, True)
    assert run_text(compiled, '{"name":"A",\n"age":1}') != (True, True)


def test_spaced_whitespace_is_exactly_json_dumps(vocab_of):
    compiled = compile(JsonSchema(PERSON), vocab_of("llama3"), whitespace="spaced")
    assert run_text(compiled, json.dumps({"name": "A", "age": 1, "tags": ["a"]})) == (True, True)
    assert run_text(compiled, '{"name":"A","age":1}') != (True, True)
    with pytest.raises(UnsupportedFeature, match="whitespace"):
        compile(JsonSchema(PERSON), vocab_of("llama3"), backend="outlines-core", whitespace="spaced")


def test_compile_by_tokenizer_name_and_cache():
    first = compile(Regex("[ab]+"), "gpt2")
    assert compile(Regex("[ab]+"), "gpt2") is first
    assert compile(Regex("[ab]+"), "gpt2", backend="outlines-core") is not first


def test_concurrent_compiles_share_one_result(vocab_of):
    spec = JsonSchema({"type": "array", "items": {"type": "integer"}, "minItems": 2})
    results = []
    threads = [threading.Thread(target=lambda: results.append(compile(spec, vocab_of("llama3"))))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_engine_refusals_are_typed(vocab_of):
    vocab = vocab_of("llama3")
    with pytest.raises(UnsatisfiableSchema):
        compile(JsonSchema({"allOf": [{"type": "string"}, {"type": "integer"}]}), vocab, backend="llguidance")
    with pytest.raises(UnsupportedFeature) as info:
        compile(JsonSchema({"type": "string", "format": "x-custom"}), vocab, backend="llguidance")
    assert info.value.feature == "x-custom"
    with pytest.raises(UnsupportedFeature) as info:
        compile(JsonSchema({"type": "array", "uniqueItems": True}), vocab, backend="auto")
    assert info.value.attempts[0][0] == "llguidance" and len(info.value.attempts) == 2


def test_auto_falls_back_on_timeout(vocab_of, monkeypatch):
    real = backends_base.get_backend

    class Slow:
        name = "llguidance"
        enforces_timeout = False

        def compile(self, *args):
            threading.Event().wait(10)
            raise AssertionError("should have timed out")

    monkeypatch.setattr(
        "cdsl_struct.constraints.compiler.get_backend",
        lambda name: Slow() if name == "llguidance" else real(name),
    )
    start = time.monotonic()
    compiled = compile(Regex("fallback[0-9]"), vocab_of("gpt2"), timeout=4.0)
    assert time.monotonic() - start < 4.0  # one budget for both engines; the first had half
    assert compiled.backend == "outlines-core"
    assert compiled.skipped[0][0] == "llguidance" and "longer than" in compiled.skipped[0][1]
    with pytest.raises(CompileTimeout):
        compile(Regex("fallback[0-9]x"), vocab_of("gpt2"), backend="llguidance", timeout=0.2)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        compile(Regex("a"), "gpt2", backend="xgrammar")


def test_engine_exception_becomes_compile_error(vocab_of):
    with pytest.raises(CompileError):
        compile(Regex("[z-a]"), vocab_of("gpt2"))


@pytest.mark.parametrize("name", ["json", "arithmetic", "sql_select", "function_call"])
def test_random_walks_through_shipped_grammars_parse_with_lark(vocab_of, name):
    import random

    spec = Grammar(name)
    vocab = vocab_of("gpt2")
    compiled = compile(spec, vocab)
    parser = spec.parser()
    # short tokens holding separators, favoured so that random identifiers and strings end; numpy
    # arrays because a walk step over a vocabulary of 50k allowed ids in Python lists took ~10 ms
    breaking = np.zeros(vocab.size, dtype=bool)
    breaking[:len(vocab.token_bytes)] = [len(b) <= 2 and any(c in b for c in b" ,;)'\"]}") for b in vocab.token_bytes]
    eos = vocab.eos_token_id
    finished = 0
    for seed in range(12):
        rng = random.Random(seed)
        state, row, tokens = compiled.new_state(), allocate_bitmask(vocab.size), []
        for step in range(150):
            state.fill_mask(row)
            allowed = np.asarray(allowed_tokens(row, vocab.size))
            if bool((allowed == eos).any()) and (step > 8 or len(allowed) == 1):
                state.advance(eos)
                break
            choices = allowed[allowed != eos]
            preferred = choices[breaking[choices]]
            token = int(rng.choice(preferred if len(preferred) and rng.random() < 0.6 else choices))
            state.advance(token)
            tokens.append(token)
        if state.finished:
            finished += 1
            parser.parse(vocab.decode(tokens).decode("utf-8"))  # raises if the engine let junk through
    assert finished >= 4


def test_finished_outputs_parse_with_one_shared_parser_per_grammar():
    from cdsl_struct.constraints.specs import _shared_parser

    spec = Grammar("arithmetic")
    text = "1+2*3"
    tree = spec.parse(text)
    assert tree == spec.parser().parse(text)
    built = _shared_parser.cache_info().misses
    assert Grammar("arithmetic").parse("(4-5)/6").data == "start"  # another spec, same text: no rebuild
    assert _shared_parser.cache_info().misses == built
    with pytest.raises(lark.exceptions.LarkError):
        spec.parse("1+")


# --- regex class escapes: \d, \w mean what a JSON Schema pattern makes them mean (ASCII) ---------

# segmented digit 8 (U+1FBF8), Arabic-Indic 3, Devanagari 0, fullwidth 2
NON_ASCII_DIGITS = ("\U0001fbf8", "\u0663", "\u0966", "\uff12")


def first_mask(compiled, prefix=""):
    """The byte strings of the tokens allowed after ``prefix``."""
    vocab = compiled.vocabulary
    state, row = compiled.new_state(), allocate_bitmask(vocab.size)
    for token in vocab.encode(prefix) if prefix else []:
        state.advance(token)
    state.fill_mask(row)
    return {vocab.token_bytes[t] for t in allowed_tokens(row, vocab.size) if t not in vocab.eos_token_ids}


@pytest.mark.parametrize("backend", ["llguidance", "outlines-core"])
def test_regex_digit_class_is_ascii_unless_unicode(vocab_of, backend):
    vocab = vocab_of("smollm2")
    ascii_digits = compile(Regex(r"\d"), vocab, backend=backend, cache=False)
    allowed = first_mask(ascii_digits)
    assert b"2" in allowed
    assert allowed == {str(d).encode() for d in range(10)}  # no byte >= 0x80: no start of U+1FBF8, U+0663...
    assert allowed == first_mask(compile(Regex("[0-9]"), vocab, backend=backend, cache=False))
    unicode_digits = compile(Regex(r"\d", unicode=True), vocab, backend=backend, cache=False)
    assert any(byte >= 0x80 for token in first_mask(unicode_digits) for byte in token)
    for digit in NON_ASCII_DIGITS:
        assert run_text(ascii_digits, digit) == (False, False), digit
        assert run_text(unicode_digits, digit) == (True, True), digit
    date = compile(Regex(r"\d{4}-\d{2}-\d{2}"), vocab, backend=backend, cache=False)
    assert run_text(date, "2024-01-31") == (True, True)
    assert run_text(date, "\U0001fbf8\U0001fbf8\U0001fbf82-20-20")[0] is False  # the README's example output


@pytest.mark.parametrize("backend", ["llguidance", "outlines-core"])
@pytest.mark.parametrize(("pattern", "inside", "outside"), [
    (r"[\d_]+", ["1_2", "__"], ["\u0663", "a"]),
    (r"\w+", ["abc_1", "Z9"], ["\u00e9", "\u0663", "\u4e2d"]),
    (r"\D", ["a", "\u0663", "\u00e9"], ["2"]),
    (r"\W", ["!", "\u00e9", "\u0663"], ["a", "_", "7"]),
    (r"[^\w\s]", ["!", "\u00e9"], ["a", " ", "1"]),
    (r"\s", [" ", "\t", "\u00a0", "\u3000"], ["a", "_"]),  # \s keeps Unicode whitespace, as in JSON Schema
])
def test_regex_classes_inside_and_outside(vocab_of, backend, pattern, inside, outside):
    compiled = compile(Regex(pattern), vocab_of("smollm2"), backend=backend, cache=False)
    for text in inside:
        assert run_text(compiled, text) == (True, True), text
    for text in outside:
        assert run_text(compiled, text) != (True, True), text


@pytest.mark.parametrize("escape", ["d", "w", "D", "W"])
def test_regex_classes_match_the_json_schema_pattern_path(vocab_of, escape):
    """Inside a JSON string (after its opening quote) a schema's ``pattern`` admits the same tokens as
    the regex, once the string's closing quote is cut off a token and the characters JSON spells
    otherwise (quote, backslash, controls and DEL, which llguidance escapes) are left out."""
    def plain(tokens):
        return {t for t in tokens if t and not any(b in b'"\\\x7f' or b < 0x20 for b in t)}

    vocab = vocab_of("smollm2")
    regex = first_mask(compile(Regex(f"\\{escape}"), vocab, backend="llguidance", cache=False))
    schema = JsonSchema({"type": "string", "pattern": f"^\\{escape}$"})
    in_json = first_mask(compile(schema, vocab, backend="llguidance", whitespace="compact", cache=False), '"')
    assert plain(t.removesuffix(b'"') for t in in_json) == plain(regex)


def test_regex_unicode_flag_is_part_of_the_cache_key(vocab_of):
    vocab = vocab_of("smollm2")
    ascii_digits = compile(Regex(r"\d"), vocab)
    unicode_digits = compile(Regex(r"\d", unicode=True), vocab)
    assert ascii_digits is not unicode_digits
    assert compile(Regex(r"\d"), vocab) is ascii_digits and compile(Regex(r"\d", unicode=True), vocab) is unicode_digits
    assert unicode_digits.spec.unicode and not ascii_digits.spec.unicode
    assert run_text(unicode_digits, "\u0663") == (True, True) and run_text(ascii_digits, "\u0663") == (False, False)
