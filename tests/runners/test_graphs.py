"""Capture and replay, checked on the CPU with a fake ``torch.cuda``: every bucket warmed before
its capture, largest first, into one pool; nothing captured while serving; a capture that fails
leaves the steps eager; the load-time self-check drops graphs that disagree with the model."""

import contextlib

import pytest
import torch

from cdsl_struct.models import self_check
from cdsl_struct.models.batch import Feed
from cdsl_struct.runners.graphs import StepGraphs
from cdsl_struct.runners.plan import Buckets
from cdsl_struct.runners.runner import GraphRunner
from tests.models.solo import close, solo

SMALL = Buckets(capacity=64, decode_rows=(1, 2, 4), decode_widths=(1, 4), prefill_rows=(1, 2), prefill_widths=(8,))


class FakeCuda:
    """What ``StepGraphs`` uses of ``torch.cuda``, on the CPU. A "captured" graph replays by running
    the step eagerly into the output tensor its capture returned (what a real replay overwrites)."""

    def __init__(self, step, fail_at=None, wrong=False):
        self.step, self.fail_at, self.wrong = step, fail_at, wrong
        self.events: list[tuple[str, object]] = []
        self.capturing = None
        self.pools = set()
        original = step.run

        def run(bucket):
            self.events.append(("capture" if self.capturing is not None else "run", bucket))
            if self.capturing is not None and bucket == self.fail_at:
                raise RuntimeError("operation not permitted when stream is capturing")
            return original(bucket)

        step.run = run
        self.original = original
        fake = self

        class Graph:
            def __init__(self):
                self.bucket = None
                self.output = None

            def replay(self):
                fake.events.append(("replay", self.bucket))
                result = fake.original(self.bucket)
                self.output.copy_(result + 1.0 if fake.wrong else result)

        self.CUDAGraph = Graph

    def graph_pool_handle(self):
        return object()

    def Stream(self):  # noqa: N802 - torch.cuda's name
        return _Stream()

    def current_stream(self):
        return _Stream()

    def stream(self, stream):
        return contextlib.nullcontext()

    def synchronize(self):
        pass

    @contextlib.contextmanager
    def graph(self, graph, pool=None):
        self.pools.add(id(pool))
        count = len(self.events)
        self.capturing = graph
        try:
            yield
        finally:
            self.capturing = None
        graph.bucket = self.events[count][1]

    def attach(self, graphs: StepGraphs):
        for graph, output in graphs.graphs.values():
            graph.output = output


class _Stream:
    def wait_stream(self, other):
        pass


def _runner(model, **fake_options):
    runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0, graphs=False)
    fake = FakeCuda(runner.step, **fake_options)
    runner.capture(fake)
    if runner.graphs is not None:
        fake.attach(runner.graphs)
    return runner, fake


def test_every_bucket_is_warmed_then_captured_largest_first_into_one_pool(model):
    runner, fake = _runner(model)
    captured = [bucket for kind, bucket in fake.events if kind == "capture"]
    assert captured == SMALL.all() and len(fake.pools) == 1 and runner.graphs.sealed
    for bucket in captured:
        first_run = fake.events.index(("run", bucket))
        assert first_run < fake.events.index(("capture", bucket))  # warmed before its capture


def test_serving_replays_and_never_captures(model):
    runner, fake = _runner(model)
    before = len([e for e in fake.events if e[0] == "capture"])
    seqs = {"a": list(range(1, 15)), "b": [4, 5]}
    out = runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    seqs = {"a": seqs["a"] + [2, 3], "b": seqs["b"] + [6]}
    out = runner.run([Feed("a", seqs["a"], 2), Feed("b", seqs["b"], 1)])
    assert close(out[0], solo(model, seqs["a"], keep=2)) and close(out[1], solo(model, seqs["b"]))
    served = fake.events[fake.events.index(("capture", SMALL.all()[-1])) + 1:]
    assert {kind for kind, _ in served} == {"replay"} and runner.replays == len(served) >= 3
    assert len([e for e in fake.events if e[0] == "capture"]) == before and runner.eager_steps == 0
    with pytest.raises(Exception, match="captured once"):
        runner.graphs.capture(SMALL.all())


def test_a_failed_capture_leaves_the_steps_eager_and_says_why(model, caplog):
    runner, _ = _runner(model, fail_at=SMALL.all()[3])
    assert runner.graphs is None and "capture failed" in runner.graphs_off
    assert "CUDA graphs off" in caplog.text
    out = runner.run([Feed("a", [1, 2, 3], 1)])
    assert close(out[0], solo(model, [1, 2, 3])) and runner.eager_steps == 1


def test_the_self_check_drops_graphs_that_disagree_with_the_model(model, monkeypatch):
    made = []

    def graph_runner(*args, **kwargs):
        runner, _ = _runner(model, wrong=True)
        made.append(runner)
        return runner

    monkeypatch.setattr("cdsl_struct.runners.runner.GraphRunner", graph_runner)
    runner, reason = self_check._graph_runner(model, 0)
    assert runner is made[0] and reason is None
    assert runner.graphs is None and "self-check" in runner.graphs_off and runner.rows == 0
    assert runner.passes == 0  # the check's steps are not counted
    assert close(runner.run([Feed("a", [1, 2], 1)])[0], solo(model, [1, 2]))


def test_the_engine_runner_is_the_graph_runner_where_asked(model, monkeypatch):
    monkeypatch.setenv("CDSL_RUNNER", "static")
    runner = self_check.batch_runner(model, max_rows=2)  # fewer rows than the check feeds: its cache holds them
    assert isinstance(runner, GraphRunner) and runner.graphs is None  # no CUDA here: eager static steps
    assert runner.static_off is None and runner.buckets.max_rows == 2
    assert runner.rows == 0 and runner.passes == 0
    assert torch.device(runner.device).type == "cpu"


def test_a_runner_made_on_a_request_path_never_captures(model, monkeypatch):
    """On a CUDA device the engine's runner is the graph runner, but a draft runner (made on the
    first draft pass, ``graphs=False``) is the ragged one: no capture stalls a request."""
    asked = []
    monkeypatch.setitem(self_check._checked, model, None)  # the ragged check passed (it would run on "cuda")
    monkeypatch.setattr(self_check, "model_device", lambda _: torch.device("cuda"))
    monkeypatch.setattr(self_check, "_graph_runner", lambda *a, **k: asked.append(k) or (None, "recorded"))
    assert type(self_check.batch_runner(model, graphs=False)).__name__ == "RaggedRunner" and asked == []
    runner = self_check.batch_runner(model)
    assert asked and type(runner).__name__ == "RaggedRunner" and runner.fallback_reason == "recorded"


def test_fused_steps_compile_once_a_bucket_before_its_capture_and_never_while_serving(model):
    """``fuse``: each bucket's step compiled (one ``fullgraph`` compile of its one shape) in its warm-up,
    before its capture; serving replays them and compiles nothing; the outputs are the eager ones."""
    buckets = Buckets(capacity=64, decode_rows=(1, 2), decode_widths=(1,), prefill_rows=(1,), prefill_widths=(8,))
    runner = GraphRunner(model, buckets=buckets, prefix_cache_bytes=0, graphs=False)
    fake = FakeCuda(runner.step)
    compiles: list[int] = []

    def backend(graph_module, example_inputs):  # runs the traced graph as it is; records the compile
        compiles.append(len(example_inputs))
        fake.events.append(("compile", fake.events[-1][1]))  # within the run the fake just recorded
        return graph_module.forward

    torch._dynamo.reset()
    runner.capture(fake, fuse=backend)
    fake.attach(runner.graphs)
    assert runner.fused and runner.fuse_off is None and len(compiles) == len(buckets.all())
    for bucket in buckets.all():
        assert fake.events.index(("compile", bucket)) < fake.events.index(("capture", bucket))
    seqs = {"a": list(range(1, 15)), "b": [4, 5]}
    runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    seqs = {"a": seqs["a"] + [2], "b": seqs["b"] + [6]}
    out = runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    assert close(out[0], solo(model, seqs["a"])) and close(out[1], solo(model, seqs["b"]))
    assert len(compiles) == len(buckets.all()) and runner.replays >= 3


def test_a_step_that_fails_to_compile_leaves_the_graphs_unfused(model, caplog):
    def broken(graph_module, example_inputs):
        raise RuntimeError("no kernel for this")

    runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0, graphs=False)
    fake = FakeCuda(runner.step)
    torch._dynamo.reset()
    runner.capture(fake, fuse=broken)
    fake.attach(runner.graphs)
    assert runner.graphs is not None and not runner.fused and "no kernel for this" in runner.fuse_off
    assert "run uncompiled" in caplog.text
    out = runner.run([Feed("a", [1, 2, 3], 1)])
    assert close(out[0], solo(model, [1, 2, 3])) and runner.replays == 1


def test_the_self_check_recaptures_unfused_where_the_compiled_steps_disagree(model, monkeypatch):
    def off_by_one(graph_module, example_inputs):  # a "compiler" whose steps compute something else
        return lambda *args: [out + 1.0 for out in graph_module.forward(*args)]

    made = []

    def graph_runner(*args, **kwargs):
        runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0, graphs=False)
        fake = FakeCuda(runner.step)
        original = runner.capture

        def capture(backend=None, fuse=None):  # every capture on the fake, the fake's graphs attached
            seconds = original(fake, fuse)
            fake.attach(runner.graphs)
            return seconds

        runner.capture = capture
        torch._dynamo.reset()
        runner.capture(fuse=off_by_one)
        made.append(runner)
        return runner

    monkeypatch.setattr("cdsl_struct.runners.runner.GraphRunner", graph_runner)
    runner, reason = self_check._graph_runner(model, 0)
    assert runner is made[0] and reason is None
    assert not runner.fused and "self-check" in runner.fuse_off and runner.graphs is not None
    assert close(runner.run([Feed("a", [1, 2], 1)])[0], solo(model, [1, 2])) and runner.replays == 1


def _checked_graph_runner(model, monkeypatch, ahead_offset=0):
    """``self_check._graph_runner`` on a fake capture; ``ahead_offset``: steps launched ahead feed each
    row that much past the token they were given (a launch that writes the wrong ids)."""
    made = []

    def graph_runner(*args, **kwargs):
        runner, _ = _runner(model)
        if ahead_offset:
            launch = runner.run_ahead
            runner.run_ahead = lambda rows, tokens: launch(rows, tokens + ahead_offset)
        made.append(runner)
        return runner

    monkeypatch.setattr("cdsl_struct.runners.runner.GraphRunner", graph_runner)
    runner, reason = self_check._graph_runner(model, 0)
    assert runner is made[0] and reason is None and runner.graphs is not None
    assert runner.rows == 0 and runner.passes == 0  # the checks' steps are not kept or counted
    return runner


def test_the_self_check_keeps_steps_ahead_that_agree_with_the_model(model, monkeypatch):
    from cdsl_struct.decoding.ahead import default_run_ahead

    runner = _checked_graph_runner(model, monkeypatch)
    assert runner.ahead_off is None and default_run_ahead(runner)


def test_steps_ahead_that_disagree_with_the_model_run_in_turn(model, monkeypatch, caplog):
    from cdsl_struct.decoding import BatchEngine
    from cdsl_struct.decoding.ahead import default_run_ahead

    runner = _checked_graph_runner(model, monkeypatch, ahead_offset=1)
    assert "launched ahead" in runner.ahead_off and "every step runs in turn" in caplog.text
    monkeypatch.setenv("CDSL_RUN_AHEAD", "1")
    assert not default_run_ahead(runner)
    engine = BatchEngine(runner, run_ahead=True)
    assert not engine.run_ahead
    engine.close()
    assert close(runner.run([Feed("a", [1, 2], 1)])[0], solo(model, [1, 2]))  # the graphs still serve


def test_the_ahead_check_runs_on_eager_static_steps(model):
    runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0, graphs=False)
    assert self_check.check_ahead(runner) is None and runner.rows == 0
    runner.run_ahead = lambda rows, tokens: None
    assert "launched nothing" in self_check.check_ahead(runner)
