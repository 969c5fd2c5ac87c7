"""What the batched engine decodes: a frozen ``Request`` per sequence (what it asks) and the ``Row``
the engine keeps for it (its decoding state and outcome, and the caller's handle on it)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..constraints import CompiledConstraint
from ..result import Result
from .logprobs import MAX_TOP_LOGPROBS
from .loop import MAX_FORCED, Proposer, Session
from .penalties import Penalties
from .sampling import SamplingParams
from .stops import StopStrings
from .strategy import Passes, StepProgram, Strategy

_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Request:
    """What one sequence asks of the engine: prompt ids, constraint, sampling, budget and draft
    sources; frozen (the engine keeps what changes in the request's ``Row``).

    ``proposers`` are this request's own (a draft model proposer must not be shared between
    rows: see ``DraftModelProposer.fork``). ``strategy``: a decoder that steps the row as a
    program (CDLH, CDSL; its proposers are then unused). ``on_tokens`` receives each step's
    committed tokens on the engine's thread. ``cancel_event``: once set, the row ends at the
    next step boundary.
    """

    prompt: tuple[int, ...]
    compiled: CompiledConstraint
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    proposers: tuple[Proposer, ...] = ()
    k: int = 4
    on_tokens: Callable[[list[int]], None] | None = None
    stop: tuple[str, ...] = ()
    penalties: Penalties | None = None
    loop_guard: bool = False
    string_guard: bool = False
    """End a JSON string value (a schema's answer, a tool call's arguments) where the model moves on to
    a closing bracket without its quote (``decoding.strings``)."""
    logprobs: int | None = None
    on_budget: str = "cut"
    """``"close"``: end the output validly before ``max_tokens`` cuts it (``decoding.budget``);
    ``"cut"``: stop at ``max_tokens`` wherever it is."""
    cancel_event: threading.Event | None = None
    strategy: Strategy | None = None
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")

    def __post_init__(self) -> None:
        for name in ("prompt", "proposers", "stop"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.on_budget not in ("close", "cut"):
            raise ValueError(f"on_budget must be 'close' or 'cut', got {self.on_budget!r}")
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if not self.prompt:
            raise ValueError("a request needs at least one prompt token")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")

    @property
    def sequences(self) -> int:
        """Sequences this request may hold in the cache at once: its own and its strategy's branches."""
        return 1 + (self.strategy.branches if self.strategy is not None else 0)

    @property
    def sequence_tokens(self) -> int:
        """Positions one of its sequences may need: prompt, output and one step's speculation."""
        return len(self.prompt) + self.max_tokens + self.k + MAX_FORCED + 1

    @property
    def reserved_tokens(self) -> int:
        """Positions this request may need in the cache, over all its sequences."""
        return self.sequences * self.sequence_tokens


@dataclass(eq=False)
class Row:
    """The engine's state of one submitted ``Request``, and the caller's handle on it.

    In its Result's stats, ``target_passes`` / ``target_positions`` count the batched passes the
    row took part in and its own tokens in them; ``target_seconds`` and ``prefill_seconds`` are
    the wall time of those passes, shared with the other rows (so they do not add up over rows).
    ``wait`` returns the Result or raises the row's error; ``cancel`` ends it at the next step.
    """

    request: Request
    row_id: str = field(default_factory=lambda: f"row-{next(_ids)}")
    """Keys this row's KV cache in the runner (a request submitted twice makes two rows)."""
    session: Session | None = field(default=None, repr=False)
    stops: StopStrings | None = field(default=None, repr=False)
    program: StepProgram | None = field(default=None, repr=False)
    """A strategy row's current step program, and the passes it waits for."""
    pending: Passes | None = field(default=None, repr=False)
    branches: set[Any] = field(default_factory=set, repr=False)
    """Runner keys of the branches the program fed last."""
    result: Result | None = None
    error: BaseException | None = None
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float = 0.0
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def done(self) -> bool:
        """Whether the row has ended (with its Result or its error)."""
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop this row at the next step boundary (its Result then has ``finish_reason="cancelled"``)."""
        self.cancelled = True

    @property
    def is_cancelled(self) -> bool:
        """Whether the row was cancelled, by ``cancel`` or by its request's ``cancel_event``."""
        event = self.request.cancel_event
        return self.cancelled or (event is not None and event.is_set())

    def wait(self, timeout: float | None = None) -> Result:
        """Block until the row ends; its Result, or its error raised here."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request.request_id} still running after {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result
