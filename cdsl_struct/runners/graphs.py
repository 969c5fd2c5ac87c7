"""``StepGraphs``: a CUDA graph of the static step per bucket, captured once at start and replayed
while serving (SGLang's ``cuda_graph_runner`` in spirit).

Capture runs largest bucket first into one memory pool (the smaller graphs reuse its blocks), each
bucket warmed on a side stream before its capture, on inputs that are all padding (they write the
spare slot only, so capture leaves every row's keys alone). Once captured the set is sealed: a
bucket with no graph runs eagerly, never captured on a request's path. ``backend`` is
``torch.cuda`` (a test hands in a fake one).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import CdslError
from .plan import Bucket
from .step import StaticStep


class StepGraphs:
    """Captured graphs of ``step``, one per bucket, with the output tensor each replay overwrites."""

    def __init__(self, step: StaticStep, backend: Any = None) -> None:
        self.step = step
        self.cuda = backend if backend is not None else torch.cuda
        self.graphs: dict[Bucket, tuple[Any, torch.Tensor]] = {}
        self.sealed = False
        self.capture_seconds = 0.0
        self.replays = 0

    @torch.inference_mode()
    def capture(self, buckets: Sequence[Bucket], warmups: int = 2, fuse: Any = None) -> float:
        """Warm up and capture every bucket, in the order given (largest first); seconds it took.
        ``fuse``: a ``torch.compile`` backend each bucket's step is compiled with first
        (``StaticStep.fuse``; its warm-up compiles it, so nothing compiles inside a capture)."""
        if self.sealed:
            raise CdslError("a runner's graphs are captured once, at start, never while serving")
        started = time.perf_counter()
        if fuse is not None:
            for bucket in buckets:
                self.step.fuse(bucket, fuse)
        pool = self.cuda.graph_pool_handle()
        side = self.cuda.Stream()
        gc.collect()
        gc.freeze()  # each capture collects garbage: with the heap frozen that costs nothing
        # one compile a bucket, all of one function: past dynamo's default limit they would run eagerly
        limits = torch._dynamo.config.patch(recompile_limit=len(buckets) + 8,
                                            accumulated_recompile_limit=max(256, 2 * len(buckets)))
        try:
            with limits:
                for bucket in buckets:
                    self.step.load_padding(bucket)
                    side.wait_stream(self.cuda.current_stream())
                    with self.cuda.stream(side):
                        for _ in range(warmups):
                            self.step.run(bucket)
                    self.cuda.current_stream().wait_stream(side)
                    graph = self.cuda.CUDAGraph()
                    with self.cuda.graph(graph, pool=pool):
                        output = self.step.run(bucket)
                    self.graphs[bucket] = (graph, output)
                self.cuda.synchronize()
        finally:
            gc.unfreeze()
        self.sealed = True
        self.capture_seconds = time.perf_counter() - started
        return self.capture_seconds

    def replay(self, bucket: Bucket) -> torch.Tensor | None:
        """Replay ``bucket``'s graph on the inputs loaded; its output tensor (the same one every
        replay of the bucket overwrites: read it before the next), or None where the bucket has no
        graph."""
        entry = self.graphs.get(bucket)
        if entry is None:
            return None
        entry[0].replay()
        self.replays += 1
        return entry[1]
