"""The engine cannot hang a caller or step one runner twice at once: a request racing ``close``,
a step loop whose error handling itself fails, two threads driving an unstarted engine; and the
scheduler reserves what each runner's cache really holds."""

from __future__ import annotations

import threading
import time

import pytest

from cdsl_struct.bench.overhead import near_zero_model
from cdsl_struct.constraints import Regex, compile
from cdsl_struct.decoding import engine as engine_module
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.errors import CdslError
from cdsl_struct.models import BatchRunner, RaggedRunner, load_tokenizer
from cdsl_struct.models.batch import kv_bytes_per_token


@pytest.fixture(scope="module")
def parts():
    tokenizer = load_tokenizer("smollm2")
    model = near_zero_model(len(tokenizer))
    compiled = compile(Regex(r"[a-z]{1,12}"), tokenizer, eos_token_ids=[tokenizer.eos_token_id])
    return model, compiled


def _request(compiled, max_tokens=6):
    return Request((1, 2, 3, 4), compiled, max_tokens=max_tokens)


def test_a_request_submitted_while_close_runs_is_refused_not_orphaned(parts, monkeypatch):
    """``close`` finishing between ``submit``'s check and its queueing left the row in a queue no
    one steps, and its caller waiting forever; now ``submit`` decides under ``close``'s lock."""
    model, compiled = parts
    engine = BatchEngine(RaggedRunner(model), max_batch_size=2, mask_workers=0)
    real_row = engine_module.Row

    def close_first(request):
        engine.close()  # the whole of close() lands inside submit, before the row is queued
        return real_row(request)

    monkeypatch.setattr(engine_module, "Row", close_first)
    with pytest.raises(CdslError, match="closed"):
        engine.submit(_request(compiled))
    assert not engine.scheduler.waiting


def test_a_loop_whose_error_handling_fails_ends_every_row_and_refuses_more(parts):
    model, compiled = parts
    runner = RaggedRunner(model)
    engine = BatchEngine(runner, max_batch_size=2, mask_workers=0)

    def broken_run(feeds):
        raise RuntimeError("the forward failed")

    def broken_release(*rows):
        raise RuntimeError("and so did freeing the rows")

    runner.run, runner.release = broken_run, broken_release
    engine.start()
    try:
        rows = [engine.submit(_request(compiled)) for _ in range(4)]  # two run, two wait
        for row in rows:
            with pytest.raises(RuntimeError, match="failed|freeing"):
                row.wait(timeout=30)
        with pytest.raises(CdslError, match="step loop failed"):
            engine.submit(_request(compiled))
    finally:
        engine.close()


def test_threads_driving_an_unstarted_engine_take_turns(parts):
    model, compiled = parts
    engine = BatchEngine(RaggedRunner(model), max_batch_size=4, mask_workers=0)
    inside, most = [0], [0]
    guard = threading.Lock()
    step = engine.step

    def counted_step():
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # widen the window two unguarded callers would share
        try:
            step()
        finally:
            with guard:
                inside[0] -= 1

    engine.step = counted_step
    results = {}

    def drive(name):
        results[name] = engine.run([_request(compiled, 8) for _ in range(2)])

    threads = [threading.Thread(target=drive, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    engine.close()
    assert most[0] == 1
    assert all(len(results[name]) == 2 and all(r.tokens for r in results[name]) for name in "ab")


def test_the_ragged_runner_is_not_reserved_the_padded_runners_worst_case(parts):
    """For one budget the ragged runner admits the rows its slot cache can hold (about 1.6x the
    padded runner's), and what it then allocates stays within the budget."""
    model, compiled = parts
    per_token = kv_bytes_per_token(model)
    request = _request(compiled, 40)
    budget = 24 * (2 * request.sequence_tokens + 32) * per_token  # 24 rows by the padded rule
    admitted = {}
    for runner in (BatchRunner(model), RaggedRunner(model)):
        engine = BatchEngine(runner, max_batch_size=64, kv_budget_bytes=budget, mask_workers=0)
        for _ in range(64):
            engine.submit(_request(compiled, 40))
        engine.step()
        admitted[type(runner).__name__] = len(engine.scheduler.running)
        if isinstance(runner, RaggedRunner):
            for _ in range(3):
                engine.step()
            cache = runner.cache
            held = sum(k.numel() * k.element_size() * 2 for k in cache.keys if k is not None)
            assert held <= budget
        engine.close()
    assert admitted["BatchRunner"] == 24
    assert admitted["RaggedRunner"] >= 1.5 * admitted["BatchRunner"]
