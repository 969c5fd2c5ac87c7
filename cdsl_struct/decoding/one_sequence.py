"""``decode``: one sequence on an engine and a padded runner of its own, built for the call
(deprecated: ``Generator`` and the engine itself are the paths to use)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence

from ..constraints import CompiledConstraint
from ..models.batch import BatchRunner
from ..models.runner import ModelRunner
from ..result import Result
from .engine import BatchEngine
from .loop import Proposer
from .rows import Request
from .sampling import SamplingParams
from .strategy import Strategy


def decode(target: ModelRunner, compiled: CompiledConstraint, prompt: Sequence[int], *,
           proposers: Sequence[Proposer] = (), k: int = 4, max_tokens: int = 256, params: SamplingParams | None = None,
           on_tokens: Callable[[list[int]], None] | None = None, strategy: Strategy | None = None,
           cancel: threading.Event | None = None, on_budget: str = "cut") -> Result:
    """Decode one sequence as a batch of one on an engine and a padded runner of its own, built for
    this call, in this thread. Deprecated: it warns, and works as before for one release.

    Use the path ``Generator`` and ``serve`` run: ``cdsl_struct.Generator`` (``generate``), or by
    hand a ``BatchEngine`` on ``models.batch_runner(model)`` (the ragged runner where the model
    supports it), kept for many requests: ``engine.run([Request(prompt, compiled, ...)])``, whose
    ``Request`` takes these same arguments (``cancel`` is its ``cancel_event``).

    ``proposers`` speculate (``k`` tokens per step at most, forced tokens up to ``MAX_FORCED``
    more); ``strategy`` steps the row instead (CDLH, CDSL). ``on_tokens`` receives each step's
    committed tokens; ``cancel``, once set, ends it at the next step (``finish_reason="cancelled"``).
    ``on_budget``: as ``Request``'s. The passes are added to ``target``'s counters.
    """
    warnings.warn("decoding.decode() is deprecated: it builds a padded one-row engine per call; use "
                  "cdsl_struct.Generator, or BatchEngine(batch_runner(model)).run([Request(...)])",
                  DeprecationWarning, stacklevel=2)
    request = Request(tuple(prompt), compiled, params or SamplingParams(), max_tokens, tuple(proposers), k,
                      on_tokens, cancel_event=cancel, strategy=strategy, on_budget=on_budget)
    runner = BatchRunner(target.model, target.name, prefix_cache_bytes=0)
    engine = BatchEngine(runner, max_batch_size=1, kv_budget_bytes=float("inf"), mask_workers=0,
                         adaptive_width=False)
    try:
        return engine.run([request])[0]
    finally:
        engine.close()
        target.passes += runner.passes
        target.positions += runner.positions
        target.seconds += runner.seconds
