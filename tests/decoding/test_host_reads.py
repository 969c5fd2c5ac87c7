"""One read back to the host per engine step, whatever the rows do: greedy choices of every row
come back in one transfer (each read of a GPU tensor is a sync that stalls the next step's host
work). Counted with ``HostReads`` on the CPU, where it follows what would be device tensors."""

from __future__ import annotations

import pytest
import torch

from cdsl_struct.bench.host_reads import HostReads
from cdsl_struct.bench.overhead import near_zero_model
from cdsl_struct.bench.serving import PERSON_SCHEMA, prompts
from cdsl_struct.constraints import JsonSchema, Regex, compile, mask
from cdsl_struct.decoding import build_proposers, loop
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.decoding.penalties import Penalties
from cdsl_struct.decoding.sampling import SamplingParams
from cdsl_struct.models.self_check import batch_runner
from cdsl_struct.models.tokenizers import load_tokenizer
from cdsl_struct.prompts import prompt_ids


@pytest.fixture(scope="module")
def setup():
    tokenizer = load_tokenizer("smollm2")
    return tokenizer, near_zero_model(len(tokenizer))


def test_the_counter_sees_a_read_of_a_forward_output_and_of_what_follows_from_it():
    reads = HostReads()

    class Runner:
        def run(self, x):
            return [x * 2]

    runner = Runner()
    with reads:
        reads.follow(runner)
        out = runner.run(torch.ones(3))[0]
        host = torch.ones(3)
        assert host.tolist() and int(host[0]) == 1 and reads.count == 0  # not from the device
        derived = (out + 1).max(dim=-1)
        assert derived.values.item() == 3 and reads.count == 1
        assert float(out[0]) == 2 and out.tolist() == [2, 2, 2] and reads.count == 3


def reads_per_step(engine: BatchEngine, rows: list, reads: HostReads) -> list[int]:
    """Step ``engine`` until ``rows`` end; the reads ``reads`` counted in each step."""
    per_step = []
    while not all(row.done for row in rows):
        before = reads.count
        engine.step()
        per_step.append(reads.count - before)
    return per_step


on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize(("mask_workers", "kernels"), [(0, "host"), (2, "host"), (2, "device"), (2, "static"),
                                                       pytest.param(2, "cuda", marks=on_cuda)])
def test_every_step_reads_the_device_once(setup, monkeypatch, mask_workers, kernels):
    """JSON and regex rows, prompt lookup drafts (speculation, rollback), forced tokens, the loop
    guard and penalties, rows that sample (top-p too; one of them judging prompt lookup's drafts), rows
    joining and ending: one read
    a step, with the CPU's numpy kernels (their one view of the logits), with the torch ops a GPU
    runs (forced here), with those on the static-shape runner a GPU runs by default (its steps
    eager here), and on a GPU."""
    if kernels == "static":
        monkeypatch.setenv("CDSL_RUNNER", "static")
    if kernels in ("device", "static"):
        monkeypatch.setattr(loop, "host_kernels", lambda logits: False)
        monkeypatch.setattr(mask, "host_kernels", lambda logits: False)
    tokenizer, model = setup
    if kernels == "cuda":
        model = near_zero_model(len(tokenizer)).to("cuda")
    eos = [tokenizer.eos_token_id]
    json_spec = compile(JsonSchema(PERSON_SCHEMA), tokenizer, eos_token_ids=eos)
    date = compile(Regex(r"\d{4}-\d{2}-\d{2}"), tokenizer, eos_token_ids=eos)
    lookup = build_proposers("lookup", model)
    requests = [Request(tuple(prompt_ids(tokenizer, text)), date if i == 2 else json_spec, max_tokens=10 + 3 * i,
                        proposers=lookup if i % 2 else (), loop_guard=True,
                        penalties=Penalties(frequency=0.5) if i == 3 else None,
                        params=SamplingParams(temperature=0.8, top_p=0.9 if i == 4 else 1.0, seed=i) if i in (0, 1, 4)
                        else SamplingParams())
                for i, text in enumerate(prompts(5))]
    engine = BatchEngine(batch_runner(model, pad_token_id=0), max_batch_size=3, kv_budget_bytes=float("inf"),
                         mask_workers=mask_workers)
    try:
        rows = [engine.submit(request) for request in requests]
        with HostReads() as reads:
            reads.follow(engine.runner)
            per_step = reads_per_step(engine, rows, reads)
    finally:
        engine.close()
    assert all(row.error is None for row in rows)
    assert len(per_step) > 10 and set(per_step) == {1}
    assert rows[1].session.stats.proposed > 0  # a sampling row's proposals were judged within those reads
    if kernels == "static":
        assert type(engine.runner).__name__ == "GraphRunner" and engine.runner.static_off is None
        assert engine.runner.eager_steps >= len(per_step)
