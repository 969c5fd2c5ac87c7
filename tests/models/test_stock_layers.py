"""The embedded model on the stock linear layers: what runs where nothing is prepacked for oneDNN
(``CDSL_PACK=0``, a torch build without oneDNN's prepacked kernels, every GPU).

The rest of the suite loads SmolLM2 packed (float32 packs on every x86 CPU with oneDNN), and its
runner tests use a tiny random Llama, whose linears are stock ones. Here SmolLM2 loads with
packing off and goes through what depends on the real model: the ragged runner's self-check, the
batched engine against each row decoded alone, the int8 self-draft (built from stock linears) and
constrained answers through a ``Generator``.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from torch import nn

from cdsl_struct import Choice, Generator, JsonSchema, compile
from cdsl_struct.decoding import build_proposers, decode
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.models import load_model
from cdsl_struct.models.packed import PackedLinear
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.runner import ModelRunner
from cdsl_struct.models.self_check import batch_runner, check_ragged
from cdsl_struct.prompts import prompt_ids

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def stock(one_torch_thread):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDSL_PACK", "0")
        return load_model("smollm2")


def test_nothing_is_packed(stock):
    linears = [m for m in stock.model.modules() if isinstance(m, nn.Linear)]
    assert linears and not any(isinstance(m, PackedLinear) for m in linears)


def test_the_ragged_runner_passes_its_check_and_rows_decode_as_alone(stock):
    assert check_ragged(stock.model) is None
    tok, eos = stock.tokenizer, stock.eos_token_ids
    person = compile(JsonSchema(PERSON), tok, eos_token_ids=eos)
    mood = compile(Choice(["positive", "negative", "neutral"]), tok, eos_token_ids=eos)
    rows = [(prompt_ids(tok, f"Extract name and age as JSON: {fact}"), person, "lookup")
            for fact in ("Ada Lovelace was 36.", "Alan Turing died at 41.")]
    rows.append((prompt_ids(tok, "Sentiment of 'I loved this film'?"), mood, "none"))
    target = ModelRunner(stock.model)
    alone = [decode(target, c, ids, proposers=build_proposers(d, stock.model), k=4, max_tokens=24)
             for ids, c, d in rows]
    runner = batch_runner(stock.model, pad_token_id=eos[0])
    assert isinstance(runner, RaggedRunner)
    engine = BatchEngine(runner, max_batch_size=4)
    together = engine.run([Request(ids, c, max_tokens=24, proposers=build_proposers(d, stock.model), k=4)
                           for ids, c, d in rows])
    engine.close()
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert all(r.finish_reason == "stop" and r.complete for r in together)


def test_the_int8_self_draft_builds_from_stock_linears_and_is_lossless(stock):
    compiled = compile(Choice(["yes", "no", "maybe"]), stock.tokenizer, eos_token_ids=stock.eos_token_ids)
    ids = prompt_ids(stock.tokenizer, "Is water wet? Answer yes, no or maybe.")
    target = ModelRunner(stock.model)
    plain = decode(target, compiled, ids, max_tokens=8)
    drafted = decode(target, compiled, ids, proposers=build_proposers("int8", stock.model), k=4, max_tokens=8)
    assert drafted.tokens == plain.tokens and drafted.stats.draft_passes > 0


def test_a_generator_on_stock_layers_answers_valid_json(stock):
    generator = Generator(stock)
    try:
        prompts = ["Ada Lovelace was 36. Extract the person.", "Alan Turing died at 41. Extract the person."]
        results = generator.generate_batch(prompts, schema=PERSON, max_tokens=40)
    finally:
        generator.close()
    for result in results:
        assert result.complete
        jsonschema.validate(json.loads(result.text), PERSON)
