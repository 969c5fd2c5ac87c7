"""Buckets and packing: the host's side of a static step, pure data."""

import numpy as np
import pytest

from cdsl_struct.runners.plan import Bucket, Buckets, FedRow, pack


def test_a_step_takes_the_smallest_bucket_that_holds_it():
    buckets = Buckets(capacity=2048)
    assert buckets.lengths == (256, 512, 1024, 2048)
    assert buckets.decode(3, 2, 300) == Bucket(4, 4, 512)
    assert buckets.decode(17, 1, 10) == Bucket(24, 1, 256)
    assert buckets.decode(64, 16, 2048) == Bucket(64, 16, 2048)
    assert buckets.decode(65, 1, 10) is None and buckets.decode(1, 17, 10) is None
    assert buckets.decode(1, 1, 2049) is None
    assert buckets.prefill(2, 100, 400) == Bucket(4, 256, 512, gather=True)
    assert Buckets(capacity=600).lengths == (256, 512, 600)
    assert Buckets(capacity=100).lengths == (100,)


def test_every_bucket_is_listed_once_largest_first():
    buckets = Buckets.up_to(48, 1024)
    listed = buckets.all()
    assert len(listed) == len(set(listed)) == (8 * 4 + 3 * 2) * 3  # rows x widths x lengths, both kinds
    sizes = [b.tokens * b.length for b in listed]
    assert sizes == sorted(sizes, reverse=True) and listed[0] == Bucket(8, 256, 1024, gather=True)
    assert Buckets.up_to(3, 512).decode_rows == (1, 2, 3) and Buckets.up_to(3, 512).prefill_rows == (1, 3)


def test_packing_pads_into_the_spare_slot_and_keeps_the_last_positions():
    bucket = Bucket(4, 4, 256)
    rows = [FedRow(0, 0, 5, [11, 12, 13], 2), FedRow(2, 2, 9, [21], 1)]
    buffer, kept = pack(bucket, rows, spare=7)
    ids, positions, write_slots, write_positions, kept_at = (buffer[i * 16:(i + 1) * 16].reshape(4, 4)
                                                             for i in range(5))
    row_slots = buffer[80:]
    assert buffer.size == bucket.size == 84 and kept == 3
    assert ids.tolist() == [[11, 12, 13, 0], [0] * 4, [21, 0, 0, 0], [0] * 4]
    # a real row's padding sees its last real position; a padded row sees position 0
    assert positions.tolist() == [[5, 6, 7, 7], [0] * 4, [9, 9, 9, 9], [0] * 4]
    assert write_slots.tolist() == [[0, 0, 0, 7], [7] * 4, [2, 7, 7, 7], [7] * 4]
    assert write_positions.tolist() == [[5, 6, 7, 3], [0, 1, 2, 3], [9, 1, 2, 3], [0, 1, 2, 3]]
    assert kept_at.reshape(-1)[:3].tolist() == [1, 2, 8]  # flat indices, rows in the order given
    assert row_slots.tolist() == [0, 7, 2, 7]


def test_packing_into_a_reused_buffer_leaves_nothing_of_the_last_step():
    out = np.full(200, 99, dtype=np.int64)
    first, _ = pack(Bucket(2, 4, 256), [FedRow(1, 1, 3, [5, 6, 7, 8], 4)], spare=3, out=out)
    fresh, _ = pack(Bucket(2, 4, 256), [FedRow(0, 0, 1, [9], 1)], spare=3)
    again, _ = pack(Bucket(2, 4, 256), [FedRow(0, 0, 1, [9], 1)], spare=3, out=out)
    assert again[:4 * 8].tolist() == fresh[:4 * 8].tolist()  # ids, positions and writes: the kept tail is unread
    assert again[5 * 8:].tolist() == fresh[5 * 8:].tolist()


@pytest.mark.parametrize("capacity", [64, 256])
def test_default_buckets_fit_the_capacity(capacity):
    buckets = Buckets.up_to(64, capacity)
    assert max(b.length for b in buckets.all()) == capacity
