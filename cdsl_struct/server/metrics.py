"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Requests by route and status, prompt and completion tokens, time to first token and latency,
mask time and draft acceptance (from each Result's counters), and, read at scrape time, the
requests admitted and waiting and the engine's running and waiting rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..constraints.compiler import cache_info

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The server's counters, gauges and histograms."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, worker: Any, load: Callable[[], Any] | None) -> None:
        """``load``: the engine's ``EngineLoad`` now (``Generator.load``), for the batch gauges."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("cdsl_requests", "HTTP requests answered, by route and status", ["route", "status"],
                                registry=r)
        self.prompt_tokens = Counter("cdsl_prompt_tokens", "Prompt tokens of finished generations", registry=r)
        self.completion_tokens = Counter("cdsl_completion_tokens", "Completion tokens generated", registry=r)
        self.finished = Counter("cdsl_generations", "Finished generations by finish reason", ["finish_reason"],
                                registry=r)
        self.ttft = Histogram("cdsl_time_to_first_token_seconds", "Time to the first streamed token (the whole "
                              "answer when not streamed)", buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("cdsl_request_latency_seconds", "Time to the full answer", buckets=_LATENCY_BUCKETS,
                                 registry=r)
        self.mask_seconds = Counter("cdsl_mask_seconds", "Time spent computing token masks", registry=r)
        self.draft_proposed = Counter("cdsl_draft_proposed_tokens", "Tokens proposed by drafts", registry=r)
        self.draft_accepted = Counter("cdsl_draft_accepted_tokens", "Proposed tokens the target accepted",
                                      registry=r)
        Gauge("cdsl_requests_active", "Requests admitted and not finished", registry=r).set_function(
            lambda: worker.active)
        Gauge("cdsl_requests_queued", "Admitted requests waiting for a worker", registry=r).set_function(
            lambda: max(0, worker.active - worker.concurrency))
        if load is not None:
            Gauge("cdsl_batch_rows", "Rows in the engine's running batch", registry=r).set_function(
                lambda: load().running_rows)
            Gauge("cdsl_engine_queue_depth", "Rows waiting to join the batch", registry=r).set_function(
                lambda: load().waiting_rows)
            Gauge("cdsl_engine_mean_rows_per_step", "Mean rows per target forward since start",
                  registry=r).set_function(lambda: load().mean_rows_per_step)
            Gauge("cdsl_engine_steps", "Target forwards (batched steps) since start", registry=r).set_function(
                lambda: load().steps)
            Gauge("cdsl_engine_forward_seconds", "Time in target forwards since start, prefill included",
                  registry=r).set_function(lambda: load().forward_seconds)
            Gauge("cdsl_engine_prefill_seconds", "Time in target forwards of their own spent prefilling prompts "
                  "(a ragged step prefills joining rows inside the decode pass)", registry=r).set_function(
                lambda: load().prefill_seconds)
            Gauge("cdsl_engine_prefill_positions", "Prompt positions computed by target forwards (not copied from "
                  "the prefix cache)", registry=r).set_function(lambda: load().prefill_positions)
            Gauge("cdsl_engine_attended_valid_share", "Share of the KV slots attention read that hold a row's own "
                  "token (the rest: padding, holes, spare positions)", registry=r).set_function(
                lambda: load().attended_valid_share)
            Gauge("cdsl_engine_compiled", "1 while the target's forward runs through torch.compile, else 0 "
                  "(serve --torch-compile)", registry=r).set_function(lambda: float(load().compiled_active))
            Gauge("cdsl_engine_compiled_steps", "Target forwards run compiled since start",
                  registry=r).set_function(lambda: load().compiled_steps)
            Gauge("cdsl_engine_runner_fallback", "1 where the graph or ragged runner failed its load-time "
                  "self-check and the target runs on the next one (the log says why), else 0", registry=r).set_function(
                lambda: float(load().runner_fallback is not None))
            Gauge("cdsl_engine_cuda_graphs", "CUDA graphs the target's steps replay from (0: no graph runner, or "
                  "its graphs were dropped: the log says why)", registry=r).set_function(lambda: load().cuda_graphs)
            Gauge("cdsl_engine_graph_replays", "Target steps replayed from CUDA graphs since start",
                  registry=r).set_function(lambda: load().graph_replays)
            Gauge("cdsl_engine_ahead_steps", "Target steps launched before the host read the tokens of the step "
                  "before (plain decode rows on CUDA graphs)", registry=r).set_function(lambda: load().ahead_steps)
            Gauge("cdsl_prefix_cache_bytes", "Keys and values of stored prompt prefixes",
                  registry=r).set_function(lambda: load().prefix_cache_bytes)
        Gauge("cdsl_compile_cache_bytes", "Engine programs in the compile cache (their own estimate)",
              registry=r).set_function(lambda: cache_info()["bytes"])
        Gauge("cdsl_compile_cache_entries", "Compiled constraints and remembered refusals in the cache",
              registry=r).set_function(lambda: cache_info()["entries"] + cache_info()["failures"])

    def observe(self, results: list[Any], started: float, first_token_at: float | None = None) -> None:
        """Count finished generations (their tokens, mask time, draft acceptance) and their latency."""
        now = time.perf_counter()
        self.latency.observe(now - started)
        self.ttft.observe((first_token_at or now) - started)
        for result in results:
            self.finished.labels(result.finish_reason).inc()
            self.prompt_tokens.inc(getattr(result, "prompt_tokens", 0))
            self.completion_tokens.inc(len(result.tokens))
            self.mask_seconds.inc(result.stats.mask_seconds)
            self.draft_proposed.inc(result.stats.proposed)
            self.draft_accepted.inc(result.stats.accepted)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


class StatusCounter:
    """ASGI middleware counting every HTTP response by route and status code."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope.get("path", "")
        route = route if route in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                   "/metrics") else "other"

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
