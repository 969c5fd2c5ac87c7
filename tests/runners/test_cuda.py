"""On a GPU only (skipped elsewhere; ``benchmarks/gpu_check.sh`` runs it on a lent one): the graph
runner's replays equal its eager static steps and solo runs per bucket, rows joining and leaving,
drafts accepted and rejected, with no host sync inside a step."""

import pytest
import torch

from cdsl_struct.models.batch import Feed
from cdsl_struct.runners.plan import Buckets
from cdsl_struct.runners.runner import GraphRunner
from tests.models.solo import close, solo, tiny_llama
from tests.runners.test_runner import _script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SMALL = Buckets(capacity=96, decode_rows=(1, 2, 4, 8), decode_widths=(1, 2, 4), prefill_rows=(1, 2),
                prefill_widths=(4, 8))


@pytest.mark.parametrize("seed", range(3))
def test_replays_equal_eager_steps_and_solo_runs(seed):
    reference, model = tiny_llama(), tiny_llama().to("cuda")  # the same seeded weights
    graphs = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    eager = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0, graphs=False)
    assert graphs.graphs is not None and len(graphs.graphs.graphs) == len(SMALL.all())
    for left, feeds in _script(seed, model.config.vocab_size):
        graphs.release(*left)
        eager.release(*left)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = graphs.run(feeds)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        for feed, a, b in zip(feeds, got, eager.run(feeds), strict=True):
            assert torch.equal(a, b), feed.row  # the same kernels on the same inputs
            assert close(a.cpu(), solo(reference, feed.sequence, keep=feed.keep)), feed.row
    assert graphs.replays > 0 and graphs.eager_steps == 0 and graphs.static_off is None


def test_the_engine_runner_on_cuda_is_the_graph_runner():
    from cdsl_struct.models.self_check import batch_runner

    reference, model = tiny_llama(), tiny_llama().to("cuda")
    runner = batch_runner(model, max_rows=4)
    assert isinstance(runner, GraphRunner) and runner.graphs is not None and runner.graphs_off is None
    assert runner.ahead_off is None  # its replayed steps launched ahead passed the load-time check
    out = runner.run([Feed("a", [1, 2, 3], 1)])
    assert close(out[0].cpu(), solo(reference, [1, 2, 3]))


def test_a_step_run_ahead_replays_from_the_chosen_tokens_with_no_sync():
    """``run_ahead`` on the card: launched without a host sync, fed from a device tensor, the same
    logits as the step fed from the host (the engine-level check is ``tests/decoding/test_run_ahead.py``,
    which ``CDSL_RUNNER=static`` runs the same way)."""
    model = tiny_llama().to("cuda")
    ahead = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    in_turn = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0, graphs=False)
    seqs = {"a": list(range(10, 30)), "b": [5, 6, 7]}
    for runner in (ahead, in_turn):
        runner.run([Feed(row, seq, 1) for row, seq in seqs.items()])
    tokens = torch.tensor([11, 12], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits, offsets = ahead.run_ahead(["a", "b"], tokens)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ahead.settle({"a": 11, "b": 12})
    want = in_turn.run([Feed("a", seqs["a"] + [11], 1), Feed("b", seqs["b"] + [12], 1)])
    assert torch.equal(logits[offsets["a"]], want[0][0]) and torch.equal(logits[offsets["b"]], want[1][0])
    assert ahead.replays > 0 and ahead.tokens == in_turn.tokens


def test_steps_fused_by_inductor_replay_what_the_model_computes():
    """``fuse="inductor"`` on the card: two buckets compiled before their capture, replayed, close to
    solo runs (fused kernels sum in another order: close, not equal)."""
    reference, model = tiny_llama(), tiny_llama().to("cuda")
    buckets = Buckets(capacity=64, decode_rows=(2,), decode_widths=(1,), prefill_rows=(1,), prefill_widths=(8,))
    runner = GraphRunner(model, buckets=buckets, prefix_cache_bytes=0, fuse="inductor")
    assert runner.fused and runner.fuse_off is None and runner.graphs is not None
    seqs = {"a": list(range(1, 15)), "b": [4, 5]}
    runner.run([Feed(row, seq, 1) for row, seq in seqs.items()])
    seqs = {"a": seqs["a"] + [2], "b": seqs["b"] + [6]}
    out = runner.run([Feed(row, seq, 1) for row, seq in seqs.items()])
    assert close(out[0].cpu(), solo(reference, seqs["a"])) and close(out[1].cpu(), solo(reference, seqs["b"]))
    assert runner.replays >= 3 and runner.eager_steps == 0
