"""Rows stepped by a strategy's program (CDLH, CDSL): the engine's side of ``decoding.strategy``.

``Programs`` starts each such row's step program, runs the draft passes the programs ask for (one
batched forward per draft model over every row drafting on it, repeated until no row waits for a
draft pass) and turns what they ask of the target into feeds of the engine's one target forward,
then hands each row its logits back. A row's local keys become keys of the shared runners: its
own sequence is its ``row_id``, a branch ``(row_id, local key)``. Branches live while they are
fed: before each target forward, those the last one fed and this one does not are released.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from ..models.batch import BatchRunner, Feed
from ..models.int8 import token_scaled
from ..models.ragged import RaggedRunner
from ..models.runner import ModelRunner
from ..models.self_check import batch_runner
from .strategy import MAIN, Passes

#: prompt prefixes a draft runner keeps (the draft is small; its prefills are cheap to redo)
DRAFT_PREFIX_CACHE_BYTES = 64 * 2**20


def _key(row: Any, local: Hashable) -> Hashable:
    return row.row_id if local is MAIN else (row.row_id, local)


def _engine_feeds(row: Any, passes: Passes) -> list[Feed]:
    return [Feed(_key(row, f.row), f.sequence, f.keep, None if f.parent is None else _key(row, f.parent))
            for f in passes.feeds]


class Programs:
    """The step programs of the engine's strategy rows, and the draft runners they share.

    ``fail(row, error)`` ends a row whose program raised (that row only)."""

    def __init__(self, target: BatchRunner | RaggedRunner, fail: Callable[[Any, BaseException], None]) -> None:
        self.target = target
        self.fail = fail
        self.drafts: dict[int, BatchRunner | RaggedRunner] = {}
        self.solo_drafts: dict[Hashable, ModelRunner] = {}
        """Per row, on a draft whose rows cannot share a batch (``_batch_invariant``)."""
        self._invariant: dict[int, bool] = {}
        self.shared_prefixes: list[list[int]] = []
        """Prompt prefixes many requests start with (``share_prefix``)."""
        self._shared_on: dict[int, int] = {}  # per draft runner, how many of them it has prefilled

    def share_prefix(self, tokens: Sequence[int]) -> None:
        """A prompt prefix many requests will start with (a chat template's header): each draft
        runner prefills it once, in a pass of its own, at its next draft pass (on the engine's
        thread), and rows starting with it copy it (``RaggedRunner.share_prefix``; the target's and
        float drafts' prefix caches find such prefixes by themselves)."""
        if len(tokens) > 1:
            self.shared_prefixes.append(list(tokens))

    def begin(self, row: Any) -> list[int] | None:
        """Start the row's next step; its committed tokens if the step ended at once, else None."""
        row.program = row.request.strategy.steps(row.session)
        return self._send(row, None)

    def run_drafts(self, rows: Sequence[Any]) -> list[tuple[Any, list[int]]]:
        """Run the draft passes ``rows`` ask for, batched per draft model, until none asks for one;
        the rows whose step ended meanwhile, with their committed tokens."""
        ended = []
        while True:
            drafting = [r for r in rows if r.program is not None and r.pending.draft is not None]
            if not drafting:
                return ended
            groups: dict[int, list[Any]] = {}
            for row in drafting:
                groups.setdefault(id(row.pending.draft), []).append(row)
            for group in groups.values():
                model = group[0].pending.draft
                if self._batch_invariant(model):
                    ended += self._draft_pass(group, model)
                else:
                    for row in group:
                        ended += self._solo_draft_pass(row, model)

    def target_feeds(self, rows: Sequence[Any], idle: Sequence[Any] = ()) -> list[list[Feed]]:
        """What each of ``rows`` asks of the engine's next target forward. Branches no longer fed,
        and all of those of the strategy rows that feed nothing (``idle``), are released first, in
        one copy of the cache (a held row costs its share of every forward, fed or not)."""
        feeds = [_engine_feeds(row, row.pending) for row in rows]
        stale: set[Hashable] = set()
        for row, row_feeds in zip(rows, feeds, strict=True):
            fed = {f.row for f in row_feeds} - {row.row_id}
            stale |= row.branches - fed
            row.branches = fed
        for row in idle:
            stale |= row.branches
            row.branches = set()
        if stale:
            self.target.release(*stale)
        return feeds

    def deliver(self, row: Any, logits: list[torch.Tensor]) -> list[int] | None:
        """Hand ``row`` the logits of its target feeds; its committed tokens if its step ended, else None."""
        return self._send(row, logits)

    def release(self, row: Any) -> None:
        """Forget every cache ``row`` holds here (it has ended)."""
        if row.program is not None:
            row.program.close()
            row.program = row.pending = None
        if row.branches:
            self.target.release(*row.branches)
            row.branches = set()
        self.solo_drafts.pop(row.row_id, None)
        for runner in self.drafts.values():
            runner.release(row.row_id)

    def _send(self, row: Any, value: list[torch.Tensor] | None) -> list[int] | None:
        try:
            row.pending = row.program.send(value)
        except StopIteration as stop:
            row.program = row.pending = None  # its branches go at the next target_feeds
            return list(stop.value or [])
        if not isinstance(row.pending, Passes) or not row.pending.feeds:
            raise TypeError(f"a step program must yield Passes with at least one feed, got {row.pending!r}")
        return None

    def _batch_invariant(self, model: Any) -> bool:
        """Whether a row's logits from ``model`` do not depend on the rows batched with it. Not so
        for dynamically quantised models (the int8 self-draft): they scale activations over the
        whole batch, so their rows draft one at a time, each on a ``ModelRunner`` of its own (as a
        sequence decoded alone: the same chunks, so the same activation scales)."""
        if id(model) not in self._invariant:
            from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

            self._invariant[id(model)] = not any(isinstance(m, DynamicLinear) for m in model.modules())
        return self._invariant[id(model)]

    def _draft_pass(self, rows: list[Any], model: Any) -> list[tuple[Any, list[int]]]:
        """One batched forward of ``model`` for the draft feeds of ``rows``."""
        if id(model) not in self.drafts:
            # made on the first draft pass, a request's path: no CUDA graphs to capture there. No
            # prefix cache for a token-scaled int8 draft: a prompt's keys computed in another request's
            # chunks differ by float rounding, which int8 rounding turns into different drafts
            cache_bytes = 0 if token_scaled(model) else DRAFT_PREFIX_CACHE_BYTES
            self.drafts[id(model)] = batch_runner(model, self.target.pad_token_id, name="draft", graphs=False,
                                                  prefix_cache_bytes=cache_bytes)
        runner = self.drafts[id(model)]
        if isinstance(runner, RaggedRunner):
            for prefix in self.shared_prefixes[self._shared_on.get(id(model), 0):]:
                runner.share_prefix(prefix)
            self._shared_on[id(model)] = len(self.shared_prefixes)
        feeds = [_engine_feeds(row, row.pending) for row in rows]
        started = time.perf_counter()
        logits = runner.run([f for row_feeds in feeds for f in row_feeds])
        seconds = time.perf_counter() - started
        parts, positions, offset = [], [], 0
        for row_feeds in feeds:
            parts.append(logits[offset:offset + len(row_feeds)])
            offset += len(row_feeds)
            positions.append(sum(runner.last_fed[f.row] + runner.last_prefilled.get(f.row, 0) for f in row_feeds))
        return self._hand_back(rows, parts, positions, seconds)

    def _solo_draft_pass(self, row: Any, model: Any) -> list[tuple[Any, list[int]]]:
        """The draft feeds of ``row`` through its own runner of ``model``."""
        runner = self.solo_drafts.setdefault(row.row_id, ModelRunner(model, name="draft"))
        before, started = runner.positions, time.perf_counter()
        logits = [runner.run(f.sequence, f.keep) for f in row.pending.feeds]
        return self._hand_back([row], [logits], [runner.positions - before], time.perf_counter() - started)

    def _hand_back(self, rows: list[Any], parts: list[list[torch.Tensor]], positions: list[int],
                   seconds: float) -> list[tuple[Any, list[int]]]:
        """Count each row's draft pass and send it its logits; the rows whose step ended."""
        ended = []
        for row, part, fed in zip(rows, parts, positions, strict=True):
            stats = row.session.stats
            stats.draft_passes += 1
            stats.draft_positions += fed
            stats.draft_seconds += seconds
            try:
                committed = self._send(row, part)
            except Exception as exc:  # noqa: BLE001 - the row ends with its own error
                self.fail(row, exc)
                continue
            if committed is not None:
                ended.append((row, committed))
        return ended
