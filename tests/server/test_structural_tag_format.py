"""``response_format: {"type": "structural_tag", ...}`` on the server: both request shapes become one
``StructuralTag``, malformed ones are 400 naming ``response_format``, and a real request answers with
text whose tags hold valid JSON."""

from __future__ import annotations

import json

import jsonschema
import pytest

from cdsl_struct.constraints.structural_tag import StructuralTag

from .conftest import SERVER_EXTRA, client_for, running_server

pytest.importorskip("fastapi", reason=SERVER_EXTRA)

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"],
        "additionalProperties": False}
VLLM_SHAPE = {"type": "structural_tag", "triggers": ["<city>"],
              "structures": [{"begin": "<city>", "schema": CITY, "end": "</city>"}]}
XGRAMMAR_SHAPE = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<city>"], "at_least_one": True, "stop_after_first": True,
    "tags": [{"type": "tag", "begin": "<city>", "content": {"type": "json_schema", "json_schema": CITY},
              "end": "</city>"}]}}


def request(response_format):
    from cdsl_struct.server.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], response_format=response_format)


@pytest.mark.parametrize("shape", [VLLM_SHAPE, XGRAMMAR_SHAPE])
def test_both_shapes_become_one_structural_tag(shape):
    call = request(shape).to_call(16)
    spec = call.kwargs["grammar"]
    assert isinstance(spec, StructuralTag) and spec.triggers == ("<city>",)
    assert call.constraint_param == "response_format"


@pytest.mark.parametrize(("shape", "code"), [
    ({"type": "structural_tag", "triggers": ["<b>"], "structures": VLLM_SHAPE["structures"]},
     "invalid_structural_tag"),
    ({"type": "structural_tag", "triggers": [], "structures": VLLM_SHAPE["structures"]}, "invalid_structural_tag"),
    ({"type": "structural_tag", "triggers": ["<a"], "structures": [{"begin": "<a>", "schema": {"type": 3}}]},
     "invalid_schema"),
    ({"type": "structural_tag", "format": {"type": "or", "elements": []}}, "invalid_structural_tag"),
])
def test_malformed_is_400_naming_response_format(shape, code):
    from cdsl_struct.server.errors import APIError

    with pytest.raises(APIError) as caught:
        request(shape).to_call(16)
    assert caught.value.status == 400 and caught.value.param == "response_format" and caught.value.code == code


def test_served_answer_has_valid_tags(smollm2, one_torch_thread):
    openai = pytest.importorskip("openai", reason=SERVER_EXTRA)
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    app = create_app(Generator(smollm2), default_max_tokens=40)
    shot = [{"role": "user", "content": "Which city is the capital of Italy?"},
            {"role": "assistant", "content": 'The capital of Italy is <city>{"name": "Rome"}</city>.'},
            {"role": "user", "content": "Which city is the capital of Spain?"}]
    with running_server(app) as base_url:
        client = client_for(base_url, timeout=120)
        answer = client.chat.completions.create(model="smollm2", messages=shot, response_format=XGRAMMAR_SHAPE)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="smollm2", messages=shot, response_format={
                "type": "structural_tag", "triggers": [], "structures": VLLM_SHAPE["structures"]})
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop", text
    body = text[text.index("<city>") + len("<city>"):text.rindex("</city>")]
    jsonschema.validate(json.loads(body), CITY)


def test_oversized_or_deep_structures_are_refused_before_compiling():
    from cdsl_struct.server.errors import APIError
    from cdsl_struct.server.protocol import ServerLimits

    deep: dict = {"type": "object"}
    for _ in range(60):
        deep = {"type": "object", "properties": {"x": deep}}
    shape = {"type": "structural_tag", "triggers": ["<a"], "structures": [{"begin": "<a>", "schema": deep}]}
    with pytest.raises(APIError) as caught:
        request(shape).to_call(16, ServerLimits())
    assert caught.value.status == 400 and caught.value.code == "constraint_too_deep"
    assert caught.value.param == "response_format"
