"""The batched engine on the embedded SmolLM2: rows decoded together equal the same requests run
alone, one bad row never harms the others, and the scheduler keeps its bounds."""

import json
import re

import jsonschema
import pytest
import torch

from cdsl_struct import Choice, JsonSchema, Regex, compile
from cdsl_struct.decoding import SamplingParams, build_proposers, decode
from cdsl_struct.decoding.engine import (
    DEFAULT_PREFILL_BUDGET,
    BatchEngine,
    Request,
    Row,
    Scheduler,
    default_prefill_budget,
)
from cdsl_struct.models.batch import BatchRunner
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.runner import ModelRunner
from cdsl_struct.models.self_check import batch_runner
from cdsl_struct.prompts import prompt_ids

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FACTS = ["Ada Lovelace was 36.", "Alan Turing died at 41.", "Marie Curie lived to 66.", "Grace Hopper was 85."]
DATE = r"\d{4}-\d{2}-\d{2}"


@pytest.fixture(scope="module")
def parts(smollm2, one_torch_thread):
    tok, eos = smollm2.tokenizer, smollm2.eos_token_ids
    return {
        "person": compile(JsonSchema(PERSON), tok, eos_token_ids=eos),
        "date": compile(Regex(DATE), tok, eos_token_ids=eos),
        "mood": compile(Choice(["positive", "negative", "neutral"]), tok, eos_token_ids=eos),
        "free": compile(Regex(r"[\s\S]*"), tok, eos_token_ids=eos),
    }


def workload(smollm2, parts):
    """(prompt ids, compiled, draft) for a mixed batch."""
    tok = smollm2.tokenizer
    rows = [(prompt_ids(tok, f"Extract name and age as JSON: {fact}"), parts["person"], "lookup" if i % 2 else "none")
            for i, fact in enumerate(FACTS)]
    rows.append((prompt_ids(tok, "When did the Apollo 11 landing happen? Give the date."), parts["date"], "none"))
    rows.append((prompt_ids(tok, "Sentiment of 'I loved this film'?"), parts["mood"], "none"))
    rows.append((prompt_ids(tok, "Name three colours."), parts["free"], "lookup"))
    return rows


def engine_for(smollm2, batch=16, runner=batch_runner, **options):
    return BatchEngine(runner(smollm2.model, pad_token_id=smollm2.eos_token_ids[0]), max_batch_size=batch,
                       **options)


def valid(result, compiled):
    """A finished output satisfies its constraint; one cut by max_tokens is never complete."""
    if result.finish_reason != "stop":
        return result.finish_reason == "length" and not result.complete and result.value is None
    spec = compiled.spec
    if spec.kind == "json_schema":
        jsonschema.validate(json.loads(result.text), PERSON)
        return True
    if spec.kind == "regex":
        return result.complete and re.fullmatch(spec.pattern, result.text) is not None
    return result.text in ("positive", "negative", "neutral")


@pytest.fixture(scope="module")
def alone(smollm2, parts):
    """The workload's rows, each decoded alone (one-row runner), 40 tokens at most."""
    target = ModelRunner(smollm2.model)
    return [decode(target, c, ids, proposers=build_proposers(d, smollm2.model), k=6, max_tokens=40)
            for ids, c, d in workload(smollm2, parts)]


@pytest.mark.parametrize("runner", [RaggedRunner, BatchRunner])
def test_batched_rows_equal_solo_runs_and_are_valid(smollm2, parts, alone, runner):
    rows = workload(smollm2, parts)
    engine = engine_for(smollm2, runner=runner)
    together = engine.run([Request(ids, c, max_tokens=40, proposers=build_proposers(d, smollm2.model), k=6)
                           for ids, c, d in rows])
    for (_, compiled, _), solo, batched in zip(rows, alone, together, strict=True):
        assert batched.tokens == solo.tokens and batched.finish_reason == solo.finish_reason
        assert valid(batched, compiled), batched.text
    assert engine.stats.steps < sum(r.stats.target_passes for r in alone)  # rows shared forward passes
    assert engine.stats.as_dict()["mean_rows"] > 1.5
    assert engine.runner.rows == 0  # every row left the batch


def test_sampling_is_per_row_and_leaves_the_global_rng_alone(smollm2, parts):
    ids = prompt_ids(smollm2.tokenizer, "Write a short sentence about rain.")
    params = SamplingParams(temperature=1.0, seed=7)
    rng_before = torch.get_rng_state()
    alone = engine_for(smollm2).run([Request(ids, parts["free"], params, max_tokens=12)])[0]
    crowd = engine_for(smollm2).run([Request(ids, parts["free"], SamplingParams(temperature=1.0, seed=s),
                                             max_tokens=12) for s in (1, 7, 3)])
    assert torch.equal(rng_before, torch.get_rng_state())
    assert crowd[1].tokens == alone.tokens  # same seed, same row output, whatever else is in the batch


class Exploding:
    name = "exploding"

    def propose(self, session, proposal, budget):
        if len(session.output) >= 2:
            raise RuntimeError("proposer failed")


def test_one_bad_row_never_harms_the_others(smollm2, parts):
    rows = workload(smollm2, parts)[:3]
    reference = engine_for(smollm2).run([Request(ids, c, max_tokens=30) for ids, c, _ in rows])
    engine = engine_for(smollm2)
    good = [engine.submit(Request(ids, c, max_tokens=30)) for ids, c, _ in rows]
    bad = engine.submit(Request(rows[0][0], parts["person"], max_tokens=30, proposers=[Exploding()]))
    short = engine.submit(Request(rows[1][0], parts["person"], max_tokens=3))
    cancelled = engine.submit(Request(rows[2][0], parts["person"], max_tokens=30))
    engine.step()
    engine.step()
    cancelled.cancel()
    while engine.busy:
        engine.step()
    with pytest.raises(RuntimeError, match="proposer failed"):
        bad.wait()
    cut = short.wait()
    assert cut.finish_reason == "length" and not cut.complete and cut.value is None and len(cut.tokens) == 3
    stopped = cancelled.wait()
    assert stopped.finish_reason == "cancelled" and not stopped.complete and stopped.value is None
    assert [r.wait().tokens for r in good] == [r.tokens for r in reference]


class UnstartableConstraint:
    """A constraint whose state cannot be made: the row fails while the engine admits it."""

    def __init__(self, compiled):
        self.compiled = compiled

    def __getattr__(self, name):
        return getattr(self.compiled, name)

    def new_state(self):
        raise OverflowError("cannot start this row")


def test_a_row_that_fails_to_start_ends_alone_and_any_seed_is_taken(smollm2, parts):
    rows = workload(smollm2, parts)[:2]
    reference = engine_for(smollm2).run([Request(ids, c, max_tokens=20) for ids, c, _ in rows])
    engine = engine_for(smollm2)
    good = [engine.submit(Request(ids, c, max_tokens=20)) for ids, c, _ in rows]
    engine.step()
    broken = engine.submit(Request(rows[0][0], UnstartableConstraint(parts["person"]), max_tokens=20))
    huge_seed = engine.submit(Request(rows[1][0], parts["person"], max_tokens=20,
                                      params=SamplingParams(temperature=0.7, seed=2**70)))
    while engine.busy:
        engine.step()
    with pytest.raises(OverflowError, match="cannot start"):
        broken.wait()
    assert huge_seed.wait().complete
    assert [r.wait().tokens for r in good] == [r.tokens for r in reference]
    first = SamplingParams(temperature=1.0, seed=2**70).generator()
    assert torch.rand(1, generator=first) == torch.rand(1, generator=SamplingParams(temperature=1.0, seed=2**70)
                                                        .generator())
    with pytest.raises(ValueError, match="seed must be an integer"):
        SamplingParams(seed="7")


def test_a_request_cancelled_while_waiting_ends_at_the_next_step(smollm2, parts):
    rows = workload(smollm2, parts)[:2]
    engine = engine_for(smollm2, batch=1)
    running = engine.submit(Request(rows[0][0], rows[0][1], max_tokens=20))
    queued = engine.submit(Request(rows[1][0], rows[1][1], max_tokens=20))
    engine.step()
    queued.cancel()
    engine.step()
    assert queued.done and not running.done  # it did not wait for the running row to free its place
    ended = queued.wait(0)
    assert ended.finish_reason == "cancelled" and ended.tokens == [] and not ended.complete


def test_closing_the_engine_ends_every_request_it_holds(smollm2, parts):
    from cdsl_struct.decoding.engine import RequestCancelled

    rows = workload(smollm2, parts)[:2]
    engine = engine_for(smollm2, batch=1)
    running = engine.submit(Request(rows[0][0], rows[0][1], max_tokens=200))
    queued = engine.submit(Request(rows[1][0], rows[1][1], max_tokens=20))
    engine.step()
    engine.close()
    partial = running.wait(5)
    assert partial.finish_reason == "cancelled" and not partial.complete and partial.value is None
    with pytest.raises(RequestCancelled):
        queued.wait(5)


def test_batch_size_and_kv_budget_bound_the_rows_in_flight(smollm2, parts):
    rows = workload(smollm2, parts)[:4]
    reference = engine_for(smollm2).run([Request(ids, c, max_tokens=16) for ids, c, _ in rows])
    two = engine_for(smollm2, batch=2)
    assert [r.tokens for r in two.run([Request(ids, c, max_tokens=16) for ids, c, _ in rows])] == \
        [r.tokens for r in reference]
    assert two.stats.as_dict()["mean_rows"] <= 2
    tight = engine_for(smollm2, kv_budget_bytes=1.0)  # no two rows fit: they queue, one at a time
    results = tight.run([Request(ids, c, max_tokens=16) for ids, c, _ in rows])
    assert [r.tokens for r in results] == [r.tokens for r in reference]
    assert tight.stats.as_dict()["mean_rows"] == 1


def test_the_prefill_budget_spreads_a_burst_over_steps(smollm2, parts):
    """Rows arriving together join as many prompt positions per step as the budget allows, each
    step also decoding the rows already in; a row longer than the budget still joins (alone);
    outputs are unchanged."""
    rows = workload(smollm2, parts)[:4]
    requests = [Request(ids, c, max_tokens=8) for ids, c, _ in rows]
    reference = engine_for(smollm2, prefill_budget=None).run(requests)
    engine = engine_for(smollm2, prefill_budget=1)  # every prompt is longer: one row joins per step
    handles = [engine.submit(r) for r in requests]
    joined = []
    while not all(h.done for h in handles):
        engine.step()
        joined.append(len(engine.scheduler.running) + sum(h.done for h in handles))
    assert joined[:4] == [1, 2, 3, 4]
    assert [h.wait().tokens for h in handles] == [r.tokens for r in reference]

    scheduler = Scheduler(16, float("inf"), 1, prefill_budget=64, prefill_cost=lambda row: 30)
    scheduler.waiting.extend(Row(r) for r in requests[:3])
    assert len(scheduler.admit()) == 2 and len(scheduler.admit()) == 1  # 30 + 30 fit in 64, a third does not


def test_the_default_prefill_budget_is_the_devices(smollm2):
    """Tuned on two CPU cores, 512 positions a step; a GPU prefills what vLLM's server does a step."""
    assert default_prefill_budget("cpu") == DEFAULT_PREFILL_BUDGET == 512
    assert default_prefill_budget("cuda:0", total_memory=80 * 2**30) == 8192  # an H100
    assert default_prefill_budget("cuda", total_memory=24 * 2**30) == 2048
    assert default_prefill_budget("mps") == 2048
    engine = engine_for(smollm2)
    assert engine.scheduler.prefill_budget == DEFAULT_PREFILL_BUDGET
    engine.close()
    assert engine_for(smollm2, prefill_budget=None).scheduler.prefill_budget is None


def test_masks_are_written_into_one_bitmask_reused_every_step(smollm2, parts, alone):
    """Every position's mask goes into the engine's preallocated bitmask, in place; with and
    without mask threads the rows decode what each decodes alone (greedy and cut, not closed, at
    the budget: the first 12 tokens of a row's 40)."""
    rows = workload(smollm2, parts)
    first_12 = [result.tokens[:12] for result in alone]
    for workers in (0, 2):
        engine = engine_for(smollm2, mask_workers=workers)
        handles = [engine.submit(Request(ids, c, max_tokens=12, proposers=build_proposers(d, smollm2.model), k=6))
                   for ids, c, d in rows]
        engine.step()
        buffer = engine._bitmask
        assert buffer is not None and buffer.shape[1] == (parts["free"].vocab_size + 31) // 32
        while not all(h.done for h in handles):
            engine.step()
            assert engine._bitmask is buffer  # the same memory, step after step
        engine.close()
        assert [handle.wait().tokens for handle in handles] == first_12


def test_background_engine_serves_submitters_from_threads(smollm2, parts):
    from concurrent.futures import ThreadPoolExecutor

    rows = workload(smollm2, parts)[:4]
    engine = engine_for(smollm2)
    engine.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda row: engine.submit(Request(row[0], row[1], max_tokens=16)).wait(60), rows))
    finally:
        engine.stop()
    assert all(r.tokens for r in results) and engine.stats.as_dict()["mean_rows"] > 1


def test_a_request_is_frozen_and_each_submission_gets_a_row_of_its_own(smollm2, parts):
    import dataclasses

    ids, compiled, _ = workload(smollm2, parts)[0]
    request = Request(ids, compiled, max_tokens=12)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.max_tokens = 99
    assert request.prompt == tuple(ids)  # a copy: changing the caller's list changes nothing
    engine = engine_for(smollm2)
    first, second = engine.submit(request), engine.submit(request)
    while not (first.done and second.done):
        engine.step()
    assert first is not second and first.session is not second.session
    assert first.wait().tokens == second.wait().tokens and len(first.wait().tokens) > 0
