"""The batched engine: many requests, one target forward per step (continuous batching).

Nouns as in vLLM's v1 engine: a frozen ``Request`` per sequence (what it asks), a ``Row`` the
engine owns for it (its decoding state and outcome, and the caller's handle; both in
``decoding.rows``), a ``Scheduler`` that picks which waiting rows join the running batch (FCFS,
bounded by ``max_batch_size`` and a KV memory budget; ``decoding.scheduler``), and
``BatchEngine.step`` that runs one step for every running row:

1. each row proposes (the grammar's forced tokens, prompt lookup, a draft model), advancing its
   own constraint state (``loop.propose``); a row with a ``strategy`` (CDLH, CDSL) advances its
   step program instead, whose draft passes run batched over every row drafting on the same
   model (``programs.Programs``);
2. ONE target forward for all rows (a strategy row feeds what its program asks: its sequence, or
   its branches such as CDLH's roll-outs) (``BatchRunner``: new rows prefilled first, ragged feeds
   padded), while worker threads compute the rows' pending masks (the engines release the GIL);
3. the masks of every position of every row are written in place into one preallocated packed
   bitmask (rows x positions, reused every step), copied to the device once and applied there;
   greedy choices are one argmax over all of them;
4. each row verifies and commits on its own (``loop.commit``; a strategy row's program judges its
   logits and commits or asks for another pass), rolling back its own state; the runner crops
   its KV rows on the next step.

Rows join and leave between steps. A row's failure (an exception in its proposers, constraint
or callback), its cancellation or its token budget ends that row only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ..constraints.mask import words_for
from ..errors import CdslError, RequestCancelled
from ..models.batch import BatchRunner, Feed, padded_reserve
from ..models.ragged import RaggedRunner
from ..result import DecodeStats, Result
from .ahead import Ahead, ahead_allowed, default_run_ahead, launch_ahead
from .budget import BudgetCloser
from .engine_stats import PHASES, EngineLoad, EngineStats
from .logprobs import token_logprobs
from .loop import (
    MAX_FORCED,
    Proposal,
    Session,
    commit,
    finish,
    mask_and_choose,
    propose,
    truncate,
)
from .mask_fill import fill_masks, fill_masks_together, split_mask_jobs
from .programs import Programs
from .row_logits import adjust_logits
from .rows import Request, Row
from .scheduler import DEFAULT_PREFILL_BUDGET, Scheduler, default_kv_budget, default_prefill_budget
from .stops import StopStrings
from .threads import ThreadGovernor
from .width import StepWidth

__all__ = ["DEFAULT_PREFILL_BUDGET", "PHASES", "BatchEngine", "EngineLoad", "EngineStats", "Request", "Row",
           "Scheduler", "default_kv_budget", "default_prefill_budget"]


class BatchEngine:
    """Decode many requests together; ``submit`` from any thread, ``run`` to drive to completion.

    ``max_batch_size`` bounds the rows per forward; ``kv_budget_bytes`` the padded KV cache
    (default: a quarter of the memory available on the model's device). ``mask_workers``
    threads compute masks while the forward runs (0: in the engine thread, after it).
    ``adaptive_width``: cut each step's speculation to the width a cost model of the forward
    says pays for its padding (``StepWidth``); False feeds every proposal whole.
    ``prefill_budget``: prompt positions (beyond the prefix cache) a step prefills at most; more
    waiting rows join at later steps (``Scheduler``); None admits all that fit at once; ``"auto"``
    the device's (``default_prefill_budget``).
    ``adaptive_threads``: on a CPU, give each forward the torch thread count measured cheapest now
    (``ThreadGovernor``: one thread or all, so that a neighbour taking a core does not stall the
    whole thread team); False leaves torch's setting alone.
    ``run_ahead``: launch a step of plain decode rows before reading the tokens of the step before
    it, from those tokens on the device (``decoding.ahead``), so that the host's work of a step
    runs while the device runs the next; None: ``default_run_ahead`` (where the runner replays
    CUDA graphs); never on a runner whose launched steps failed their self-check (``ahead_off``).
    ``start()`` runs the step loop on a background thread, so that requests submitted from
    many threads share steps (what ``Generator`` and the server use).
    """

    def __init__(self, runner: BatchRunner | RaggedRunner, *, max_batch_size: int = 32,
                 kv_budget_bytes: float | None = None, mask_workers: int = 2, adaptive_width: bool = True,
                 prefill_budget: int | None | str = "auto", adaptive_threads: bool = True,
                 run_ahead: bool | None = None) -> None:
        self.runner = runner
        self.width = StepWidth(padded=not getattr(runner, "ragged", False)) if adaptive_width else None
        self.threads = ThreadGovernor() if adaptive_threads and runner.device.type == "cpu" else None
        budget = kv_budget_bytes if kv_budget_bytes is not None else default_kv_budget(runner.device)
        if prefill_budget == "auto":
            prefill_budget = default_prefill_budget(runner.device)
        self.scheduler = Scheduler(max_batch_size, budget, runner.kv_bytes_per_token(), prefill_budget,
                                   self._prefill_cost, getattr(runner, "reserved_positions", padded_reserve))
        self.stats = EngineStats()
        self.programs = Programs(runner, lambda row, error: self._end(row, error=error))
        if run_ahead is None:
            run_ahead = default_run_ahead(runner)
        self.run_ahead = run_ahead and hasattr(runner, "run_ahead") and getattr(runner, "ahead_off", None) is None
        self._ahead: Ahead | None = None  # the step launched before the last read, taken by the next step
        self.ahead_steps = 0
        self._bitmask: torch.Tensor | None = None  # [rows x positions, words], reused every step
        self._mask_workers = mask_workers
        self._pool = ThreadPoolExecutor(mask_workers, thread_name_prefix="cdsl-mask") if mask_workers else None
        self._lock = threading.Condition()
        self._stepping = threading.Lock()  # one step at a time, whoever drives the engine
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self._broken: BaseException | None = None  # what killed the step loop, if anything did

    def _prefill_cost(self, row: Row) -> int:
        """Prompt positions ``row`` would prefill: those the prefix cache does not hold."""
        prompt = row.request.prompt
        prefixes = self.runner.prefixes
        return len(prompt) - (prefixes.cached_length(prompt[:-1]) if prefixes is not None else 0)

    # --- submitting ---------------------------------------------------------------------------

    def submit(self, request: Request) -> Row:
        """Queue ``request``; its ``Row`` joins the batch at a step boundary."""
        row = Row(request)
        with self._lock:  # under the lock that close() takes: no row slips in after it emptied the queue
            if self._broken is not None:
                raise CdslError(f"this engine's step loop failed ({self._broken!r}); make a new one") \
                    from self._broken
            if self._closed:
                raise CdslError("this engine is closed; make a new one (or a new Generator)")
            self.scheduler.waiting.append(row)
            self._lock.notify_all()
        return row

    def run(self, requests: Sequence[Request]) -> list[Result]:
        """Submit ``requests`` and step until all of them end (in this thread unless the engine is
        started); their Results in order. The first failed row's error is raised once all have
        ended (``run_rows`` gives every row's own outcome)."""
        return [row.wait() for row in self.run_rows(requests)]

    def run_rows(self, requests: Sequence[Request]) -> list[Row]:
        """As ``run``, but the ended Rows, each holding its ``result`` or ``error``."""
        rows = [self.submit(request) for request in requests]
        first_running = 0  # rows before it have ended: each check looks from there (not over all rows)

        def running() -> bool:
            nonlocal first_running
            while first_running < len(rows) and rows[first_running].done:
                first_running += 1
            return first_running < len(rows)

        while self._thread is None and running():
            with self._stepping:  # callers on several threads take turns stepping the one runner
                if self._thread is None and running():
                    self.step()
        for row in rows:
            row._done.wait()
        return rows

    @property
    def busy(self) -> bool:
        """Whether any row is waiting or running."""
        return bool(self.scheduler.waiting or self.scheduler.running)

    def load(self) -> EngineLoad:
        """A snapshot of the rows running and waiting (what metrics and admission read)."""
        with self._lock:
            running, waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        prefixes = self.runner.prefixes
        compiled = getattr(self.runner, "compiled", None)
        graphs = getattr(self.runner, "graphs", None)
        return EngineLoad(running, waiting, self.scheduler.max_batch_size,
                          self.stats.rows_stepped / max(1, self.stats.steps), prefixes.bytes if prefixes else 0,
                          self.stats.steps, self.stats.forward_seconds, self.stats.prefill_seconds,
                          self.runner.prefilled_positions,
                          self.runner.attended_valid / max(1, self.runner.attended_slots),
                          compiled.steps if compiled is not None else 0,
                          compiled is not None and compiled.active, getattr(self.runner, "fallback_reason", None),
                          bool(getattr(self.runner, "ragged", False)), hasattr(self.runner, "static_off"),
                          len(graphs.graphs) if graphs is not None else 0, graphs.replays if graphs is not None else 0,
                          getattr(self.runner, "static_off", None) or getattr(self.runner, "graphs_off", None),
                          self.ahead_steps)

    # --- background loop ----------------------------------------------------------------------

    def start(self) -> None:
        """Run the step loop on a daemon thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="cdsl-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the background loop after the current step; running rows stay where they are."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def close(self) -> None:
        """Stop the loop and the mask threads; the engine takes no more requests. Every request
        still in it ends, so no caller waits forever: a running row with its partial output
        (``finish_reason="cancelled"``), a waiting one with ``RequestCancelled``."""
        with self._lock:
            self._closed = True
        self.stop()
        self._ahead = None
        with self._lock:
            waiting, self.scheduler.waiting = list(self.scheduler.waiting), deque()
            running = list(self.scheduler.running)
        for row in running:
            self._end(row, reason="cancelled")
        for row in waiting:
            self._end(row)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.threads is not None:
            self.threads.restore()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self.busy and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
            try:
                with self._stepping:
                    self.step()
            except BaseException as exc:  # a failed forward: every running row gets the error
                failing = list(self.scheduler.running)
                try:
                    for row in failing:
                        self._end(row, error=exc)
                except BaseException as fatal:  # noqa: BLE001 - the loop cannot go on: nobody may wait forever
                    self._fail_everything(fatal, failing)
                    return

    def _fail_everything(self, error: BaseException, failing: list[Row]) -> None:
        """The step loop is dying: end ``failing`` and every other row, running or waiting, with
        ``error`` (no row's ``wait`` hangs), and refuse new requests."""
        with self._lock:
            self._broken = error
            self._thread = None
            rows = failing + list(self.scheduler.running) + list(self.scheduler.waiting)
            self.scheduler.running, self.scheduler.waiting = [], deque()
        for row in rows:
            if not row.done:
                row.error = error
                row._done.set()

    # --- one step -----------------------------------------------------------------------------

    def step(self) -> None:
        """Admit what fits, then one propose / forward / verify round over the running rows."""
        phases = self.stats.phase_seconds
        started = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not (self.scheduler.running and ahead.covers(self.scheduler.running)):
            ahead = None  # its rows all ended: nothing to take (a row it did not feed cannot run: admission waits)
        if ahead is None:  # a launched step admits nobody: its rows are fed already
            self._admit()
        admitted = time.perf_counter()
        phases["schedule"] += admitted - started
        rows: list[tuple[Row, Proposal]] = []
        steered: list[Row] = []
        ended: list[tuple[Row, list[int]]] = []
        for row in list(self.scheduler.running):
            if row.is_cancelled:
                self._end(row, reason="cancelled")
                continue
            request = row.request
            try:
                if ahead is not None:  # fed one token already: nothing to propose, only its mask
                    rows.append((row, propose(row.session, (), 0, request.max_tokens)))
                elif request.strategy is None:
                    rows.append((row, propose(row.session, request.proposers, request.k, request.max_tokens)))
                elif row.program is not None or (done := self.programs.begin(row)) is None:
                    steered.append(row)
                else:
                    ended.append((row, done))
            except Exception as exc:  # noqa: BLE001 - the row ends with its own error
                self._end(row, error=exc)
        ended += self.programs.run_drafts(steered)
        phases["propose"] += time.perf_counter() - admitted
        try:
            self._forward(rows, [r for r in steered if r.program is not None], ahead)
        except BaseException:
            self._ahead = None  # the rows it fed end with the error
            raise
        streamed = time.perf_counter()
        for row, committed in ended:
            self._after_commit(row, committed)
        phases["stream"] += time.perf_counter() - streamed

    def _admit(self) -> None:
        with self._lock:
            dropped = [r for r in self.scheduler.waiting if r.is_cancelled]
            for row in dropped:
                self.scheduler.waiting.remove(row)
            admitted = self.scheduler.admit()
        for row in dropped:  # cancelled before they started: they end now, not when a row frees
            self._end(row, reason="cancelled")
        for row in admitted:
            try:
                self._start(row)
            except Exception as exc:  # noqa: BLE001 - a row that cannot start ends alone, with its error
                self._end(row, error=exc)

    def _forward(self, rows: list[tuple[Row, Proposal]], steered: list[Row], ahead: Ahead | None = None) -> None:
        """One target forward for the proposing ``rows`` and the ``steered`` rows' program feeds
        (``ahead``: the forward launched for ``rows`` before the last step's read, taken instead)."""
        program_feeds: list[list[Feed]] = []
        logits: list[torch.Tensor] = []  # per feed: where the program rows' logits are
        if ahead is None:
            if self.width is not None and rows:
                width = self.width.choose([p for _, p in rows])
                for row, proposal in rows:
                    truncate(row.session, proposal, width - 1)
            feeds = [Feed(r.row_id, r.session.sequence + p.tokens, len(p.tokens) + 1) for r, p in rows]
            idle = [r for r in self.scheduler.running if r.request.strategy is not None and r not in steered]
            program_feeds = self.programs.target_feeds(steered, idle)
            if not feeds and not steered:
                return
        elif not rows:
            return
        mask_before = sum(r.session.state.mask_seconds for r, _ in rows)
        blocks = self._mask_blocks(rows)
        pending = self._masks_async(rows, blocks)
        if ahead is None:
            logits, flat, starts, forward, positions, prefill = self._run_forward(feeds, program_feeds)
        else:  # its launch was counted in the step that launched it
            flat, starts = ahead.logits, [ahead.offsets[r.row_id] for r, _ in rows]
            forward, positions, prefill = ahead.seconds, len(rows), 0.0
            self.ahead_steps += 1
        masks_ok = self._wait_masks(rows, blocks, pending, mask_before)
        self.stats.steps += 1
        self.stats.rows_stepped += len(rows) + len(steered)
        self.stats.positions += positions
        self.stats.forward_seconds += forward
        self.stats.prefill_seconds += prefill
        offset = len(rows)
        for row, row_feeds in zip(steered, program_feeds, strict=True):
            part, offset = logits[offset:offset + len(row_feeds)], offset + len(row_feeds)
            self._count_pass(row, sum(self.runner.last_fed[f.row] for f in row_feeds), forward)
            try:
                committed = self.programs.deliver(row, part)
            except Exception as exc:  # noqa: BLE001
                self._end(row, error=exc)
                continue
            if committed is not None:
                self._after_commit(row, committed)
        rows_at = [(r, p, start) for (r, p), start, ok in zip(rows, starts[:len(rows)], masks_ok, strict=True) if ok]
        if rows_at:
            used = sum(len(p.masks) for _, p in rows)
            masks = self._bitmask[:used] if all(masks_ok) else torch.cat(
                [block for block, ok in zip(blocks, masks_ok, strict=True) if ok])
            may_run_ahead = self.run_ahead and not steered and ahead_allowed(rows_at, self.scheduler, flat.shape[0])
            self._commit_all(rows_at, forward, flat, masks, may_run_ahead)

    def _run_forward(self, feeds: list[Feed], program_feeds: list[list[Feed]]
                     ) -> tuple[list[torch.Tensor], torch.Tensor, list[int], float, int, float]:
        """Run the step's forward: (each feed's logits, the flat logits, each feed's first row in them,
        seconds, positions fed beyond prefill, prefill seconds)."""
        threads = self.threads.before_step() if self.threads is not None else 0
        started = time.perf_counter()
        logits = self.runner.run(feeds + [f for row_feeds in program_feeds for f in row_feeds])
        flat, starts = self.runner.last_flat  # before a program's passes (if any) run the runner again
        forward = time.perf_counter() - started
        self.stats.phase_seconds["forward"] += forward
        if self.threads is not None:
            self.threads.after_step(threads, forward - self.runner.last_prefill_seconds, self.runner.last_positions,
                                    sum(self.runner.last_prefilled.values()))
        if self.width is not None:
            self.width.observe_pass(self.runner.last_positions, forward - self.runner.last_prefill_seconds)
        return logits, flat, starts, forward, sum(self.runner.last_fed.values()), self.runner.last_prefill_seconds

    def _start(self, row: Row) -> None:
        request = row.request
        row.started_at = time.perf_counter()
        row.stops = StopStrings(request.stop) if request.stop else None
        row.session = Session(list(request.prompt), request.compiled, request.compiled.new_state(), request.params,
                              request.params.generator(self.runner.device), DecodeStats(),
                              max_tokens=request.max_tokens,
                              budget=BudgetCloser() if request.on_budget == "close" else None)

    def _mask_blocks(self, rows: list[tuple[Row, Proposal]]) -> list[torch.Tensor]:
        """Each row's rows of the engine's preallocated bitmask (one per position it feeds, in feed
        order, zeroed), grown when a step needs more; the masks are written into them in place."""
        sizes = [len(p.masks) for _, p in rows]
        words = max((words_for(r.session.compiled.vocab_size) for r, _ in rows), default=0)
        need = sum(sizes)
        if self._bitmask is None or self._bitmask.shape[0] < need or self._bitmask.shape[1] != words:
            capacity = max(need, self.scheduler.max_batch_size * (2 + MAX_FORCED))
            # pinned where the masks cross to a GPU, so the copy is asynchronous (the read of the
            # step's choices waits for it, before the next step refills the buffer)
            self._bitmask = torch.zeros((capacity, words), dtype=torch.int32,
                                        pin_memory=self.runner.device.type == "cuda")
        self._bitmask[:need].zero_()
        return list(torch.split(self._bitmask[:need], sizes)) if rows else []

    def _masks_async(self, rows: list[tuple[Row, Proposal]], blocks: list[torch.Tensor]) -> list[Any]:
        """Queue the rows' deferred masks on the mask threads: the llguidance rows whose masks are
        all deferred in one task that llguidance spreads over its own threads, the rest one task per
        thread (a task per row cost more in hand-offs than its mask at 64 rows); each task's
        ``(row index, error)`` pairs come back."""
        if self._pool is None or not rows:
            return []
        together, alone = split_mask_jobs(list(enumerate(zip(rows, blocks, strict=True))))
        futures = [self._pool.submit(fill_masks_together, together, self._bitmask)] if together else []
        if alone:
            chunk = -(-len(alone) // self._mask_workers)
            futures += [self._pool.submit(fill_masks, alone[start:start + chunk])
                        for start in range(0, len(alone), chunk)]
        return futures

    def _wait_masks(self, rows: list[tuple[Row, Proposal]], blocks: list[torch.Tensor], pending: list[Any],
                    before: float) -> list[bool]:
        """Finish every row's masks (a row whose constraint raised ends with that error); ``before``:
        the rows' mask time when the step's masks were queued."""
        started = time.perf_counter()
        errors: list[BaseException | None] = [None] * len(rows)
        if pending:
            done = [pair for future in pending for pair in future.result()]
        else:
            together, alone = split_mask_jobs(list(enumerate(zip(rows, blocks, strict=True))))
            done = (fill_masks_together(together, self._bitmask) if together else []) + fill_masks(alone)
        for index, error in done:
            errors[index] = error
        for (row, _), error in zip(rows, errors, strict=True):
            if error is not None:
                self._end(row, error=error)
        after = sum(r.session.state.mask_seconds for r, _ in rows)
        waited = time.perf_counter() - started
        self.stats.mask_wait_seconds += waited
        self.stats.phase_seconds["masks"] += waited
        self.stats.mask_seconds += after - before
        return [error is None for error in errors]

    @torch.inference_mode()  # the runner's logits are inference tensors, masked in place
    def _commit_all(self, rows: list[tuple[Row, Proposal, int]], forward: float, logits: torch.Tensor,
                    masks: torch.Tensor, may_run_ahead: bool = False) -> None:
        """Mask every position of every row and choose greedily (and draw each sampling row's last
        token and judge what it proposed) in a few ops over all of them, in place in the runner's
        ``logits`` (row ``start`` on: each row's positions; ``masks`` theirs, in row order), with one
        read back of the choices; then verify and commit row by row. ``may_run_ahead``: launch the
        next step from the choices before that read (``decoding.ahead``)."""
        phases = self.stats.phase_seconds
        started = time.perf_counter()
        spans = [(start, start + len(proposal.tokens) + 1) for _, proposal, start in rows]
        moves = adjust_logits(rows, spans, logits)  # penalties, loop bans; the string guard's moves after the masks
        # a sampling row's token after its last proposed one, drawn with the argmaxes, and its verdict
        # on what it proposed, judged with them (one read)
        sampling = [(row, proposal, start, end) for (row, proposal, _), (start, end) in zip(rows, spans, strict=True)
                    if not row.session.params.greedy]
        draws = [(end - 1, row.session.params, row.session.generator) for row, _, _, end in sampling]
        # a draft distribution over another vocabulary width fails in its own row's verify, not in these bulk ops
        vocab = logits.shape[-1]
        verdicts = [(start, proposal.tokens, proposal.draft_probs, row.session.params, row.session.generator)
                    for row, proposal, start, _ in sampling
                    if proposal.tokens and all(q is None or q.shape[-1] == vocab for q in proposal.draft_probs)]
        launch_seconds = 0.0

        def launch(choices: torch.Tensor, drawn: torch.Tensor | None) -> None:
            nonlocal launch_seconds
            launched = time.perf_counter()
            self._ahead = launch_ahead(self.runner, [row for row, _, _ in rows], choices, drawn,
                                       [row_end for row_end, _, _ in draws])
            launch_seconds = time.perf_counter() - launched
        choices, drawn, judged = mask_and_choose(logits, _in_logit_order(masks, spans, logits.shape[0]), draws,
                                                 verdicts, launch if may_run_ahead else None, moves)
        drawn_at = {row_end: token for (row_end, _, _), token in zip(draws, drawn, strict=True)}
        if self._ahead is not None:  # the tokens it fed, read back now (a step of one position a row)
            fed = {row.row_id for row in self._ahead.rows}
            self.runner.settle({row.row_id: drawn_at.get(start, choices[start])
                                for row, _, start in rows if row.row_id in fed})
        verdict_at = {start: verdict for (start, *_), verdict in zip(verdicts, judged, strict=True)}
        committed_at = time.perf_counter()
        phases["forward"] += launch_seconds
        phases["sample"] += committed_at - started - launch_seconds
        streaming = 0.0
        for (row, proposal, _), (start, end) in zip(rows, spans, strict=True):
            self._count_pass(row, len(proposal.tokens) + 1, forward)
            try:
                committed = self._commit_row(row, proposal, logits[start:end], choices[start:end],
                                             drawn_at.get(end - 1), verdict_at.get(start))
            except Exception as exc:  # noqa: BLE001
                self._end(row, error=exc)
                continue
            streamed = time.perf_counter()
            self._after_commit(row, committed)
            streaming += time.perf_counter() - streamed
        phases["stream"] += streaming
        phases["commit"] += time.perf_counter() - committed_at - streaming

    def _count_pass(self, row: Row, positions: int, forward: float) -> None:
        """Count a target pass ``row`` took part in with ``positions`` of its own (and, the first
        time, its prefill: a pass of its own in a padded runner, part of this one in a ragged one)."""
        stats, prompt = row.session.stats, row.request.prompt
        if stats.target_passes == 0 and len(prompt) > 1:
            stats.target_passes += 0 if getattr(self.runner, "ragged", False) else 1
            stats.target_positions += len(prompt) - 1
            stats.prefill_seconds = self.runner.last_prefill_seconds
        stats.target_passes += 1
        stats.target_seconds += forward
        stats.target_positions += positions

    def _commit_row(self, row: Row, proposal: Proposal, masked: torch.Tensor, choices: list[int],
                    drawn: int | None = None, verdict: tuple[int, int] | None = None) -> list[int]:
        """Verify and commit one row's proposal (``drawn``, ``verdict``: a sampling row's token drawn
        and its proposal judged in bulk); its committed tokens."""
        session, request = row.session, row.request
        accepted_before = session.stats.accepted
        committed = commit(session, proposal, masked, choices, drawn, verdict)
        if self.width is not None:
            self.width.observe_verdict(proposal.drafted, max(0, session.stats.accepted - accepted_before
                                                             - proposal.forced))
        if committed and request.logprobs is not None:
            session.logprobs = (session.logprobs or []) + token_logprobs(
                masked, committed, session.params, request.logprobs, session.compiled.vocabulary)
        return committed

    def _after_commit(self, row: Row, committed: list[int]) -> None:
        """What follows every commit: stop strings, the caller's callback, and the row's end
        (stop string, dead end, the constraint finished, or the token budget spent)."""
        session = row.session
        try:
            stopped = bool(committed) and row.stops is not None and row.stops.end(session)
            if committed and row.request.on_tokens is not None:
                row.request.on_tokens(committed)
        except Exception as exc:  # noqa: BLE001
            self._end(row, error=exc)
            return
        if stopped:
            self._end(row, reason="stop_string")
        elif not committed:
            self._end(row, reason="constraint_dead_end")
        elif session.state.finished or len(session.output) >= row.request.max_tokens:
            self._end(row)

    def _end(self, row: Row, *, reason: str | None = None, error: BaseException | None = None) -> None:
        """Take ``row`` out of the batch with its Result or error."""
        with self._lock:
            if row in self.scheduler.running:
                self.scheduler.running.remove(row)
        if row.done:
            return
        self.runner.release(row.row_id)
        self.programs.release(row)
        if error is not None:
            row.error = error
        elif row.session is None and reason == "cancelled":  # cancelled before it started: nothing decoded
            row.result = Result(text="", tokens=[], finish_reason="cancelled", complete=False)
        elif row.session is None:
            row.error = RequestCancelled(f"request {row.request.request_id} was cancelled")
        else:
            stats = row.session.stats
            stats.decode_seconds = time.perf_counter() - row.started_at - stats.prefill_seconds
            try:
                row.result = finish(row.session, dead_end=reason == "constraint_dead_end",
                                    stopped=reason == "stop_string", cancelled=reason == "cancelled")
            except Exception as exc:  # noqa: BLE001 - e.g. a value that fails to parse: the row's error
                row.error = exc
        row._done.set()


def _in_logit_order(masks: torch.Tensor, spans: list[tuple[int, int]], positions: int) -> torch.Tensor:
    """``masks`` (the rows' positions one after another) placed at their ``spans`` of a ``positions``-row
    bitmask, every other row all allowed (another program's positions, padding): ``masks`` itself
    when the spans already lie end to end from row 0 over all of them (a ragged step's usual case)."""
    end_to_end = all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    if end_to_end and spans[0][0] == 0 and spans[-1][1] == positions:
        return masks
    full = torch.full((positions, masks.shape[1]), -1, dtype=masks.dtype)
    index = torch.tensor([i for start, end in spans for i in range(start, end)])
    return full.index_copy_(0, index, masks)
