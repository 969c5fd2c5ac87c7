"""Steps launched ahead (``decoding.ahead``): the next step's forward starts from the device's
tokens before the host reads them. On the CPU the graph runner's static steps run eagerly, so
these check the logic a GPU runs: the same text as steps taken in turn, one read a step and the
launch before it, and the cases that keep steps in turn."""

from __future__ import annotations

import threading

import pytest

from cdsl_struct.bench.host_reads import HostReads
from cdsl_struct.bench.overhead import near_zero_model
from cdsl_struct.bench.serving import PERSON_SCHEMA, prompts
from cdsl_struct.constraints import JsonSchema, Regex, compile, mask
from cdsl_struct.decoding import build_proposers, loop
from cdsl_struct.decoding.ahead import default_run_ahead
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.decoding.penalties import Penalties
from cdsl_struct.decoding.sampling import SamplingParams
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.self_check import batch_runner
from cdsl_struct.models.tokenizers import load_tokenizer
from cdsl_struct.prompts import prompt_ids
from cdsl_struct.runners.runner import PENDING
from tests.decoding.test_host_reads import reads_per_step


@pytest.fixture(scope="module")
def setup():
    tokenizer = load_tokenizer("smollm2")
    model = near_zero_model(len(tokenizer))
    eos = [tokenizer.eos_token_id]
    specs = {"json": compile(JsonSchema(PERSON_SCHEMA), tokenizer, eos_token_ids=eos),
             "date": compile(Regex(r"\d{4}-\d{2}-\d{2}"), tokenizer, eos_token_ids=eos)}
    return tokenizer, model, specs


@pytest.fixture
def static(monkeypatch):
    monkeypatch.setenv("CDSL_RUNNER", "static")  # the graph runner a GPU runs, its steps eager here


def _requests(setup, count: int = 8, cancel: threading.Event | None = None, logprobs: bool = True) -> list[Request]:
    """Greedy rows with the grammar's forced tokens, rows that sample, penalties, the loop guard, a
    stop string, budget closing, log-probabilities (each a read of its own), budgets ending at
    different steps."""
    tokenizer, model, specs = setup
    forced = tuple(build_proposers(None, model))
    made = []
    for i, text in enumerate(prompts(count)):
        sampling = i % 3 == 0
        made.append(Request(
            tuple(prompt_ids(tokenizer, text)), specs["date" if i % 4 == 2 else "json"], max_tokens=6 + 3 * i,
            # a sampling row that proposes forced tokens judges them with draws of its generator: the
            # same distribution, other draws than one step at a time. These sample without proposing.
            proposers=() if sampling else forced, loop_guard=True, stop=("a",) if i == 5 else (),
            penalties=Penalties(frequency=0.5) if i == 4 else None, on_budget="close" if i in (1, 7) else "cut",
            logprobs=2 if i == 1 and logprobs else None, cancel_event=cancel if i == 4 else None,
            params=SamplingParams(temperature=0.9, top_p=0.9 if i == 3 else 1.0, seed=i) if sampling
            else SamplingParams()))
    return made


def _run(setup, run_ahead: bool, requests: list[Request], rows: int = 3) -> tuple[list, BatchEngine]:
    engine = BatchEngine(batch_runner(setup[1], pad_token_id=0), max_batch_size=rows, kv_budget_bytes=float("inf"),
                         run_ahead=run_ahead)
    try:
        ended = [engine.submit(request) for request in requests]
        while not all(row.done for row in ended):
            engine.step()
            held = engine.runner.tokens.values()
            assert all(PENDING not in tokens for tokens in held)  # every fed token settled after its read
    finally:
        engine.close()
    return ended, engine


def test_steps_launched_ahead_write_what_steps_in_turn_write(setup, static):
    in_turn, plain = _run(setup, False, _requests(setup))
    ahead, engine = _run(setup, True, _requests(setup))
    assert type(engine.runner).__name__ == "GraphRunner" and plain.ahead_steps == 0
    assert engine.ahead_steps >= engine.stats.steps // 2
    for mine, theirs in zip(ahead, in_turn, strict=True):
        assert mine.error is None and theirs.error is None
        assert mine.result.tokens == theirs.result.tokens
        assert mine.result.finish_reason == theirs.result.finish_reason
    assert {row.result.finish_reason for row in ahead} >= {"stop", "length"}
    chosen = [entry["logprob"] for entry in ahead[1].result.logprobs]
    assert chosen == pytest.approx([entry["logprob"] for entry in in_turn[1].result.logprobs], abs=1e-4)
    assert not engine.runner.tokens  # every row released


def test_a_row_cancelled_while_a_step_runs_ahead_ends_alone(setup, static):
    cancel = threading.Event()
    engine = BatchEngine(batch_runner(setup[1], pad_token_id=0), max_batch_size=8, kv_budget_bytes=float("inf"),
                         run_ahead=True)
    try:
        rows = [engine.submit(request) for request in _requests(setup, cancel=cancel)]
        while engine._ahead is None or rows[4].session is None or len(rows[4].session.output) < 3:
            engine.step()
        cancel.set()
        while not all(row.done for row in rows):
            engine.step()
    finally:
        engine.close()
    assert rows[4].result.finish_reason == "cancelled" and len(rows[4].result.tokens) >= 3
    alone, _ = _run(setup, False, [r for i, r in enumerate(_requests(setup)) if i != 4], rows=8)
    assert [row.result.tokens for i, row in enumerate(rows) if i != 4] == [row.result.tokens for row in alone]


def test_the_next_step_is_launched_before_the_read_and_each_step_reads_once(setup, static, monkeypatch):
    monkeypatch.setattr(loop, "host_kernels", lambda logits: False)  # the torch ops a GPU runs
    monkeypatch.setattr(mask, "host_kernels", lambda logits: False)
    engine = BatchEngine(batch_runner(setup[1], pad_token_id=0), max_batch_size=4, kv_budget_bytes=float("inf"),
                         run_ahead=True)
    reads_at_launch: list[int] = []
    try:
        rows = [engine.submit(request) for request in _requests(setup, count=6, logprobs=False)]
        with HostReads() as reads:
            reads.follow(engine.runner)
            launch, step, started = engine.runner.run_ahead, engine.step, [0]

            def counted(*args, **kwargs):  # the reads of its step so far
                reads_at_launch.append(reads.count - started[0])
                return launch(*args, **kwargs)

            def stepped():
                started[0] = reads.count
                step()

            engine.runner.run_ahead, engine.step = counted, stepped
            per_step = reads_per_step(engine, rows, reads)
    finally:
        engine.close()
    assert all(row.error is None for row in rows)
    assert set(per_step) == {1} and engine.ahead_steps > len(per_step) // 2
    assert reads_at_launch and set(reads_at_launch) == {0}  # launched before its step's one read


def test_what_keeps_steps_in_turn(setup, static):
    tokenizer, model, specs = setup
    prompt = tuple(prompt_ids(tokenizer, prompts(1)[0]))
    lookup = tuple(build_proposers("lookup", model))
    drafting, engine = _run(setup, True, [Request(prompt, specs["json"], max_tokens=12, proposers=lookup)])
    assert drafting[0].error is None and engine.ahead_steps == 0  # a row with drafts would lose them

    engine = BatchEngine(batch_runner(model, pad_token_id=0), max_batch_size=2, kv_budget_bytes=float("inf"),
                         run_ahead=True)
    try:
        first = engine.submit(Request(prompt, specs["json"], max_tokens=8))
        while engine._ahead is None:
            engine.step()
        late = engine.submit(Request(prompt, specs["date"], max_tokens=40))
        engine.step()  # takes the launched step: admits nobody, launches nothing while a row could join
        assert late.session is None and engine._ahead is None
        engine.step()
        assert late.session is not None
        while not (first.done and late.done):
            engine.step()
        assert engine._ahead is not None  # launched for rows that have all ended since (the regex finished)
        again = engine.submit(Request(prompt, specs["json"], max_tokens=4))
        engine.step()  # ... holds no one back
        assert again.session is not None
        while not again.done:
            engine.step()
    finally:
        engine.close()
    assert first.error is None and late.error is None and again.error is None


def test_steps_run_ahead_by_default_where_graphs_replay(setup, static, monkeypatch):
    runner = batch_runner(setup[1], pad_token_id=0)
    assert runner.graphs is None and not default_run_ahead(runner)  # a CPU: a step runs as it is launched
    monkeypatch.setattr(runner, "graphs", object())
    assert default_run_ahead(runner)
    monkeypatch.setenv("CDSL_RUN_AHEAD", "0")
    assert not default_run_ahead(runner)
    monkeypatch.setenv("CDSL_RUN_AHEAD", "1")
    monkeypatch.setattr(runner, "graphs", None)
    assert default_run_ahead(runner)
    ragged = BatchEngine(RaggedRunner(setup[1]), run_ahead=True)
    assert not ragged.run_ahead  # only a runner that can launch from device tokens does
    ragged.close()
