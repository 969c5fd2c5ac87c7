"""Keep the cyclic garbage collector off what a long-running process loads once.

Loading a model and compiling its forward leaves about a million objects tracked by Python's
collector (FX graphs, dynamo's guards, inductor's kernels). Every full collection walks all of them
with the GIL held: 0.47-1.03 s measured on a 2-core machine (BENCHMARKS.md), one of them during a
200-request run, and every request in flight stalls for it. Frozen into the collector's permanent
generation they are never walked again (reference counting still frees them), so a full collection
walks only what the process made since.
"""

from __future__ import annotations

import gc


def freeze_loaded_objects() -> int:
    """Collect the garbage loading left, then freeze every surviving object; returns how many are frozen.

    For a process that owns its lifetime (a server, a bulk worker), once its model is loaded: a cycle
    among frozen objects is never collected, so a library call in someone else's process does not
    freeze. ``gc.unfreeze()`` undoes it.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
