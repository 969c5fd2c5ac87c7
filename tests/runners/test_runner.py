"""The static-shape runner run eagerly on the CPU: every step equals today's ragged runner in
float32 whatever the bucket, the neighbours and the slot; the step compiles with ``fullgraph=True``
(no host sync, no graph break); its buffers never move; a row outgrowing the cache leaves the
static path and stays correct."""

import random

import pytest
import torch

from cdsl_struct.models.batch import Feed
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.runners.plan import Buckets, FedRow
from cdsl_struct.runners.runner import PENDING, GraphRunner
from tests.models.solo import close, solo
from tests.models.test_ragged import _tiny

#: small buckets so that a few dozen tokens cross every kind: widths past 4 go to prefill steps,
#: prompts past 8 are chunked
SMALL = Buckets(capacity=96, decode_rows=(1, 2, 4, 8), decode_widths=(1, 2, 4), prefill_rows=(1, 2),
                prefill_widths=(4, 8))


def _script(seed: int, vocab: int):
    """A random engine-like run: rows joining with prompts, decoding, verifying drafts (some
    rejected: cropped), leaving (the last slot moves); each step's (rows that left, feeds)."""
    rng = random.Random(seed)
    held: dict[str, list[int]] = {}
    names = iter(f"r{i}" for i in range(100))
    steps = []
    for _ in range(14):
        if len(held) < 6 and rng.random() < 0.5:
            held[next(names)] = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
        left = []
        if len(held) > 1 and rng.random() < 0.25:
            left.append(rng.choice(sorted(held)))
            del held[left[0]]
        feeds = []
        for row, tokens in held.items():
            if rng.random() < 0.2:
                continue  # a row that feeds nothing this step (padded in the decode step)
            if rng.random() < 0.3 and len(tokens) > 3:
                del tokens[len(tokens) - rng.randint(1, 2):]  # rejected drafts: cropped
            tokens += [rng.randrange(vocab) for _ in range(rng.choice([1, 1, 2, 3, 4, 6]))]
            feeds.append(Feed(row, list(tokens), rng.randint(1, min(3, len(tokens)))))
        steps.append((left, feeds))
    return steps


@pytest.mark.parametrize("seed", range(6))
def test_static_steps_equal_the_ragged_runner_in_float32(model, seed):
    static = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    ragged = RaggedRunner(model, prefix_cache_bytes=0)
    seen = set()
    for left, feeds in _script(seed, model.config.vocab_size):
        for runner in (static, ragged):
            runner.release(*left)
        for feed, got, want in zip(feeds, static.run(feeds), ragged.run(feeds), strict=True):
            assert got.dtype == torch.float32 and close(got, want), (seed, feed.row)
        assert static.order == ragged.order and static.tokens == ragged.tokens
        seen.update(static.step._views)
    assert static.static_off is None and static.eager_steps >= len(seen) > 2
    assert {b.gather for b in seen} == {True, False}  # prefill and decode steps both ran


def test_forks_and_reused_prefixes_match_solo_runs(model):
    runner = GraphRunner(model, buckets=SMALL)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    runner.run([Feed("a", prompt, 1)])
    runner.fork([("a", "b")])
    out = runner.run([Feed("a", prompt + [7], 1), Feed("b", prompt + [8, 9], 2)])
    assert close(out[0], solo(model, prompt + [7])) and close(out[1], solo(model, prompt + [8, 9], keep=2))
    out = runner.run([Feed("c", prompt + [2, 2], 1)])  # joins on the stored prefix of "a"'s prompt
    assert runner.last_prefilled["c"] < len(prompt) and close(out[0], solo(model, prompt + [2, 2]))


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "gemma3_text"])
def test_every_supported_family_matches_solo_runs(family):
    model = _tiny(family)
    runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    seqs = {"a": list(range(10, 40)), "b": [5, 6, 7], "c": [8, 9]}
    runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    seqs = {"a": seqs["a"] + [7, 8], "b": seqs["b"] + [9], "c": seqs["c"] + [1, 2, 3]}
    out = runner.run([Feed("a", seqs["a"], 2), Feed("b", seqs["b"], 1), Feed("c", seqs["c"], 3)])
    assert close(out[0], solo(model, seqs["a"], keep=2)) and close(out[1], solo(model, seqs["b"]))
    assert close(out[2], solo(model, seqs["c"], keep=3))


@pytest.mark.parametrize("gather", [False, True])
def test_the_step_compiles_whole_with_no_host_sync(model, gather):
    """``fullgraph=True`` raises on a graph break or a host read (``.item()``, a branch on a
    value): what a CUDA graph capture would choke on."""
    runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    runner.run([Feed("a", list(range(1, 12)), 1), Feed("b", [4, 5], 1)])
    bucket = SMALL.prefill(2, 6, 20) if gather else SMALL.decode(2, 2, 20)
    rows = [FedRow(0 if gather else 1, 1, 2, [7, 8], 2)] if gather else [FedRow(1, 1, 2, [7, 8], 2)]
    torch._dynamo.reset()
    compiled = torch.compile(runner.step.run, fullgraph=True, backend="aot_eager")
    with torch.inference_mode():
        runner.step.load(bucket, rows)
        eager = runner.step.run(bucket).clone()
        runner.step.load(bucket, rows)  # the step rewrote the same keys: the same inputs again
        traced = compiled(bucket)
    torch.testing.assert_close(traced, eager, atol=1e-6, rtol=1e-6)


def test_the_static_buffers_never_move(model):
    runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    addresses = lambda: [t.data_ptr() for t in (runner.step.inputs, *runner.cache.keys, *runner.cache.values)]  # noqa: E731
    before = addresses()
    views = {}
    for left, feeds in _script(11, model.config.vocab_size):
        runner.release(*left)
        runner.run(feeds)
        for bucket, view in runner.step._views.items():
            views.setdefault(bucket, {k: v.data_ptr() for k, v in view.items()})
            assert {k: v.data_ptr() for k, v in view.items()} == views[bucket]
    runner.release(*list(runner.order))  # idle: the cache stays
    assert addresses() == before and runner.cache.keys[0].shape[0] == SMALL.max_rows + 1


def test_a_row_outgrowing_the_cache_leaves_the_static_path_and_stays_correct(model):
    runner = GraphRunner(model, buckets=Buckets(capacity=24, decode_rows=(1, 2), decode_widths=(1, 4),
                                                prefill_rows=(1,), prefill_widths=(8,)), prefix_cache_bytes=0)
    runner.run([Feed("a", list(range(1, 20)), 1)])
    assert runner.static_off is None
    out = runner.run([Feed("a", list(range(1, 30)), 2)])
    assert runner.static_off and "outgrew" in runner.static_off
    assert close(out[0], solo(model, list(range(1, 30)), keep=2))
    runner.run([Feed("b", [1, 2], 1), Feed("c", [3], 1)])  # a third row: more than any bucket holds
    assert close(runner.run([Feed("c", [3, 4], 1)])[0], solo(model, [3, 4]))


def test_a_step_run_ahead_from_device_tokens_equals_one_fed_from_the_host(model):
    """``run_ahead`` feeds each row a token it reads from a tensor (never the host's copy): the same
    logits as ``run`` feeding those tokens, the held tokens settled after; a row whose token is -1
    (nothing was allowed) drops the position; off the static path it runs nothing."""
    ahead = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    in_turn = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0)
    seqs = {"a": list(range(10, 30)), "b": [5, 6, 7], "c": [8, 9, 4, 4]}
    for runner in (ahead, in_turn):
        runner.run([Feed(row, seq, 1) for row, seq in seqs.items()])
    for tokens in ([11, 12, 13], [0, 7, model.config.vocab_size - 1]):
        order = ["c", "a", "b"]
        logits, offsets = ahead.run_ahead(order, torch.tensor(tokens))
        assert all(ahead.tokens[row][-1] == PENDING for row in order)
        ahead.settle(dict(zip(order, tokens, strict=True)))
        for row, token in zip(order, tokens, strict=True):
            seqs[row] = seqs[row] + [token]
        want = in_turn.run([Feed(row, seqs[row], 1) for row in order])
        for row, expected in zip(order, want, strict=True):
            assert close(logits[offsets[row]:offsets[row] + 1], expected), row
        assert ahead.tokens == in_turn.tokens
    ahead.run_ahead(["b"], torch.tensor([-1]))
    ahead.settle({"b": -1})
    assert ahead.tokens["b"] == seqs["b"]
    ahead.leave_static("a test")
    assert ahead.run_ahead(["a"], torch.tensor([3])) is None and ahead.tokens["a"] == seqs["a"]


@pytest.mark.parametrize("family", ["gemma3_text", "mistral"])
def test_static_steps_attend_within_a_sliding_window(family):
    """Rows past a sliding window of 5 through the static steps (prefill and decode buckets, several
    kept positions, rows joining and leaving), each step against the model's own forward."""
    from tests.models.test_ragged import _windowed, windowed_script

    model = _windowed(family)
    runner = GraphRunner(model, buckets=SMALL, prefix_cache_bytes=0, graphs=False)
    assert windowed_script(model, runner) == 6
    assert runner.eager_steps > 0 and runner.static_off is None  # the static steps ran, not the ragged ones
