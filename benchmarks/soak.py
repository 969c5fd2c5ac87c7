"""``python -m benchmarks soak``: many clients for many minutes against one server, mixing well-formed,
hostile and disconnecting requests (``soak_requests``), to show that no client can hurt the server.

By default the server is started here (``cdsl-struct serve`` in a child process, its defaults plus
``--server-arg``s) so its memory, file descriptors and threads can be read without the clients'
own; ``--url`` (and ``--pid`` for the resource figures) soaks a server already running.

Checked: every well-formed request answered once (one body, or one stream with one ``[DONE]`` and
one finish per choice; no response id seen twice) with a valid output; every hostile one its
expected status; no 5xx anywhere; nothing still running once the clients stop. Reported: requests
by group and status, latency p50/p95 of the well-formed, the server's resident memory at the
start, middle and end of the load with its trend (least squares, MB per minute, over the second
half), and its open file descriptors and threads before and after.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from cdsl_struct.bench import write_report

from .soak_requests import SoakRequest, soak_request

REQUEST_TIMEOUT_S = 300.0
GIVE_UP_AFTER_S = 0.3


@dataclass
class SoakConfig:
    """How long, how hard, and against which server."""

    minutes: float = 10.0
    clients: int = 32
    url: str | None = None
    """A running server's base URL (``http://host:port/v1``); none: start one."""
    pid: int | None = None
    """The running server's process, for its resource figures."""
    model: str = "smollm2"
    server_args: tuple[str, ...] = ()
    sample_s: float = 5.0
    warm_up: int = 20
    """The first ``warm_up`` requests of the mix, well-formed ones only, sent one at a time before the load."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _server(config: SoakConfig) -> Iterator[tuple[str, int | None]]:
    """The base URL and process id of the server to soak (started here unless ``config.url``)."""
    if config.url:
        yield config.url, config.pid
        return
    import httpx

    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "cdsl_struct.cli", "serve", "--port", str(port), "--model",
                                config.model, "--log-level", "warning", *config.server_args],
                               stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (exit code {process.poll()})")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


class _Resources:
    """Samples a process's resident memory (its own and its children's), descriptors and threads."""

    def __init__(self, pid: int | None, every_s: float) -> None:
        import psutil

        self.process = psutil.Process(pid) if pid else None
        self.every_s = every_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> dict[str, float]:
        if self.process is None:
            return {}
        children = self.process.children(recursive=True)
        return {"t": time.monotonic(), "rss_mb": self.process.memory_info().rss / 2**20,
                "children_rss_mb": sum(c.memory_info().rss for c in children) / 2**20,
                "children": len(children), "fds": self.process.num_fds(), "threads": self.process.num_threads()}

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(self.now())

    def __enter__(self) -> _Resources:
        if self.process is not None:
            self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()


class _Client:
    """Sends soak requests; one ``httpx.Client`` per thread."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        split = urlsplit(base_url)
        self.address = (split.hostname or "127.0.0.1", split.port or 80)
        self.local = threading.local()

    def _http(self) -> Any:
        import httpx

        if not hasattr(self.local, "http"):
            self.local.http = httpx.Client(timeout=REQUEST_TIMEOUT_S)
        return self.local.http

    def close(self) -> None:
        """Close this thread's connections (so that the server's descriptors after the load count
        nothing the soak still holds)."""
        if hasattr(self.local, "http"):
            self.local.http.close()
            del self.local.http

    def send(self, request: SoakRequest) -> dict[str, Any]:
        """Send ``request``; its row: status (-1 transport error, 0 went away as meant), the answer's
        ids, whether it was complete and valid, its latency."""
        row: dict[str, Any] = {"index": request.index, "kind": request.kind, "group": request.group,
                               "status": -1, "ids": [], "ok": False}
        started = time.perf_counter()
        try:
            status, answer = self._transport(request)
            row["status"] = status
            if answer is not None:
                row["ids"] = answer.pop("_ids", [answer.get("id")])
                row["complete"] = answer.pop("_complete", True)
                row["finish"] = [c.get("finish_reason") for c in answer.get("choices", [])]
            row["ok"] = self._judge(request, status, answer, row)
        except Exception as exc:  # noqa: BLE001 - a failed request is a finding of the soak, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["ok"] = request.group == "disconnect"
        row["latency"] = time.perf_counter() - started
        return row

    @staticmethod
    def _judge(request: SoakRequest, status: int, answer: dict[str, Any] | None, row: dict[str, Any]) -> bool:
        if request.group == "disconnect":
            return status in (0, 200)
        if status not in request.expected:
            return False
        if status != 200 or request.check is None:
            return True
        return (answer is not None and row.get("complete", False) and len(answer["choices"]) == request.choices
                and request.check(answer))

    def _transport(self, request: SoakRequest) -> tuple[int, dict[str, Any] | None]:
        body = request.body if isinstance(request.body, bytes) else json.dumps(request.body).encode()
        if request.transport in ("slow", "declared_oversize", "close_early"):
            return self._raw(request, body)
        if request.stream:
            return self._stream(request, body)
        timeout = GIVE_UP_AFTER_S if request.transport == "give_up" else REQUEST_TIMEOUT_S
        try:
            response = self._http().post(self.base_url + request.path, content=body, timeout=timeout,
                                         headers={"content-type": "application/json"})
        except Exception:
            if request.transport == "give_up":
                return 0, None
            raise
        return response.status_code, response.json() if response.status_code == 200 else None

    def _stream(self, request: SoakRequest, body: bytes) -> tuple[int, dict[str, Any] | None]:
        with self._http().stream("POST", self.base_url + request.path, content=body,
                                 headers={"content-type": "application/json"}) as response:
            if response.status_code != 200:
                response.read()
                return response.status_code, None
            merged = _MergedStream()
            for line in response.iter_lines():
                if merged.add(line) and request.transport == "first_chunk":
                    return 0, None  # leaving the block closes the connection mid-stream
            return 200, merged.answer()

    def _raw(self, request: SoakRequest, body: bytes) -> tuple[int, dict[str, Any] | None]:
        declared = 10_000_000 if request.transport == "declared_oversize" else len(body)
        with socket.create_connection(self.address, timeout=60) as sock:
            sock.sendall(f"POST {urlsplit(self.base_url).path}{request.path} HTTP/1.1\r\nHost: x\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {declared}\r\n"
                         "Connection: close\r\n\r\n".encode())
            if request.transport == "close_early":
                sock.sendall(body)
                return 0, None
            step = 8 if request.transport == "slow" else len(body)
            for start in range(0, len(body), step):
                sock.sendall(body[start:start + step])
                if request.transport == "slow":
                    time.sleep(0.1)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return status, json.loads(rest) if status == 200 else None


class _MergedStream:
    """The chunks of one streamed answer merged into the shape of a whole one, counting ``[DONE]``s and
    each choice's finishes (``_complete``: exactly one of each)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.done = 0
        self.errors = 0
        self.choices: dict[int, dict[str, Any]] = {}
        self.finishes: Counter[int] = Counter()

    def add(self, line: str) -> bool:
        """Take one SSE line; whether it carried output."""
        if not line.startswith("data: "):
            return False
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            self.done += 1
            return False
        chunk = json.loads(data)
        if "error" in chunk:
            self.errors += 1
            return False
        self.ids.add(chunk["id"])
        carried = False
        for part in chunk.get("choices", []):
            choice = self.choices.setdefault(part["index"], {"index": part["index"], "message": {"content": ""}})
            delta = part.get("delta", {})
            choice["message"]["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                calls = choice["message"].setdefault("tool_calls", {})
                calls[call["index"]] = calls.get(call["index"], "") + (call.get("function", {}).get("arguments") or "")
            carried = carried or bool(delta.get("content") or delta.get("tool_calls"))
            if part.get("finish_reason"):
                choice["finish_reason"] = part["finish_reason"]
                self.finishes[part["index"]] += 1
        return carried

    def answer(self) -> dict[str, Any]:
        for choice in self.choices.values():
            calls = choice["message"].pop("tool_calls", None)
            if calls is not None:
                choice["message"]["tool_calls"] = [{"function": {"arguments": a}} for _, a in sorted(calls.items())]
        complete = (self.done == 1 and self.errors == 0 and len(self.ids) == 1
                    and all(self.finishes[i] == 1 for i in self.choices))
        return {"choices": [self.choices[i] for i in sorted(self.choices)], "_ids": sorted(self.ids),
                "_complete": complete}


def _load(client: _Client, clients: int, seconds: float) -> list[dict[str, Any]]:
    """``clients`` threads each sending the next request until ``seconds`` have passed."""
    counter = itertools.count()
    deadline = time.monotonic() + seconds
    rows: list[dict[str, Any]] = []

    def run() -> None:
        while time.monotonic() < deadline:
            rows.append(client.send(soak_request(next(counter))))
        client.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rows


CACHE_GAUGES = ("cdsl_prefix_cache_bytes", "cdsl_compile_cache_bytes", "cdsl_compile_cache_entries")


def _caches(base_url: str) -> dict[str, float]:
    """The server's cache gauges from ``/metrics`` (empty for a server without them)."""
    import httpx

    response = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30)
    if response.status_code != 200:
        return {}
    values = {}
    for line in response.text.splitlines():
        name, _, value = line.partition(" ")
        if name in CACHE_GAUGES:
            values[name] = float(value)
    return values


def _settle(base_url: str, within_s: float = 120.0) -> int:
    """Wait for the server to report nothing running; what it reports last."""
    import httpx

    root = base_url.removesuffix("/v1")
    deadline = time.monotonic() + within_s
    while (active := httpx.get(f"{root}/health", timeout=30).json()["active_requests"]) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3.0)  # connections of the clients that went away close
    return active


def run_soak(config: SoakConfig, progress: bool = True) -> dict[str, Any]:
    """Soak a server (started here unless ``config.url``); the rows, resource samples and summary."""
    with _server(config) as (url, pid):
        client = _Client(url)
        warm_up = [client.send(request) for request in map(soak_request, range(config.warm_up))
                   if request.group == "well_formed"]
        client.close()
        resources = _Resources(pid, config.sample_s)
        before, caches_before = resources.now(), _caches(url)
        if progress:
            print(f"soaking {url} with {config.clients} clients for {config.minutes} min", file=sys.stderr)
        started = time.monotonic()
        with resources:
            rows = _load(client, config.clients, config.minutes * 60)
        load_s = time.monotonic() - started
        active_after = _settle(url)
        after, caches_after = resources.now(), _caches(url)
    summary = summarise(rows, resources.samples, started, load_s)
    summary.update(active_after=active_after, warm_up_ok=all(r["ok"] for r in warm_up),
                   fds=[before.get("fds"), after.get("fds")], threads=[before.get("threads"), after.get("threads")],
                   rss_before_after_mb=[_mb(before.get("rss_mb")), _mb(after.get("rss_mb"))],
                   caches_before_after={name: [caches_before.get(name), caches_after.get(name)]
                                        for name in CACHE_GAUGES})
    return {"config": asdict(config), "summary": summary, "rows": rows, "samples": resources.samples}


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


def _trend_mb_per_min(samples: list[dict[str, float]]) -> float | None:
    """Least-squares slope of resident memory over the samples, in MB per minute."""
    if len(samples) < 3:
        return None
    ts = [s["t"] / 60 for s in samples]
    ys = [s["rss_mb"] for s in samples]
    mean_t, mean_y = sum(ts) / len(ts), sum(ys) / len(ys)
    spread = sum((t - mean_t) ** 2 for t in ts)
    return round(sum((t - mean_t) * (y - mean_y) for t, y in zip(ts, ys, strict=True)) / spread, 2) if spread else None


def summarise(rows: list[dict[str, Any]], samples: list[dict[str, float]], started: float,
              load_s: float) -> dict[str, Any]:
    """Counts by group and status, what went wrong, latencies, and the memory trend."""
    ids = Counter(i for r in rows if r["status"] == 200 for i in r["ids"])
    well_formed = [r for r in rows if r["group"] == "well_formed"]
    during = [s for s in samples if s["t"] <= started + load_s]
    middle = min(during, key=lambda s: abs(s["t"] - started - load_s / 2), default={})
    return {
        "load_s": round(load_s, 1), "requests": len(rows),
        "by_group": {g: dict(Counter(str(r["status"]) for r in rows if r["group"] == g))
                     for g in ("well_formed", "hostile", "disconnect")},
        "well_formed": len(well_formed), "well_formed_ok": sum(r["ok"] for r in well_formed),
        "cut_by_length": sum("length" in r.get("finish", []) for r in well_formed),
        "not_ok": [{k: r.get(k) for k in ("index", "kind", "status", "finish", "error")}
                   for r in rows if not r["ok"]][:20],
        "not_ok_count": sum(not r["ok"] for r in rows),
        "doubled_ids": sum(1 for n in ids.values() if n > 1),
        "server_errors": sum(r["status"] >= 500 for r in rows),
        "latency_p50_s": _quantile([r["latency"] for r in well_formed], 0.5),
        "latency_p95_s": _quantile([r["latency"] for r in well_formed], 0.95),
        "rss_start_mid_end_mb": [_mb(during[0]["rss_mb"]) if during else None, _mb(middle.get("rss_mb")),
                                 _mb(during[-1]["rss_mb"]) if during else None],
        "rss_trend_second_half_mb_per_min": _trend_mb_per_min([s for s in during
                                                               if s["t"] >= started + load_s / 2]),
        "children_rss_max_mb": _mb(max((s["children_rss_mb"] for s in during), default=None)),
        "rss_by_minute_mb": [_mb(max((s for s in during if s["t"] - started <= 60 * (m + 1)), key=lambda s: s["t"])
                                 ["rss_mb"]) for m in range(int(load_s // 60)) if during],
    }


def format_soak_table(report: dict[str, Any]) -> str:
    """The summary as markdown."""
    s = report["summary"]
    lines = [f"soak: {report['config']['clients']} clients, {s['load_s']} s, {s['requests']} requests", "",
             "| group | statuses |", "|---|---|"]
    lines += [f"| {group} | {statuses} |" for group, statuses in s["by_group"].items()]
    lines += ["", "| check | value |", "|---|---|",
              f"| well-formed answered once and valid | {s['well_formed_ok']} / {s['well_formed']} "
              f"({s['cut_by_length']} cut by max_tokens) |",
              f"| requests not as expected | {s['not_ok_count']} |", f"| 5xx | {s['server_errors']} |",
              f"| response ids seen twice | {s['doubled_ids']} |",
              f"| running after the load | {s['active_after']} |",
              f"| latency p50 / p95 (well-formed) | {s['latency_p50_s']} / {s['latency_p95_s']} s |",
              f"| server RSS start / middle / end | {s['rss_start_mid_end_mb']} MB |",
              f"| RSS trend, second half | {s['rss_trend_second_half_mb_per_min']} MB/min |",
              f"| server RSS at the end of each minute | {s['rss_by_minute_mb']} MB |",
              f"| compile workers' RSS, max | {s['children_rss_max_mb']} MB |",
              *[f"| {name} before / after | {values} |" for name, values in s["caches_before_after"].items()],
              f"| open fds before / after | {s['fds']} |", f"| threads before / after | {s['threads']} |"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks soak``'s options."""
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load (default 10)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--url", default=None, help="soak this running server (default: start cdsl-struct serve)")
    parser.add_argument("--pid", type=int, default=None, help="--url: the server's process, for its resource figures")
    parser.add_argument("--model", default="smollm2", help="model of the server started here (default smollm2)")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an argument for the server started here (repeatable, e.g. "
                             "--server-arg=--max-batch-size=8)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between resource samples (default 5)")
    parser.add_argument("--warm-up", type=int, default=20,
                        help="send the mix's first N requests (well-formed ones) one at a time first (default 20)")
    parser.add_argument("--json", dest="json_out", help="write rows, samples and summary here")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    """Run the soak as ``args`` say; print the table, write the report."""
    config = SoakConfig(minutes=args.minutes, clients=args.clients, url=args.url, pid=args.pid, model=args.model,
                        server_args=tuple(args.server_arg), sample_s=args.sample_s, warm_up=args.warm_up)
    report = run_soak(config, progress=not args.no_progress)
    return write_report(report, format_soak_table(report), args)
