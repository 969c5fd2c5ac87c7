"""BatchRunner mechanics on a tiny random Llama: every row's logits equal a solo run's, through
ragged feeds, joins, leaves, crops (holes) and compaction."""

import pytest
import torch

from cdsl_struct.models.batch import BatchRunner, Feed
from tests.models.solo import close, solo


def test_rows_of_different_lengths_match_solo_runs(model):
    runner = BatchRunner(model)
    seqs = {"a": [1, 2, 3, 4, 5, 6, 7], "b": [9, 8], "c": [4]}
    out = runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    for (row, seq), logits in zip(seqs.items(), out, strict=True):
        assert close(logits, solo(model, seq)), row
    assert runner.rows == 3 and runner.passes == 2  # one prefill pass for the new rows, one step


def test_speculation_crop_join_leave_and_compaction(model):
    runner = BatchRunner(model)
    a, b = [1, 2, 3, 4], [7, 7, 8]
    runner.run([Feed("a", a, 1), Feed("b", b, 1)])
    # row a speculates three tokens and keeps one; row b keeps both of two
    out = runner.run([Feed("a", a + [5, 6, 7], 4), Feed("b", b + [9, 10], 3)])
    assert close(out[0], solo(model, a + [5, 6, 7], keep=4))
    a, b = a + [5, 11], b + [9, 10, 12]  # a's rejected tail becomes a hole
    runner.run([Feed("c", [3, 3, 3, 3, 3, 3, 3, 3, 3, 3], 1)])  # a longer row joins: the others are left-padded
    out = runner.run([Feed("a", a, 1), Feed("b", b, 2), Feed("c", [3] * 10 + [4], 1)])
    assert close(out[0], solo(model, a)) and close(out[1], solo(model, b, keep=2))
    assert close(out[2], solo(model, [3] * 10 + [4]))
    runner.release("c")
    assert runner.rows == 2 and runner.held("a") == a
    before = runner.physical_length
    runner.compact()
    assert runner.physical_length <= before and runner.physical_length == max(len(a), len(b))
    out = runner.run([Feed("a", a + [13], 1), Feed("b", b + [14], 1)])
    assert close(out[0], solo(model, a + [13])) and close(out[1], solo(model, b + [14]))
    runner.release("a")
    runner.release("b")
    assert runner.rows == 0 and runner.cache is None


def test_unfed_rows_keep_their_cache(model):
    runner = BatchRunner(model)
    runner.run([Feed("a", [1, 2, 3], 1), Feed("b", [4, 5], 1)])
    runner.run([Feed("a", [1, 2, 3, 6], 1)])  # b sits this step out
    out = runner.run([Feed("b", [4, 5, 6], 1)])
    assert close(out[0], solo(model, [4, 5, 6]))


def test_bad_feeds_are_refused(model):
    from cdsl_struct.errors import CdslError

    runner = BatchRunner(model)
    with pytest.raises(CdslError):
        runner.run([Feed("a", [1, 2], 3)])
    with pytest.raises(CdslError):
        runner.run([Feed("a", [1, 2], 1), Feed("a", [1, 2], 1)])


def test_kv_bytes_per_token(model):
    # 2 (keys, values) x 2 layers x 2 kv heads x head_dim 8 x 4 bytes
    assert BatchRunner(model).kv_bytes_per_token() == 2 * 2 * 2 * 8 * 4


def test_rows_reuse_a_stored_prefix_and_still_match_solo_runs(model):
    runner = BatchRunner(model)
    shared = [5, 6, 7, 8, 9, 10, 11]
    runner.run([Feed("a", shared + [1, 2], 1)])
    fed = runner.positions
    out = runner.run([Feed("a", shared + [1, 2, 3], 1), Feed("b", shared + [4, 4, 4], 1), Feed("c", [9, 9], 1)])
    assert runner.prefixes.hits >= 1 and runner.prefixes.reused_positions >= len(shared)
    assert runner.positions - fed < 2 + 9 + 2  # b's shared prefix was copied, not recomputed
    for logits, seq in zip(out, (shared + [1, 2, 3], shared + [4, 4, 4], [9, 9]), strict=True):
        assert close(logits, solo(model, seq))


def test_prefix_cache_keeps_the_longest_and_evicts_by_bytes():
    from cdsl_struct.models.prefix_cache import PrefixCache

    def kv(n):
        return [(torch.ones(1, 2, n, 4), torch.ones(1, 2, n, 4))]

    cache = PrefixCache(max_bytes=2 * 2 * 2 * 10 * 4 * 4)  # room for 20 positions
    cache.store([1, 2, 3], kv(3))
    cache.store([1, 2, 3, 4, 5], kv(5))  # supersedes [1, 2, 3]
    assert list(cache.entries) == [(1, 2, 3, 4, 5)]
    cache.store([1, 2], kv(2))  # already covered
    assert len(cache.entries) == 1
    length, found = cache.lookup([1, 2, 3, 9])
    assert length == 3 and found[0][0].shape == (1, 2, 3, 4)
    cache.store([7] * 16, kv(16))  # 21 positions in all: the least recently used goes
    assert list(cache.entries) == [(7,) * 16] and cache.lookup([1, 2]) == (0, None)


def test_attention_counts_the_padding_it_reads(model):
    runner = BatchRunner(model, prefix_cache_bytes=0)
    runner.run([Feed("a", [1, 2, 3, 4, 5, 6, 7], 1)])
    assert runner.attended_valid == runner.attended_slots > 0  # one row: no padding
    runner.run([Feed("a", [1, 2, 3, 4, 5, 6, 7, 8], 1), Feed("b", [9, 8], 1)])
    slots, valid = runner.attended_slots, runner.attended_valid
    assert valid < slots  # "b" is left-padded to "a"'s length in the step pass
    assert slots - valid == runner.physical_length - len(runner.slots["b"])
