"""The CPU default where the CPU multiplies bfloat16 natively: bf16 weights on packed linears,
and every constrained answer still valid (the suite's other tests run float32: conftest.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from cdsl_struct import Generator
from cdsl_struct.bench.serving import PERSON_SCHEMA, prompts
from cdsl_struct.models import load_model
from cdsl_struct.models.packed import PackedLinear, packable_dtypes


@pytest.fixture(scope="module")
def bf16_default():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CDSL_CPU_BF16", "1")  # what dtype="auto" reads on a CPU with AVX-512 BF16 or AMX
        yield load_model("smollm2")


def test_auto_loads_bf16_weights_on_packed_linears(bf16_default):
    """Packed where this run packs at all; a CPU without oneDNN's bf16 path keeps the class and
    takes the stock path inside it (test_stock_layers.py: a model loaded with packing off)."""
    model = bf16_default.model
    assert next(model.parameters()).dtype is torch.bfloat16
    assert isinstance(model.lm_head, PackedLinear) == bool(packable_dtypes())


def test_bf16_answers_are_valid_and_complete(bf16_default):
    generator = Generator(bf16_default)
    try:
        results = generator.generate_batch([[{"role": "user", "content": p}] for p in prompts(8)],
                                           schema=PERSON_SCHEMA, max_tokens=60)
        regex = generator.generate("When did Apollo 11 land? Give the date.", regex=r"\d{4}-\d{2}-\d{2}")
        choice = generator.generate("Is 'I loved it' positive or negative?", choices=["positive", "negative"])
    finally:
        generator.close()
    for result in results:
        assert result.complete and result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), PERSON_SCHEMA)
    assert regex.complete and len(regex.text) == 10 and regex.text[4] == "-"
    assert choice.text in ("positive", "negative")
