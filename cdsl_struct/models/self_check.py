"""A runner checked against the model's own forward before it serves a request.

The static-shape and ragged runners replace the model's attention and cache with their own
(``runners``, ``models.ragged``); a bug of that path on one device or torch version (the CUDA
crash of torch 2.11's SDPA with a mask and ``enable_gqa``, say) would otherwise reach every
request. ``batch_runner`` feeds three rows through the runner the way the engine does (prompts
joining together, a decode step, speculation and a long feed after held positions; on the graph
runner: prefill and decode steps, through its graphs) and compares every kept position with the
model's plain forward over the same sequence: the same argmax wherever the reference's top two are
apart by more than the tolerance, and logits within it. A mismatch or an error falls back (graphs
off, then the ragged runner, then the padded ``BatchRunner``), says why in the log, and the runner
carries the reason (``fallback_reason``, ``graphs_off``: the engine's ``load()`` and the server's
``/metrics`` report them).
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

import torch

from .batch import BatchRunner, Feed
from .device import model_device
from .int8 import dequantised, token_scaled
from .ragged import GROUPED_QUERIES, RaggedRunner, supports_ragged
from .runner import first_layers

logger = logging.getLogger(__name__)

#: (absolute, relative to the largest reference logit) tolerance of the check, by dtype: float32
#: differs from the reference by summation order only; half types by their rounding
#: (absolute, relative to the largest logit) per dtype. bfloat16's is wide because its rounding is:
#: SmolLM2's own forward in bfloat16 is up to 1.0 from its float32 one (|logits| up to 34), and the
#: ragged runner's steps (same math, other shapes and kernels) were 1.28-1.31 from it on an H100 and
#: on this AVX2 CPU; a runner's logic is held to float32's by the tests against solo runs
TOLERANCE = {torch.float32: (1e-3, 1e-4), torch.bfloat16: (0.1, 0.06), torch.float16: (0.05, 0.01)}

_checked: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()


def batch_runner(model: Any, pad_token_id: int = 0, *, max_rows: int | None = None, graphs: bool = True,
                 **kwargs: Any) -> RaggedRunner | BatchRunner:
    """The engine's runner for ``model``: on a CUDA device the static-shape ``GraphRunner`` (its
    steps replayed from CUDA graphs) where it passes ``check_runner``; else ``RaggedRunner`` where the
    model supports it and it passes ``check_ragged`` (once per model); else the padded
    ``BatchRunner`` (with ``fallback_reason`` set where a check failed). ``CDSL_RUNNER`` forces one:
    ``static`` (the graph runner, eager off a GPU), ``ragged`` or ``padded`` (for comparisons).
    ``max_rows``: the most rows the graph runner's buckets hold (default 64; more leave its static
    steps). ``graphs=False``: never the graph runner (for a runner made on a request's path, which
    must not stall it for a capture)."""
    choice = os.environ.get("CDSL_RUNNER", "").lower()
    if choice == "padded" or not supports_ragged(model):
        return BatchRunner(model, pad_token_id=pad_token_id, **kwargs)
    static_reason = None
    if choice == "static" or (graphs and choice != "ragged" and model_device(model).type == "cuda"):
        runner, static_reason = _graph_runner(model, pad_token_id, max_rows=max_rows, **kwargs)
        if runner is not None:
            return runner
    reason = check_ragged_once(model)
    if reason is None:
        runner = RaggedRunner(model, pad_token_id=pad_token_id, **kwargs)
        runner.fallback_reason = static_reason
        return runner
    runner = BatchRunner(model, pad_token_id=pad_token_id, **kwargs)
    runner.fallback_reason = "; ".join(r for r in (static_reason, reason) if r)
    return runner


def check_ragged_once(model: Any) -> str | None:
    """``check_ragged(model)`` the first time it is asked for ``model``, remembered after (a warning
    logged where it failed): what ``batch_runner`` asks before it builds a ragged runner. A harness
    that times requests calls it where it makes a draft, to keep the check (0.3-1.4 s) out of
    the first request's time. The Generator leaves it to the engine's thread: run on the caller's
    thread, the 16 keyword requests at once of ``keyword-load`` took 10-25% longer (2.4-2.8 s
    against 2.2-2.4, not explained; docs/benchmarks/2026-11-29-draft-header-and-first-request.md)."""
    if model not in _checked:
        _checked[model] = check_ragged(model)
        if _checked[model] is not None:
            logger.warning("the ragged runner failed its self-check on %s (%s); this model runs on the padded "
                           "runner", model_device(model), _checked[model])
    return _checked[model]


def _graph_runner(model: Any, pad_token_id: int, **kwargs: Any) -> tuple[Any, str | None]:
    """A ``GraphRunner`` checked on its graphs, else on its eager static steps (graphs off, said in
    the log and ``graphs_off``); (None, why) where neither passes."""
    from ..runners.runner import GraphRunner

    try:
        runner = GraphRunner(model, pad_token_id=pad_token_id, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the runner could not even be built: the ragged one serves
        reason = f"the graph runner failed to start: {type(exc).__name__}: {exc}"
        logger.warning("%s; falling back to the ragged runner", reason)
        return None, reason
    problem = check_runner(runner) or runner.static_off
    if problem is not None and runner.graphs is not None and runner.fused:
        runner.unfuse(f"the compiled steps failed the self-check: {problem}")
        runner.capture(kwargs.get("backend"))
        problem = check_runner(runner) or runner.static_off
    if problem is not None and runner.graphs is not None:
        runner.graphs, runner.graphs_off = None, f"the graphs failed the self-check: {problem}"
        logger.warning("CUDA graphs off: %s; the static steps run eagerly", runner.graphs_off)
        problem = check_runner(runner) or runner.static_off
    if problem is not None:
        reason = f"the graph runner failed its self-check: {problem}"
        logger.warning("%s; falling back to the ragged runner", reason)
        return None, reason
    if runner.graphs is not None:
        runner.ahead_off = check_ahead(runner)
        if runner.ahead_off is not None:
            logger.warning("steps launched ahead failed the self-check (%s); every step runs in turn",
                           runner.ahead_off)
    runner.reset_counters()
    return runner, None


def check_ragged(model: Any, compiled: Any = None) -> str | None:
    """Run the ragged runner's self-check on ``model`` (its steps through ``compiled``, a
    ``CompiledForward``, when given): None when it agrees with the model's own forward, else what went
    wrong (an error, or the first position that differs). A model of token-scaled int8 layers
    (``models.int8``) is checked on their dequantised weights, and only on its first layers
    (``plumbing_layers``): its own step runs every layer alike, and the float check of all 30 of
    SmolLM2's took 1.4 s of the first keyword request."""
    if token_scaled(model):
        model = first_layers(model, plumbing_layers(model))
    try:
        runner = RaggedRunner(model, prefix_cache_bytes=0)
    except Exception as exc:  # noqa: BLE001 - any failure of the ragged path sends the model to the padded one
        return f"{type(exc).__name__}: {exc}"
    runner.compiled = compiled
    if token_scaled(model):  # int8 rounding amplifies float-order noise: check the plumbing in float
        with dequantised(model):
            return check_runner(runner)
    return check_runner(runner)


def plumbing_layers(model: Any) -> int:
    """How many first decoder layers of ``model`` a check of the runner's plumbing needs: two (a
    layer's keys written and read apart from the next one's), or more to reach a layer of each kind
    of attention the config names (``layer_types``: full and sliding layers)."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    kinds = list(getattr(config, "layer_types", None) or [])
    firsts = [kinds.index(kind) for kind in set(kinds)]
    return min(len(model.model.layers), max([2, *(first + 1 for first in firsts)]))


def check_runner(runner: Any) -> str | None:
    """Feed ``runner`` three rows the way the engine does and compare every kept position with its
    model's own forward; None where all agree, else what went wrong. The rows are released after
    (the runner's prefix cache is left out of it)."""
    model = runner.model
    vocab = int(model.get_output_embeddings().out_features)
    a, b, c = ([(step * i + 3) % vocab for i in range(length)] for step, length in ((7, 20), (5, 4), (3, 9)))
    more = [(11 * i + 2) % vocab for i in range(GROUPED_QUERIES + 2)]
    steps = [  # what attends row by row (a long prompt, a long feed after held positions) and grouped (short feeds)
        [Feed("a", a, 2), Feed("b", b, 1), Feed("c", c, 1)],  # prompts joining together
        [Feed("a", a + [2], 1), Feed("b", b + [9], 1), Feed("c", c + [4], 1)],  # a decode step
        [Feed("a", a + [2] + more, 3), Feed("b", b + [9, 4, 8], 3), Feed("c", c + [4, 1], 2)],  # after held positions
    ]
    prefixes, runner.prefixes = runner.prefixes, None
    try:
        dtype = next(model.parameters()).dtype
        # each row's feeds are prefixes of its last one: one reference forward a row covers them all
        references = {feed.row: _reference(model, feed.sequence) for feed in steps[-1]}
        for feeds in steps:
            for feed, got in zip(feeds, runner.run(feeds), strict=True):
                end = len(feed.sequence)
                problem = _compare(got, references[feed.row][end - feed.keep:end], dtype)
                if problem is not None:
                    return f"row {feed.row!r} of {len(feed.sequence)} tokens: {problem}"
    except Exception as exc:  # noqa: BLE001 - any failure of the runner sends the model to the next one
        return f"{type(exc).__name__}: {exc}"
    finally:
        runner.prefixes = prefixes
        try:
            runner.release("a", "b", "c")
        except Exception:  # noqa: BLE001, S110 - a runner that failed may not release; it is dropped
            pass
    return None


def check_ahead(runner: Any) -> str | None:
    """Check ``runner``'s steps launched ahead (``run_ahead``, then ``settle``, as ``decoding.ahead``
    drives them) against the model's own forward: three rows join, one step is launched from tokens
    on the device, and a step in turn follows it over the keys that step wrote. None where every
    kept position agrees, else what went wrong (the engine then runs every step in turn)."""
    model = runner.model
    vocab = int(model.get_output_embeddings().out_features)
    prompts = {name: [(step * i + 5) % vocab for i in range(length)]
               for name, step, length in (("a", 13, 12), ("b", 7, 3), ("c", 5, 7))}
    after = {"a": [3, 8], "b": [6, 1], "c": [9, 2]}  # the token launched ahead, then one fed in turn
    prefixes, runner.prefixes = runner.prefixes, None
    try:
        dtype = next(model.parameters()).dtype
        references = {row: _reference(model, prompt + after[row]) for row, prompt in prompts.items()}
        runner.run([Feed(row, prompt, 1) for row, prompt in prompts.items()])
        rows = list(prompts)
        tokens = torch.tensor([after[row][0] for row in rows], device=runner.device)
        launched = runner.run_ahead(rows, tokens)
        if launched is None:
            return "run_ahead launched nothing for three decode rows"
        logits, offsets = launched
        runner.settle({row: after[row][0] for row in rows})
        for row in rows:
            end = len(prompts[row])
            problem = (_compare(logits[offsets[row]:offsets[row] + 1], references[row][end:end + 1], dtype)
                       or _compare(runner.run([Feed(row, prompts[row] + after[row], 1)])[0],
                                   references[row][end + 1:end + 2], dtype))
            if problem is not None:
                return f"row {row!r}, launched ahead: {problem}"
    except Exception as exc:  # noqa: BLE001 - any failure: steps run in turn
        return f"{type(exc).__name__}: {exc}"
    finally:
        runner.prefixes = prefixes
        try:
            runner.release(*prompts)
        except Exception:  # noqa: BLE001, S110 - a runner that failed may not release; it is dropped
            pass
    return None


@torch.inference_mode()
def _reference(model: Any, sequence: list[int]) -> torch.Tensor:
    """The model's own forward over ``sequence`` (no cache of ours): float32 logits at every position."""
    ids = torch.tensor([sequence], device=model_device(model))
    return model(input_ids=ids, use_cache=False).logits[0].float()


def _compare(got: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> str | None:
    """None where ``got`` agrees with ``reference`` (``[positions, vocab]``) for a model in ``dtype``,
    else how it differs."""
    if got.shape != reference.shape:
        return f"logits of shape {tuple(got.shape)}, expected {tuple(reference.shape)}"
    absolute, relative = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    tolerance = absolute + relative * float(reference.abs().max())
    got, reference = got.float().cpu(), reference.cpu()
    difference = float((got - reference).abs().max())
    if not difference <= tolerance:  # NaN fails too
        return f"logits differ by {difference:.4g} (tolerance {tolerance:.4g})"
    top = reference.topk(2, dim=-1).values
    clear = (top[:, 0] - top[:, 1]) > 2 * tolerance
    mismatched = clear & (got.argmax(-1) != reference.argmax(-1))
    if bool(mismatched.any()):
        return f"a different argmax at kept position {int(mismatched.nonzero()[0])}"
    return None
