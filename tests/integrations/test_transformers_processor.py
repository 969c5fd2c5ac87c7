"""The LogitsProcessor inside transformers' own generate, with the real SmolLM2: every row valid."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field

import cdsl_struct as cs
from cdsl_struct.integrations.transformers_processor import (
    ConstraintLogitsProcessor,
    ConstraintStoppingCriteria,
    constrained,
    finish_reasons,
)


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, so the object can end

    name: str = Field(max_length=12)
    country: str = Field(max_length=12)


PROMPTS = ["Name a big city in France as JSON.", "How many legs does a spider have?", "Is the sky blue? yes or no"]
MAX_NEW = 40


@pytest.fixture(scope="module")
def lm(smollm2, one_torch_thread):
    smollm2.tokenizer.padding_side = "left"
    return smollm2


@pytest.fixture(scope="module")
def constraints(lm):
    tok = lm.tokenizer
    return [cs.compile(City, tok), cs.compile(cs.Regex(r"[0-9]{1,2}"), tok), cs.compile(cs.Choice(["yes", "no"]), tok)]


def encode(lm, prompts):
    texts = [lm.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                              add_generation_prompt=True) for p in prompts]
    return lm.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def assert_valid(compiled: cs.CompiledConstraint, generated: list[int]) -> None:
    """The row must be a complete output ending in EOS (then only padding), checked by a fresh state."""
    eos = compiled.vocabulary.eos_token_ids
    end = next(i for i, t in enumerate(generated) if t in eos)  # StopIteration: the row never finished
    state = compiled.new_state()
    state.advance(generated[: end + 1])
    assert state.finished


def rows_valid(lm, out, inputs, constraints, per_row: int) -> list[str]:
    texts = []
    for i, seq in enumerate(out[:, inputs["input_ids"].shape[1]:].tolist()):
        compiled = constraints[i // per_row]
        assert_valid(compiled, seq)
        eos = compiled.vocabulary.eos_token_ids
        body = seq[: next(j for j, t in enumerate(seq) if t in eos)]
        texts.append(lm.tokenizer.decode(body))
    return texts


def check_values(texts: list[str], per_row: int) -> None:
    for i, text in enumerate(texts):
        kind = i // per_row
        if kind == 0:
            City.model_validate(json.loads(text))
        elif kind == 1:
            assert text.isdigit() and len(text) <= 2
        else:
            assert text in ("yes", "no")


def test_greedy_batch_one_constraint_per_row(lm, constraints):
    inputs = encode(lm, PROMPTS)
    kwargs = constrained(constraints)
    out = lm.model.generate(**inputs, **kwargs, max_new_tokens=MAX_NEW, do_sample=False,
                            pad_token_id=lm.tokenizer.pad_token_id)
    check_values(rows_valid(lm, out, inputs, constraints, 1), 1)
    assert finish_reasons(kwargs, out, lm.tokenizer.pad_token_id) == ["stop"] * 3
    short = lm.model.generate(**inputs, **kwargs, max_new_tokens=2, do_sample=False,
                              pad_token_id=lm.tokenizer.pad_token_id)
    assert finish_reasons(kwargs, short, lm.tokenizer.pad_token_id)[0] == "length"  # '{"' is not a City yet


def test_a_row_its_constraint_rejects_gets_no_eos_and_is_reported_invalid(lm, constraints):
    """A dead row (beam search keeps -inf beams; an engine dead end) must not look finished."""
    digits = constraints[1]
    processor = ConstraintLogitsProcessor(digits)
    prompt = torch.tensor([[1, 2, 3]])
    vocab = lm.model.config.vocab_size
    processor(prompt, torch.zeros(1, vocab))
    letter = lm.tokenizer.encode("x", add_special_tokens=False)[0]  # not a digit: forbidden
    dead = torch.tensor([[1, 2, 3, letter]])
    scores = processor(dead, torch.zeros(1, vocab))
    assert torch.isfinite(scores).all()  # not narrowed to EOS: nothing makes the row look complete
    stop = ConstraintStoppingCriteria(processor)
    assert stop(torch.tensor([[1, 2, 3, letter, 7]]), scores).tolist() == [True]
    assert processor.finish_reasons(torch.tensor([[1, 2, 3, letter, 7]])) == ["invalid"]
    digit = lm.tokenizer.encode("4", add_special_tokens=False)[0]
    eos = digits.vocabulary.eos_token_id
    assert processor.finish_reasons(torch.tensor([[1, 2, 3, digit, eos]])) == ["stop"]


def test_greedy_matches_our_own_decoder(lm, constraints):
    """model.generate under the processor and cdsl_struct's target decoder agree token for token."""
    inputs = encode(lm, PROMPTS[:1])
    out = lm.model.generate(**inputs, **constrained(constraints[0]), max_new_tokens=MAX_NEW, do_sample=False,
                            pad_token_id=lm.tokenizer.pad_token_id)
    ours = cs.generate(PROMPTS[0], schema=City, max_tokens=MAX_NEW, method="target", model="smollm2")
    text = lm.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text == ours.text


def test_sampling_with_several_sequences_per_row(lm, constraints):
    inputs = encode(lm, PROMPTS)
    torch.manual_seed(3)
    out = lm.model.generate(**inputs, **constrained(constraints), max_new_tokens=MAX_NEW, do_sample=True,
                            temperature=1.0, top_k=0, num_return_sequences=2,
                            pad_token_id=lm.tokenizer.pad_token_id)
    check_values(rows_valid(lm, out, inputs, constraints, 2), 2)


def test_beam_search_states_follow_reordered_beams(lm, constraints):
    inputs = encode(lm, PROMPTS[:2])
    kwargs = constrained(constraints[:2])
    processor: ConstraintLogitsProcessor = kwargs["logits_processor"][0]
    out = lm.model.generate(**inputs, **kwargs, max_new_tokens=MAX_NEW, num_beams=3, num_return_sequences=3,
                            do_sample=False, early_stopping=True, pad_token_id=lm.tokenizer.pad_token_id)
    texts = rows_valid(lm, out, inputs, constraints[:2], 3)
    check_values(texts, 3)
    assert processor._expand == 3
    assert len(set(texts[:3])) > 1  # the returned beams really are different sequences


def test_bad_arguments_are_typed_errors(lm, constraints):
    with pytest.raises(TypeError):
        ConstraintLogitsProcessor(["not compiled"])
    inputs = encode(lm, PROMPTS[:2])
    with pytest.raises(ValueError, match="one per input row"):
        lm.model.generate(**inputs, **constrained(constraints), max_new_tokens=2,
                          pad_token_id=lm.tokenizer.pad_token_id)


class Person(BaseModel):
    name: str
    age: int
    city: str


def test_a_string_the_model_leaves_open_is_ended_as_in_our_decoder(lm):
    prompt = "Ada Lovelace was 36 and lived in London. Extract the person."
    compiled = cs.compile(Person, lm.tokenizer)
    inputs = encode(lm, [prompt])
    texts = {}
    for guard in (False, True):
        kwargs = constrained(compiled, string_guard=guard)
        out = lm.model.generate(**inputs, **kwargs, max_new_tokens=40, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id)
        texts[guard] = lm.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        assert len(kwargs["logits_processor"][0]._scans[0] or {}) <= 1  # only the last step's rows are kept
    assert '"London }' in texts[False]  # swallowed without the guard, to max_new_tokens
    assert texts[True].endswith('"London" }') and Person.model_validate_json(texts[True]).city == "London"
    ours = cs.Generator(lm, draft=None, loop_guard=False).generate(prompt, schema=Person, max_tokens=40)
    assert texts[True] == ours.text  # the same guard as the engine's


def test_a_number_the_model_runs_on_with_is_ended_as_in_our_decoder(lm):
    from pydantic import BaseModel

    from cdsl_struct.decoding.strings import MAX_NUMBER_DIGITS

    class City(BaseModel):
        name: str
        country: str
        population: int

    prompt = "Tell me about Paris as JSON."
    inputs = encode(lm, [prompt])
    out = lm.model.generate(**inputs, **constrained(cs.compile(City, lm.tokenizer)), max_new_tokens=60,
                            do_sample=False, pad_token_id=lm.tokenizer.pad_token_id)
    text = lm.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert len(str(City.model_validate_json(text).population)) == MAX_NUMBER_DIGITS
    ours = cs.Generator(lm, draft=None, loop_guard=False).generate(prompt, schema=City, max_tokens=60)
    assert text == ours.text


def test_a_list_of_records_the_model_loops_in_ends_as_in_our_decoder(lm):
    """``{"name": "Uranus", ...}, {"name": "Neptune", ...}, {"name": "Pluto", ...}, {"name": "Uranus", ...`` to
    ``max_new_tokens`` without the guard; with it the array ends at the second repeat, as in our decoder."""
    planet = {"type": "object", "properties": {"name": {"type": "string"}, "moons": {"type": "integer"}},
              "required": ["name", "moons"]}
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": planet}}, "required": ["items"]}
    prompt = "Give me the planets of the solar system as JSON."
    inputs = encode(lm, [prompt])
    out = lm.model.generate(**inputs, **constrained(cs.compile(cs.JsonSchema(schema), lm.tokenizer)),
                            max_new_tokens=200, do_sample=False, pad_token_id=lm.tokenizer.pad_token_id)
    text = lm.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    names = [item["name"] for item in json.loads(text)["items"]]
    assert len(names) - len(set(names)) == 2, text
    ours = cs.Generator(lm, draft=None, loop_guard=False).generate(prompt, schema=schema, max_tokens=200)
    assert text == ours.text


def test_each_beams_string_scan_is_its_own_tokens(lm):
    """Rows that share a parent (beams), in two groups with the same tokens: every row's scan equals a
    scan fed its own tokens from the start, however the rows branch from step to step."""
    from cdsl_struct.decoding.strings import feed_token, new_scan

    compiled = cs.compile(Person, lm.tokenizer)
    processor = ConstraintLogitsProcessor([compiled, compiled])
    vocab = compiled.vocabulary
    start = vocab.encode('{"name": "Ad')
    prompt = torch.zeros(4, 3, dtype=torch.long)
    steps = [[start[:1]] * 4, [start[:2]] * 4, [start[:3], start[:2] + [9], start[:3], start[:3]],
             [start[:4], start[:3] + [7], start[:4], start[:3] + [7]]]
    for rows in steps:
        ids = torch.cat([prompt, torch.tensor(rows)], dim=1)
        processor(ids, torch.zeros(4, compiled.vocab_size))
        for group, scans in enumerate(processor._scans):
            for key, scan in scans.items():
                fresh = new_scan(compiled.spec)
                for token in key:
                    feed_token(fresh, vocab, token)
                assert (scan.containers, scan.in_string, scan.key, scan.inner) == \
                    (fresh.containers, fresh.in_string, fresh.key, fresh.inner), (group, key)
        assert len({id(scan) for scans in processor._scans for scan in scans.values()}) == \
            sum(len(scans) for scans in processor._scans)  # no two rows share a scan
