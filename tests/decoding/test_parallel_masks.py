"""The engine fills the masks of llguidance rows in one parallel call (``fill_drafted_masks``) and
decodes exactly what it decodes with every mask filled row by row."""

import pytest

from cdsl_struct.bench.overhead import near_zero_model
from cdsl_struct.bench.serving import PERSON_SCHEMA, prompts
from cdsl_struct.constraints import JsonSchema, Regex, compile
from cdsl_struct.constraints.backends import llguidance_backend
from cdsl_struct.decoding import build_proposers
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.tokenizers import load_tokenizer
from cdsl_struct.prompts import prompt_ids


@pytest.mark.parametrize("mask_workers", [0, 2])
def test_parallel_masks_decode_what_row_by_row_masks_decode(monkeypatch, mask_workers):
    tokenizer = load_tokenizer("smollm2")
    model = near_zero_model(len(tokenizer))
    eos = [tokenizer.eos_token_id]
    specs = [compile(JsonSchema(PERSON_SCHEMA), tokenizer, eos_token_ids=eos),
             compile(Regex(r"\d{4}-\d{2}-\d{2}"), tokenizer, eos_token_ids=eos)]
    lookup = build_proposers("lookup", model)
    calls = []
    original = llguidance_backend.fill_drafted_masks

    def counted(jobs, bitmask):
        calls.append(len(jobs))
        return original(jobs, bitmask)

    monkeypatch.setattr(llguidance_backend, "fill_drafted_masks", counted)

    def run():
        requests = [Request(tuple(prompt_ids(tokenizer, text)), specs[i % 2], max_tokens=24,
                            proposers=lookup if i % 3 == 0 else ())
                    for i, text in enumerate(prompts(6))]
        engine = BatchEngine(RaggedRunner(model), max_batch_size=4, kv_budget_bytes=float("inf"),
                             mask_workers=mask_workers)
        try:
            return [result.tokens for result in engine.run(requests)]
        finally:
            engine.close()

    together = run()
    assert calls and max(calls) > 1
    monkeypatch.setattr(llguidance_backend, "parallel_fill_supported", lambda state: False)
    calls.clear()
    assert run() == together and not calls
