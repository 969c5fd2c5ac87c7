"""``GraphRunner``: the ``RaggedRunner`` interface with every step run at a static shape, replayed
from CUDA graphs on a GPU (``runners.graphs``) and run eagerly elsewhere.

A step's rows split two ways. Rows feeding at most ``Buckets.max_width`` positions (decode, drafts
to verify, forced tokens) ride ONE decode step over slots ``0..rows-1`` (row = slot), every other
running row padded in it. Rows feeding more (a joining row's prompt) run first, a few at a time, in
prefill steps that read their slots by index, chunked at the widest prefill width. Each step's
inputs travel in one host-to-device copy; the LM head then runs over the kept positions only. The
cache is a ``StaticCache`` sized once: a step needing more rows or positions than it holds leaves
the static path for good (``static_off`` says why, the log says so) and runs as a ``RaggedRunner``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ..models.ragged import RaggedRunner
from .cache import StaticCache
from .graphs import StepGraphs
from .plan import DECODE_ROWS, Bucket, Buckets, FedRow
from .step import StaticStep

logger = logging.getLogger(__name__)

#: the positions a slot holds by default (prompt and output together), at most the model's own limit
DEFAULT_CAPACITY = 2048
#: what a row's held tokens record for a token fed from the device until the host learns it (``settle``)
PENDING = -1
#: slots the cache holds at least, past the buckets' rows (a step of more rows than a bucket holds
#: runs ragged on them): the load-time self-check feeds three rows
MIN_SLOTS = 4


def default_capacity(model: Any, rows: int) -> int:
    """Positions a slot holds by default: ``DEFAULT_CAPACITY``, at most the model's own limit, and on
    a GPU at most what a quarter of its free memory holds for ``rows`` slots (in steps of 256)."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    capacity = min(DEFAULT_CAPACITY, getattr(config, "max_position_embeddings", None) or DEFAULT_CAPACITY)
    weight = model.get_output_embeddings().weight
    if weight.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(weight.device)
        heads = config.num_attention_heads
        per_position = (2 * config.num_hidden_layers * (getattr(config, "num_key_value_heads", None) or heads)
                        * (getattr(config, "head_dim", None) or config.hidden_size // heads) * weight.element_size())
        capacity = min(capacity, max(256, free // 4 // ((rows + 1) * per_position) // 256 * 256))
    return capacity


class GraphRunner(RaggedRunner):
    """A ``RaggedRunner`` whose steps run at static shapes (see the module's docstring).

    ``buckets``: the shapes (default: ``Buckets`` of up to ``max_rows`` rows (64) at ``capacity``
    positions a slot (2048, or the model's own limit where lower)). ``graphs``: capture a CUDA
    graph per bucket now (default: on a CUDA device); a capture that fails leaves the steps eager,
    with a log line (``graphs_off``). ``backend``: what captures (``torch.cuda``; tests hand in a
    fake). ``fuse``: compile each bucket's step before its capture with this ``torch.compile``
    backend (``"inductor"``: the step's ~1,400 kernels fused; ``"max-autotune"``: autotuned too;
    ``StaticStep.fuse``; default: ``CDSL_FUSE_STEPS``, else none: not yet measured on a GPU); a
    compile that fails leaves the graphs unfused, said in ``fuse_off`` and the log.
    Counters beyond the ragged runner's: ``replays`` (steps replayed from a graph) and
    ``eager_steps`` (static steps run eagerly).
    """

    def __init__(self, model: Any, name: str = "target", pad_token_id: int = 0,
                 prefix_cache_bytes: int = 256 * 2**20, *, buckets: Buckets | None = None,
                 capacity: int | None = None, max_rows: int | None = None, graphs: bool | None = None,
                 backend: Any = None, fuse: Any = None) -> None:
        super().__init__(model, name, pad_token_id, prefix_cache_bytes)
        if buckets is None:
            rows = max_rows or DECODE_ROWS[-1]
            buckets = Buckets.up_to(rows, capacity or default_capacity(model, rows))
        self.buckets = buckets
        self.cache = StaticCache.for_model(model, max(buckets.max_rows, MIN_SLOTS), buckets.capacity)
        self.step = StaticStep(model, self.cache, max(b.size for b in buckets.all()))
        self.lm_head = model.get_output_embeddings()
        self.graphs: StepGraphs | None = None
        self.graphs_off: str | None = None
        self.static_off: str | None = None
        self.fuse_off: str | None = None
        self.ahead_off: str | None = None
        """Why no step may run ahead (``run_ahead`` failed the load-time self-check), or None."""
        self.eager_steps = 0
        if graphs if graphs is not None else self.device.type == "cuda":
            self.capture(backend, fuse if fuse is not None else os.environ.get("CDSL_FUSE_STEPS") or None)

    @property
    def replays(self) -> int:
        return self.graphs.replays if self.graphs is not None else 0

    @property
    def fused(self) -> bool:
        """Whether the steps run compiled (``fuse``)."""
        return bool(self.step.fused)

    def capture(self, backend: Any = None, fuse: Any = None) -> float:
        """Capture a graph per bucket (largest first), each step compiled with ``fuse`` first where
        given; seconds it took. A failed compile captures again unfused (``fuse_off`` says why); a
        failed capture leaves the steps eager (``graphs_off`` says why)."""
        graphs = StepGraphs(self.step, backend)
        try:
            seconds = graphs.capture(self.buckets.all(), fuse=fuse)
        except Exception as exc:  # noqa: BLE001 - any capture failure: eager steps, said in the log
            if fuse is not None:
                self.unfuse(f"compiling the steps with {fuse!r} failed: {exc!r}")
                return self.capture(backend)
            self.graphs, self.graphs_off = None, f"capture failed: {exc!r}"
            logger.warning("CUDA graphs off for %s: %s", self.name, self.graphs_off)
            return 0.0
        self.graphs = graphs
        logger.info("captured %d %sCUDA graphs for %s in %.1f s", len(graphs.graphs),
                    "compiled " if self.fused else "", self.name, seconds)
        return seconds

    def unfuse(self, reason: str) -> None:
        """Run the steps uncompiled from now on (``fuse_off`` says why, the log too); a caller
        holding graphs of the compiled steps captures again."""
        self.step.fused.clear()
        self.fuse_off = reason
        logger.warning("%s's steps run uncompiled: %s", self.name, reason)

    def reset_counters(self) -> None:
        """Zero the counters (after the load-time self-check's steps)."""
        for counter in ("passes", "positions", "padded_positions", "prefilled_positions", "attended_slots",
                        "attended_valid", "eager_steps"):
            setattr(self, counter, 0)
        self.seconds = 0.0
        if self.graphs is not None:
            self.graphs.replays = 0

    def leave_static(self, reason: str) -> None:
        """Run every later step as a ``RaggedRunner`` (the cache may grow; the graphs are dropped)."""
        if self.static_off is None:
            logger.warning("%s leaves its static steps: %s", self.name, reason)
            self.static_off, self.graphs = reason, None
            self.cache.fixed = False

    def compile(self, warm_up: bool = True) -> float:
        """The static steps need no ``torch.compile`` of the forward: a no-op (0 seconds)."""
        return 0.0

    # --- a step launched before the host reads the tokens it feeds -----------------------------

    @torch.inference_mode()
    def run_ahead(self, rows: Sequence[Hashable], tokens: torch.Tensor
                  ) -> tuple[torch.Tensor, dict[Hashable, int]] | None:
        """Feed each of ``rows`` one more token, ``tokens[i]`` for ``rows[i]`` (an int64 tensor on the
        runner's device, not read here: the step's inputs are packed with a placeholder and the
        tokens written into the device buffer after the copy), as one decode step; returns the
        float32 logits of that position for every row (``[rows, vocab]``, in ``rows`` order) and each
        row's offset in them. On a GPU this is launched, not waited for: the caller reads the tokens
        of the step before (which do not depend on it) while the card runs it. Each row's held
        tokens end in ``PENDING`` until ``settle``. None where this step cannot run so (a row not
        held, the static path left, no decode bucket for it): nothing is fed then."""
        if self.static_off is not None or not rows or any(row not in self.tokens for row in rows):
            return None
        length = max(len(self.tokens[row]) for row in rows) + 1
        bucket = self.buckets.decode(self.rows, 1, length) if self.cache.fits(self.rows, length) else None
        if bucket is None:
            return None
        started = time.perf_counter()
        slots = {row: slot for slot, row in enumerate(self.order)}
        fed = [(row, FedRow(slots[row], slots[row], len(self.tokens[row]), [self.pad_token_id], 1)) for row in rows]
        parts: list[torch.Tensor] = []
        offsets: dict[Hashable, int] = {}
        self._run_static(bucket, fed, parts, offsets, 0, tokens.clamp(min=0))
        logits = self.lm_head(parts[0]).float()
        for row in rows:
            self.tokens[row].append(PENDING)
        self.passes += 1
        self.positions += len(rows)
        self.last_fed = dict.fromkeys(rows, 1)
        self.last_positions, self.last_prefill_seconds, self.last_prefilled = len(rows), 0.0, {}
        self.last_flat = (logits, [offsets[row] for row in rows])
        self.seconds += time.perf_counter() - started
        return logits, offsets

    def settle(self, tokens: dict[Hashable, int]) -> None:
        """Record the tokens ``run_ahead`` fed (read back since): a negative one (a row whose mask
        allowed nothing, which ends) drops its position instead."""
        for row, token in tokens.items():
            held = self.tokens.get(row)
            if held and held[-1] == PENDING:
                if token >= 0:
                    held[-1] = token
                else:
                    held.pop()

    # --- the ragged runner's hooks ----------------------------------------------------------------

    def _idle(self) -> None:
        """An idle runner keeps its static cache (its graphs hold its addresses)."""
        if self.static_off is not None:
            super()._idle()

    def _reserve(self, rows: int, length: int) -> None:
        if self.static_off is None and not self.cache.fits(rows, max(length, self.physical_length)):
            self.leave_static(f"{rows} rows of up to {max(length, self.physical_length)} positions outgrew the "
                              f"static cache ({self.cache.spare} slots of {self.cache.length})")
        super()._reserve(rows, length)

    def _forward(self, tails: dict[Hashable, list[int]], keeps: dict[Hashable, int]) -> tuple[torch.Tensor, dict]:
        longest = max(len(self.tokens[row]) + len(tail) for row, tail in tails.items())
        if self.static_off is None and not self.cache.fits(self.rows, longest):
            self.leave_static(f"a row of {longest} positions outgrew the static cache's {self.cache.length}")
        if self.static_off is not None or any(keeps[row] > self.buckets.chunk for row in tails):
            return super()._forward(tails, keeps)
        started = time.perf_counter()
        slots = {row: slot for slot, row in enumerate(self.order)}
        wide = [row for row, tail in tails.items() if len(tail) > self.buckets.max_width]
        narrow = [row for row, tail in tails.items() if 0 < len(tail) <= self.buckets.max_width]
        steps = self._prefill_steps(wide, tails, keeps, slots)
        if narrow:
            width = max(len(tails[row]) for row in narrow)
            length = max(len(self.tokens[row]) + len(tails[row]) for row in narrow)
            steps.append((self.buckets.decode(self.rows, width, length),
                          [(row, FedRow(slots[row], slots[row], len(self.tokens[row]), tails[row], keeps[row]))
                           for row in narrow]))
        if any(bucket is None for bucket, _ in steps):  # no bucket holds it (buckets a caller chose): ragged
            return super()._forward(tails, keeps)
        parts: list[torch.Tensor] = []
        offsets: dict[Hashable, int] = {}
        kept_so_far = 0
        for bucket, fed in steps:
            kept_so_far = self._run_static(bucket, fed, parts, offsets, kept_so_far)
        hidden = parts[0] if len(parts) == 1 else torch.cat(parts)
        logits = self.lm_head(hidden).float()
        for row, tail in tails.items():
            self.tokens[row].extend(tail)
        fed_positions = sum(len(t) for t in tails.values())
        self.passes += 1
        self.positions += fed_positions
        self.seconds += time.perf_counter() - started
        return logits, offsets

    # --- static steps ---------------------------------------------------------------------------

    def _prefill_steps(self, wide: list[Hashable], tails: dict[Hashable, list[int]], keeps: dict[Hashable, int],
                       slots: dict[Hashable, int]) -> list[tuple[Bucket | None, list[tuple[Hashable, FedRow]]]]:
        """The prefill steps of the rows feeding long tails: each tail in chunks of at most
        ``Buckets.chunk`` (the first one the shortest, so the kept positions lie in the last), a
        row's chunks in order, a few rows a step."""
        chunk, most = self.buckets.chunk, self.buckets.prefill_rows[-1]
        pieces: list[list[tuple[int, int]]] = []  # per row: (start, end) of each chunk
        for row in wide:
            count = len(tails[row])
            first = count - chunk * ((count - 1) // chunk)
            pieces.append([(0, first)] + [(s, s + chunk) for s in range(first, count, chunk)])
        steps = []
        for round_ in range(max((len(p) for p in pieces), default=0)):
            active = [(row, p[round_], p[round_] == p[-1]) for row, p in zip(wide, pieces, strict=True)
                      if round_ < len(p)]
            for at in range(0, len(active), most):
                group = active[at:at + most]
                fed = []
                for index, (row, (start, end), last) in enumerate(group):
                    held = len(self.tokens[row]) + start
                    fed.append((row, FedRow(index, slots[row], held, tails[row][start:end],
                                            keeps[row] if last else 0)))
                width = max(end - start for _, (start, end), _ in group)
                length = max(f.held + len(f.tokens) for _, f in fed)
                steps.append((self.buckets.prefill(len(group), width, length), fed))
        return steps

    def _run_static(self, bucket: Bucket, fed: list[tuple[Hashable, FedRow]], parts: list[torch.Tensor],
                    offsets: dict[Hashable, int], kept_so_far: int, last_tokens: torch.Tensor | None = None) -> int:
        """Load and run one static step (replayed where it has a graph); the hidden states of its kept
        positions join ``parts`` and each kept row's offset ``offsets``. Returns the kept count so far.
        ``last_tokens``: on the device, the last fed token of each row (each keeping one position),
        written over what ``fed`` packed."""
        kept = self.step.load(bucket, [f for _, f in fed])
        if last_tokens is not None:  # a row's last kept position is its last fed one: the same flat index as its id
            self.step.views(bucket)["ids"].view(-1).index_copy_(0, kept, last_tokens)
        output = self.graphs.replay(bucket) if self.graphs is not None else None
        if output is None:
            output = self.step.run(bucket)
            self.eager_steps += 1
        if kept.numel():
            parts.append(output.index_select(0, kept))
        for row, row_fed in fed:
            if row_fed.keep:
                offsets[row] = kept_so_far
                kept_so_far += row_fed.keep
        self.padded_positions += bucket.tokens
        self.attended_slots += bucket.rows * bucket.length
        self.attended_valid += sum(f.held + len(f.tokens) for _, f in fed)
        return kept_so_far
