"""Speculative decoding on the real SmolLM2 model is lossless: greedy output is token-for-token
the target-only greedy output, for every spec type, draft source and k; stop outputs validate."""

import re

import jsonschema
import pytest

from cdsl_struct import Choice, Grammar, JsonSchema, Regex, compile
from cdsl_struct.decoding import build_proposers, decode
from cdsl_struct.models.runner import ModelRunner

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"},
                   "city": {"type": "string", "maxLength": 20}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
TASKS = {
    "json": (JsonSchema(PERSON), "Extract the person as JSON.\n\nTom Baker, 52, lives in Leeds and teaches history."),
    "regex": (Regex(r"\d{4}-\d{2}-\d{2}"), "Write the date of the Moon landing (20 July 1969) as YYYY-MM-DD."),
    "choice": (Choice(["positive", "negative", "neutral"]), "Sentiment of: 'I loved this film, wonderful!'"),
    "grammar": (Grammar("arithmetic"), "Write an arithmetic expression that equals 12 using 3 and 4."),
}
DRAFTS = ["bf16", "layers:4", "lookup"]


def prompt_ids(model, text):
    return model.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True)["input_ids"]


@pytest.fixture(scope="module")
def setup(smollm2):
    runner = ModelRunner(smollm2.model)
    drafts = {name: build_proposers(name, smollm2.model) for name in DRAFTS}
    baselines = {}
    for task, (spec, text) in TASKS.items():
        compiled = compile(spec, smollm2.tokenizer)
        prompt = prompt_ids(smollm2, text)
        baselines[task] = (compiled, prompt, decode(runner, compiled, prompt, max_tokens=40))
    return runner, drafts, baselines


@pytest.mark.parametrize("task", list(TASKS))
def test_target_output_is_valid(setup, task):
    _, _, baselines = setup
    compiled, _, result = baselines[task]
    assert result.finish_reason == "stop" and result.complete
    spec = compiled.spec
    if task == "json":
        jsonschema.validate(result.value, PERSON)
    elif task in ("regex", "choice"):
        assert re.fullmatch(spec.pattern, result.text)
    else:
        assert result.value.data == "start" or result.value is not None
        spec.parser().parse(result.text)
    assert result.stats.target_passes == result.stats.tokens + 1  # prefill + one pass per token


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("task", list(TASKS))
def test_speculative_greedy_is_identical(setup, task, draft, k):
    runner, drafts, baselines = setup
    compiled, prompt, expected = baselines[task]
    result = decode(runner, compiled, prompt, proposers=drafts[draft], k=k, max_tokens=40)
    assert result.tokens == expected.tokens
    assert result.finish_reason == expected.finish_reason
    stats = result.stats
    assert stats.accepted <= stats.proposed
    assert stats.target_passes <= expected.stats.target_passes
    if draft != "lookup":
        assert stats.draft_passes > 0


def test_high_and_low_acceptance_drafts(setup):
    runner, drafts, baselines = setup
    compiled, prompt, _ = baselines["json"]
    high = decode(runner, compiled, prompt, proposers=drafts["bf16"], k=4, max_tokens=40).stats
    low = decode(runner, compiled, prompt, proposers=drafts["layers:4"], k=4, max_tokens=40).stats
    assert high.acceptance_rate > 0.8 > low.acceptance_rate
    assert high.target_passes_per_token < 0.5


def test_length_finish_is_incomplete(setup):
    runner, _, baselines = setup
    compiled, prompt, _ = baselines["json"]
    result = decode(runner, compiled, prompt, max_tokens=5)
    assert result.finish_reason == "length" and not result.complete and result.value is None
    assert len(result.tokens) == 5
