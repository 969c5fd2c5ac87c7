"""``reasoning=`` end to end on the embedded SmolLM2: the thought stays within its budget, the
answer after it is valid under the constraint, speculation stays lossless across the close
marker, streams split thinking from answer, and keywords score the answer only."""

from __future__ import annotations

import jsonschema
import pytest

from cdsl_struct.api import Generator
from cdsl_struct.constraints.reasoning import Reasoning
from cdsl_struct.errors import InvalidArgument
from cdsl_struct.streaming import Thought

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
THINK = Reasoning(budget=12, required=True)  # SmolLM2 was not trained to think: open the markers for it


@pytest.fixture(scope="module")
def gen(smollm2, one_torch_thread):
    return Generator(smollm2)


def _thought_tokens(gen, result):
    """How many tokens the output spent after its open marker up to the end of the close marker."""
    tokens, vocab = result.tokens, gen.vocabulary
    opened = len(vocab.encode("<think>"))
    text = ""
    for i, token in enumerate(tokens):
        text += vocab.token_bytes[token].decode(errors="replace")
        if text.endswith("</think>"):
            return i + 1 - opened
    raise AssertionError("the thought never closed")


@pytest.mark.parametrize("budget", [0, 5, 12])
def test_the_answer_after_a_budgeted_thought_is_valid(gen, budget):
    result = gen.generate("Tom Baker is 52. Give him as JSON.", schema=PERSON, max_tokens=80, temperature=0,
                          reasoning=Reasoning(budget=budget, required=True))
    assert result.complete and result.finish_reason == "stop"
    jsonschema.validate(result.value, PERSON)
    assert result.reasoning is not None and "<think>" not in result.text
    assert _thought_tokens(gen, result) <= budget + len(gen.vocabulary.encode("</think>"))
    assert result.text.startswith("{")


def test_without_required_the_model_may_answer_at_once(gen):
    result = gen.generate("Tom Baker is 52. Give him as JSON.", schema=PERSON, max_tokens=60, temperature=0,
                          reasoning=True)
    assert result.complete
    jsonschema.validate(result.value, PERSON)
    assert result.reasoning is None or isinstance(result.reasoning, str)


def test_speculation_is_lossless_across_the_close_marker(gen):
    asked = dict(max_tokens=60, temperature=0, reasoning=THINK)
    target = gen.generate("Name three colors.", method="target", **asked)
    speculative = gen.generate("Name three colors.", method="speculative", **asked)
    assert speculative.tokens == target.tokens
    assert (speculative.reasoning, speculative.text) == (target.reasoning, target.text)


def test_a_stream_splits_thinking_from_the_answer(gen):
    with gen.stream("Tom Baker is 52. Give him as JSON.", schema=PERSON, max_tokens=80, temperature=0,
                    reasoning=THINK) as stream:
        deltas = list(stream)
    result = stream.result
    assert any(isinstance(d, Thought) for d in deltas)
    assert "".join(d for d in deltas if isinstance(d, Thought)) == result.reasoning
    assert "".join(d for d in deltas if not isinstance(d, Thought)) == result.text
    assert stream.partial == result.value


def test_keywords_are_scored_on_the_answer(gen):
    result = gen.generate("Write a sentence about a dog.", keywords=["dog", "ball"], max_tokens=40,
                          reasoning=Reasoning(budget=6, required=True))
    assert result.reasoning is not None
    assert result.complete and result.text.strip()


def test_a_bad_reasoning_option_is_refused_before_decoding(gen):
    with pytest.raises(InvalidArgument) as caught:
        gen.generate("hi", reasoning="lots")
    assert caught.value.param == "reasoning"


def test_a_stop_string_inside_the_thought_does_not_end_the_output(gen):
    asked = dict(max_tokens=60, temperature=0, reasoning=Reasoning(budget=24, required=True))
    unstopped = gen.generate("Explain in two sentences why the sky is blue.", **asked)
    assert "," in unstopped.reasoning  # the thought holds the stop string
    stopped = gen.generate("Explain in two sentences why the sky is blue.", stop=[","], **asked)
    assert stopped.reasoning == unstopped.reasoning  # the thought went on past its ","
    assert stopped.finish_reason == "stop" and "," not in stopped.text
    assert unstopped.text.startswith(stopped.text)


def test_a_budget_too_small_for_thought_and_answer_closes_both(gen):
    result = gen.generate("Tom Baker is 52. Give him as JSON.", schema=PERSON, max_tokens=24, temperature=0,
                          reasoning=Reasoning(budget=20, required=True), on_budget="close")
    assert len(result.tokens) <= 24
    assert result.closed_by_budget and result.complete
    jsonschema.validate(result.value, PERSON)
    assert result.reasoning is not None
