"""The request side of the vLLM integration (no vLLM needed): the ``extra_args`` that carry a
constraint, read back into the spec ``compile`` takes, and refused when malformed."""

import json

import pytest
from pydantic import BaseModel

from cdsl_struct.constraints import Choice, Grammar, JsonSchema, Regex
from cdsl_struct.errors import GrammarSyntaxError, InvalidSchema
from cdsl_struct.integrations.vllm import compile_request, constraint_args, spec_from_args
from cdsl_struct.options import ConflictingConstraints


class Person(BaseModel):
    name: str
    age: int


def test_each_constraint_round_trips_through_plain_extra_args():
    args = constraint_args(schema=Person, whitespace="compact")
    assert isinstance(args["cdsl_schema"], str)  # vllm_xargs holds strings, numbers and lists only
    spec, options = spec_from_args(json.loads(json.dumps(args)))
    assert isinstance(spec, JsonSchema) and spec.schema["required"] == ["name", "age"]
    assert options == {"whitespace": "compact"}
    assert isinstance(spec_from_args(constraint_args(regex="[0-9]+"))[0], Regex)
    assert isinstance(spec_from_args(constraint_args(grammar='start: "a"+'))[0], Grammar)
    assert isinstance(spec_from_args(constraint_args(choices=["yes", "no"]))[0], Choice)
    assert spec_from_args(None) is None and spec_from_args({"other_processor_arg": 1}) is None


def test_bad_arguments_are_refused_with_typed_errors():
    with pytest.raises(ConflictingConstraints):
        constraint_args(regex="a", choices=["a"])
    with pytest.raises(ConflictingConstraints):
        spec_from_args({"cdsl_regex": "a", "cdsl_schema": "{}"})
    with pytest.raises(ValueError, match="unknown constraint argument 'cdsl_shema'"):
        spec_from_args({"cdsl_shema": "{}"})
    with pytest.raises(InvalidSchema):
        spec_from_args({"cdsl_schema": "{not json"})
    with pytest.raises(GrammarSyntaxError):
        spec_from_args({"cdsl_grammar": "start: ("})


def test_a_request_compiles_for_the_served_tokenizer():
    compiled = compile_request(constraint_args(choices=["yes", "no"]), "smollm2")
    state = compiled.new_state()
    assert state.vocabulary.eos_token_ids and not state.is_complete()
    assert compile_request({"temperature_hint": 1}, "smollm2") is None


def test_the_loop_guard_option_round_trips_and_is_checked():
    assert constraint_args(regex="a+", loop_guard=False) == {"cdsl_regex": "a+", "cdsl_loop_guard": 0}
    spec, options = spec_from_args({"cdsl_regex": "a+", "cdsl_loop_guard": 1})
    assert isinstance(spec, Regex) and options == {}  # a decoding option, not a compile option
    with pytest.raises(ValueError, match="cdsl_loop_guard must be 0 or 1"):
        spec_from_args({"cdsl_regex": "a+", "cdsl_loop_guard": "yes"})


def test_a_schema_is_closed_unless_extra_properties_is_asked_for():
    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    closed = compile_request(constraint_args(schema=open_schema), "smollm2").new_state()
    given = compile_request(constraint_args(schema=open_schema, extra_properties=True), "smollm2").new_state()
    extra = closed.vocabulary.encode('{"a": 1, "b"')
    assert closed.validate(extra) < len(extra)  # closed: no key but "a"
    assert given.validate(extra) == len(extra)  # as given: any other key too
    with pytest.raises(ValueError, match="cdsl_extra_properties must be 0 or 1"):
        spec_from_args({"cdsl_regex": "a+", "cdsl_extra_properties": 2})


@pytest.mark.parametrize("guard", [True, False])
def test_the_processor_steers_a_row_out_of_a_cycle_unless_asked_not_to(guard):
    """The processor's ``apply`` on its own (no vLLM engine): a row whose output repeats one block
    has the block's next token penalised before the mask, as in this library's engine."""
    import torch

    from cdsl_struct.constraints.mask import allocate_bitmask
    from cdsl_struct.integrations.vllm import CdslLogitsProcessor, vocabulary_for

    processor = CdslLogitsProcessor.__new__(CdslLogitsProcessor)  # what __init__ sets, without vLLM's config
    processor.tokenizer, processor.vocabulary = "smollm2", vocabulary_for("smollm2")
    processor.rows, processor.bitmask = {}, allocate_bitmask(processor.vocabulary.size, 2)
    a, b = (list(processor.vocabulary.token_bytes).index(piece) for piece in (b"ab", b"cd"))
    output = [a, b] * 5  # "abcd" five times: a cycle whose next token is `a`
    processor.rows[0] = processor._new_row(constraint_args(regex="[a-d]*", loop_guard=guard), output)
    logits = torch.zeros(1, processor.vocabulary.size)
    logits[0, a], logits[0, b] = 5.0, 4.0
    chosen = int(processor.apply(logits)[0].argmax())
    assert (chosen == b) if guard else (chosen == a)


@pytest.mark.parametrize("strings", [True, False])
def test_the_processor_ends_a_string_the_model_leaves_open_unless_asked_not_to(strings):
    """As in this library's engine: after ``"city": "London`` the model's `` }`` goes to the quote."""
    import torch

    from cdsl_struct.constraints.mask import allocate_bitmask
    from cdsl_struct.integrations.vllm import CdslLogitsProcessor, vocabulary_for

    processor = CdslLogitsProcessor.__new__(CdslLogitsProcessor)
    processor.tokenizer, processor.vocabulary = "smollm2", vocabulary_for("smollm2")
    processor.rows, processor.bitmask = {}, allocate_bitmask(processor.vocabulary.size, 2)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    output = processor.vocabulary.encode('{"city": "London')
    processor.rows[0] = processor._new_row(constraint_args(schema=schema, string_guard=strings), output)
    brace, quote = (list(processor.vocabulary.token_bytes).index(piece) for piece in (b" }", b'"'))
    logits = torch.zeros(1, processor.vocabulary.size)
    logits[0, brace], logits[0, quote] = 5.0, 2.0
    chosen = int(processor.apply(logits)[0].argmax())
    assert chosen == (quote if strings else brace)
    assert constraint_args(regex="a+", string_guard=False) == {"cdsl_regex": "a+", "cdsl_string_guard": 0}
    with pytest.raises(ValueError, match="cdsl_string_guard must be 0 or 1"):
        spec_from_args({"cdsl_regex": "a+", "cdsl_string_guard": 3})


def test_check_output_passes_what_the_constraint_allows_and_raises_for_the_rest():
    """The caller's check of an output (here as an OpenAI-server choice carries it, with
    ``return_token_ids``): a row the processor had to end is an error, never a valid finish."""
    from cdsl_struct.errors import InvalidArgument, OutputInvalid, UnsatisfiableSchema
    from cdsl_struct.integrations.vllm import check_output, vocabulary_for

    args = constraint_args(choices=["yes", "no"])
    vocabulary = vocabulary_for("smollm2")
    yes = list(vocabulary.token_bytes).index(b"yes")
    eos = vocabulary.eos_token_ids[0]
    check_output({"token_ids": [yes, eos], "finish_reason": "stop"}, args, "smollm2")  # complete
    check_output({"token_ids": [], "finish_reason": "length"}, args, "smollm2")  # a prefix, cut by max_tokens
    check_output({"token_ids": [0, 0], "finish_reason": "stop"}, {"other_arg": 1}, "smollm2")  # no constraint
    with pytest.raises(OutputInvalid, match="refuses"):  # vLLM sampled outside the mask; the row was ended
        check_output({"token_ids": [yes, 0, eos], "finish_reason": "stop"}, args, "smollm2")
    with pytest.raises(OutputInvalid, match="before its constraint was complete"):  # ended early
        check_output({"token_ids": [eos], "finish_reason": "stop"}, args, "smollm2")
    with pytest.raises(UnsatisfiableSchema):  # it failed to compile in the engine too
        check_output({"token_ids": [eos], "finish_reason": "stop"},
                     {"cdsl_schema": '{"type": "integer", "minimum": 5, "maximum": 1}'}, "smollm2")
    with pytest.raises(InvalidArgument, match="return_token_ids"):
        check_output({"finish_reason": "stop"}, args, "smollm2")
