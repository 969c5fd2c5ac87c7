"""Structural tags: free text where a trigger starts a constrained tag. Exactness on real tokenizers
(texts that must be accepted and refused), typed errors for malformed tags, the vLLM and XGrammar
request shapes, reading segments back, and the embedded SmolLM2 writing tags whose JSON is valid."""

from __future__ import annotations

import jsonschema
import pytest

import cdsl_struct as cs
from cdsl_struct.constraints.structural_tag import StructuralTag, Tag, from_response_format
from cdsl_struct.errors import CompileError, InvalidSchema, InvalidStructuralTag

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                         "country": {"type": "string", "maxLength": 20}},
        "required": ["name", "country"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOKENIZERS = ("smollm2", "llama3", "qwen3", "gemma3")


def accepts(compiled, vocabulary, text: str) -> bool:
    """Whether ``text`` then EOS is a complete output of ``compiled``."""
    tokens = vocabulary.encode(text) + [vocabulary.eos_token_id]
    return compiled.new_state().validate(tokens) == len(tokens)


FUNCTIONS = StructuralTag([Tag("<function=weather>", WEATHER, "</function>"),
                           Tag("<function=digits>", cs.Regex(r"\d+"), "</function>")], ["<function="])
ACCEPTED = ["", "hello", "two\nlines", 'hi <function=weather>{"city": "Paris"}</function> bye',
            "<function=digits>123</function>", "text then <function", "a < b and function= c",
            'x <function=weather>{"city":"P"}</function><function=digits>7</function> end']
REFUSED = ["<function=digits>12a</function>", "a <function=other>x", '<function=weather>{"city": 3}</function>',
           '<function=weather>{"city": "P"}', '<function=weather>{"city": "P", "extra": 1}</function>',
           "<function=digits></function>", "<function=digits>1</function"]


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_free_text_with_tags_is_exact(vocab_of, tokenizer):
    vocabulary = vocab_of(tokenizer)
    compiled = cs.compile(FUNCTIONS, vocabulary)
    assert compiled.backend == "llguidance"
    for text in ACCEPTED:
        assert accepts(compiled, vocabulary, text), text
    for text in REFUSED:
        assert not accepts(compiled, vocabulary, text), text


@pytest.mark.parametrize("tokenizer", ("llama3", "qwen3"))
def test_at_least_one_and_stop_after_first(vocab_of, tokenizer):
    vocabulary = vocab_of(tokenizer)
    tags = [Tag("<a>", {"type": "integer"}, "</a>")]
    one = cs.compile(StructuralTag(tags, at_least_one=True, stop_after_first=True), vocabulary)
    assert accepts(one, vocabulary, "x <a>1</a>")
    assert not accepts(one, vocabulary, "plain text")
    assert not accepts(one, vocabulary, "x <a>1</a> more")
    several = cs.compile(StructuralTag(tags, at_least_one=True), vocabulary)
    assert accepts(several, vocabulary, "<a>1</a> and <a>2</a> done")
    assert not accepts(several, vocabulary, "none here")
    first = cs.compile(StructuralTag(tags, stop_after_first=True), vocabulary)
    assert accepts(first, vocabulary, "none here") and not accepts(first, vocabulary, "<a>1</a><a>2</a>")


def test_grammar_and_lazy_regex_contents(vocab_of):
    vocabulary = vocab_of("llama3")
    spec = StructuralTag([Tag("<math>", cs.Grammar('start: NUM ("+" NUM)*\nNUM: /[0-9]+/\n'), "</math>"),
                          Tag("<note>", cs.Regex(r"[\s\S]*"), "</note>")])
    compiled = cs.compile(spec, vocabulary)
    assert accepts(compiled, vocabulary, "sum <math>1+2</math> and <note>any <b> text</note>!")
    assert not accepts(compiled, vocabulary, "<math>1+</math>")
    assert not accepts(compiled, vocabulary, "<note>never closed")
    # the note ends at its first end string: what follows is free text again
    assert [s.text for s in spec.parse("<note>a</note> b</note>")] == ["a"]


def test_parse_reads_segments_back():
    text = 'hi <function=weather>{"city": "Paris"}</function> bye <function=digits>42</function>.'
    segments = FUNCTIONS.parse(text)
    assert [(s.index, s.value, s.start) for s in segments] == [(0, {"city": "Paris"}, 3), (1, "42", 54)]
    assert FUNCTIONS.parse("no tags") == []
    with pytest.raises(InvalidStructuralTag):
        FUNCTIONS.parse("<function=nope>")


def test_objects_are_closed_unless_asked(vocab_of):
    vocabulary = vocab_of("smollm2")
    open_ = cs.compile(FUNCTIONS, vocabulary, extra_properties=True)
    assert accepts(open_, vocabulary, '<function=weather>{"city": "P", "extra": 1}</function>')


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"tags": []}, InvalidStructuralTag, "non-empty list of tags"),
    ({"tags": [Tag("<a>", {}, "")], "triggers": []}, InvalidStructuralTag, "non-empty list"),
    ({"tags": [Tag("<a>", {}, "")], "triggers": [""]}, InvalidStructuralTag, "non-empty string"),
    ({"tags": [Tag("<a>", {}, "")], "triggers": ["<b"]}, InvalidStructuralTag, "does not start with any trigger"),
    ({"tags": [Tag("<a>", {}, "")], "triggers": ["<a", "<a>"]}, InvalidStructuralTag, "inside trigger"),
    ({"tags": [Tag("<a>", {}, "")], "triggers": ["<a", "<b"]}, InvalidStructuralTag, "starts no tag"),
    ({"tags": [{"begin": "<a>", "schema": {"type": "nope"}}]}, InvalidSchema, "invalid JSON Schema"),
    ({"tags": [{"begin": "<a>", "schema": {}, "regex": "x"}]}, InvalidStructuralTag, "exactly one of"),
    ({"tags": [{"begin": "<a>", "grammar": "start: \"x\"\n"}]}, InvalidStructuralTag, "non-empty end"),
    ({"tags": [{"begin": "", "schema": {}}]}, InvalidStructuralTag, "non-empty string"),
])
def test_malformed_tags_raise_typed_errors(kwargs, error, words):
    with pytest.raises(error, match=words) as caught:
        StructuralTag(**kwargs)
    assert isinstance(caught.value, CompileError) and isinstance(caught.value, cs.CdslError)


def test_vllm_shape():
    spec = from_response_format({"type": "structural_tag", "triggers": ["<function="], "structures": [
        {"begin": "<function=weather>", "schema": WEATHER, "end": "</function>"}]})
    assert spec.triggers == ("<function=",) and spec.tags[0].content.schema == WEATHER
    with pytest.raises(InvalidStructuralTag, match="triggers"):
        from_response_format({"structures": [{"begin": "<a>", "schema": {}, "end": ""}]})
    with pytest.raises(InvalidStructuralTag, match="does not start"):
        from_response_format({"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<b>"]})
    with pytest.raises(InvalidStructuralTag, match="structures"):
        from_response_format({"structures": [], "triggers": ["<a"]})


def test_xgrammar_shape(vocab_of):
    spec = from_response_format({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool"], "at_least_one": True, "stop_after_first": True,
        "tags": [{"type": "tag", "begin": "<tool=a>", "content": {"type": "json_schema", "json_schema": WEATHER},
                  "end": "</tool>"},
                 {"begin": "<tool=b>", "content": {"type": "const_string", "value": "ok."}, "end": ""},
                 {"begin": "<tool=c>", "content": {"type": "any_text"}, "end": "</tool>"},
                 {"begin": "<tool=d>", "content": {"type": "regex", "pattern": "[a-z]+"}, "end": "</tool>"}]}})
    assert spec.at_least_one and spec.stop_after_first and len(spec.tags) == 4
    vocabulary = vocab_of("qwen3")
    compiled = cs.compile(spec, vocabulary)
    assert accepts(compiled, vocabulary, "<tool=b>ok.")
    assert accepts(compiled, vocabulary, "so <tool=c>anything</tool>")
    assert not accepts(compiled, vocabulary, "<tool=b>no")
    for bad, words in [({"type": "tag", "begin": "x"}, "not supported"),
                       ({"type": "triggered_tags", "triggers": ["<a"], "tags": [
                           {"begin": "<a>", "content": {"type": "grammar", "grammar": "root ::= x"}}]},
                        "not supported"),
                       ({"type": "triggered_tags", "triggers": ["<a"], "tags": []}, "non-empty")]:
        with pytest.raises(InvalidStructuralTag, match=words):
            from_response_format({"type": "structural_tag", "format": bad})


def test_smollm2_writes_tags_whose_json_is_valid(smollm2, one_torch_thread):
    """Every finished output parses into tags, each tag's JSON valid under its schema."""
    from cdsl_struct.api import Generator

    generator = Generator(smollm2)
    spec = StructuralTag([Tag("<city>", CITY, "</city>")], ["<city>"], at_least_one=True, stop_after_first=True)
    shot = [{"role": "user", "content": "Which city is the capital of Italy?"},
            {"role": "assistant",
             "content": 'The capital of Italy is <city>{"name": "Rome", "country": "Italy"}</city>.'}]
    questions = ["Which city is the capital of Spain?", "Which city is the capital of France?",
                 "Which city is the capital of Japan?"]
    results = generator.generate_batch([[*shot, {"role": "user", "content": q}] for q in questions],
                                       grammar=spec, max_tokens=48)
    finished = [r for r in results if r.finish_reason == "stop"]
    assert finished, [r.text for r in results]
    for result in finished:
        assert result.complete and len(result.value) == 1
        jsonschema.validate(result.value[0].value, CITY)
        assert result.text.endswith("</city>")


def test_special_token_markers_as_the_token_or_spelled_out(vocab_of):
    """Qwen 3 writes ``<tool_call>`` as one special token, which a constraint allows only where named."""
    vocabulary = vocab_of("qwen3")
    spec = StructuralTag([Tag("<tool_call>", WEATHER, "</tool_call>")])
    compiled = cs.compile(spec, vocabulary)
    text = 'so <tool_call>{"city": "Oslo"}</tool_call> done'
    as_tokens = vocabulary.encode(text)
    assert len(as_tokens) < len(vocabulary.encode(text.replace("<", "< ")))  # the markers are one token each
    spelled = [t for char in text for t in vocabulary.encode(char)]
    for tokens in (as_tokens, spelled):
        tokens = [*tokens, vocabulary.eos_token_id]
        assert compiled.new_state().validate(tokens) == len(tokens)
    assert not accepts(compiled, vocabulary, "so <tool_call> plain")
