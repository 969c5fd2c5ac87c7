"""``freeze_loaded_objects``: what loading left as garbage is collected, the rest frozen out of
every later full collection."""

import gc
import weakref

from cdsl_struct.heap import freeze_loaded_objects


class _Node:
    pass


def test_garbage_is_collected_first_and_the_survivors_are_frozen():
    gc.disable()  # only the function under test may collect
    try:
        cycle = _Node()
        cycle.itself = cycle
        dead = weakref.ref(cycle)
        del cycle
        kept = [[index] for index in range(1000)]
        assert dead() is not None  # a cycle: only the collector frees it
        frozen = freeze_loaded_objects()
        assert dead() is None
        # other threads (an earlier test's server, ray) may free frozen objects, never add any
        assert frozen >= gc.get_freeze_count() >= len(kept)
        oldest = {id(item) for item in gc.get_objects(generation=2)}
        assert not any(id(item) in oldest for item in kept)  # a full collection no longer walks them
    finally:
        gc.unfreeze()
        gc.enable()
    assert gc.get_freeze_count() == 0
