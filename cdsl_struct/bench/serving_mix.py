"""``cdsl-struct bench serve --mix``: a mixed load the way function-calling clients make it.

Requests (deterministic by index) cycle through: json_schema answers, tool calls (required and
auto), plain chat, streamed json_schema and streamed tool calls, clients that disconnect after
the first chunk, and malformed requests (a bad schema, an unknown model, a body that is not
JSON). ``clients`` threads send them with the openai client (raw HTTP for the broken body).
The same well-formed requests are also sent one at a time for the baseline.

Checked for every request: a well-formed one is answered exactly once (one response, or one
stream ending in ``[DONE]``) with output valid under its schema or tool; a malformed one gets
its 4xx; nothing gets a 500. Reported: throughput (requests/s and completion tokens/s), p50/p99
time to first token and latency, for the mixed load and for the one-at-a-time baseline, and
their ratio. Runs against any OpenAI-compatible server (standard fields only).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from .serving import PERSON_SCHEMA, prompts

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
KINDS = ("json", "tool_required", "plain", "json_stream", "json", "tool_auto", "tool_stream", "disconnect",
         "json", "malformed")
MALFORMED = ("bad_schema", "unknown_model", "not_json")


@dataclass
class MixConfig:
    """Where to send the mixed load, how much of it, and how hard."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "smollm2"
    requests: int = 200
    clients: int = 32
    serial_requests: int = 40
    max_tokens: int = 48
    label: str = ""


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


class _Sender:
    def __init__(self, config: MixConfig) -> None:
        import httpx
        from openai import OpenAI

        self.config = config
        self.client = OpenAI(base_url=config.base_url, api_key="none", max_retries=0, timeout=900)
        self.http = httpx.Client(timeout=900)
        self.fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA,
                                                           "strict": True}}

    def send(self, index: int) -> dict[str, Any]:
        import openai

        kind = KINDS[index % len(KINDS)]
        prompt = prompts(index + 1)[index]
        row: dict[str, Any] = {"index": index, "kind": kind, "status": 200, "valid": None, "tokens": 0}
        started = time.perf_counter()
        try:
            if kind == "malformed":
                self._malformed(index, row)
            elif kind in ("json_stream", "tool_stream", "disconnect"):
                self._stream(kind, prompt, row, started)
            else:
                self._whole(kind, prompt, row, started)
        except openai.APIStatusError as exc:
            row["status"] = exc.status_code
        except Exception as exc:  # noqa: BLE001 - a transport failure is a result of the bench, not a crash
            row["status"], row["error"] = -1, f"{type(exc).__name__}: {exc}"
        row["latency"] = time.perf_counter() - started
        row.setdefault("ttft", row["latency"])
        return row

    def _messages(self, kind: str, prompt: str) -> list[dict[str, str]]:
        if kind.startswith("tool"):
            city = prompt.split(" of ")[-1].removesuffix(" as JSON.")
            return [{"role": "user", "content": f"What is the weather where {city} was born?"}]
        return [{"role": "user", "content": prompt}]

    def _options(self, kind: str) -> dict[str, Any]:
        if kind.startswith("json"):
            return {"response_format": self.fmt}
        if kind in ("tool_required", "tool_stream"):
            return {"tools": [WEATHER], "tool_choice": "required"}
        if kind == "tool_auto":
            return {"tools": [WEATHER]}
        return {}

    def _whole(self, kind: str, prompt: str, row: dict[str, Any], started: float) -> None:
        reply = self.client.chat.completions.create(
            model=self.config.model, messages=self._messages(kind, prompt), max_tokens=self.config.max_tokens,
            temperature=0, **self._options(kind))
        choice = reply.choices[0]
        row["tokens"] = reply.usage.completion_tokens if reply.usage else 0
        row["finish_reason"] = choice.finish_reason
        row["valid"] = _valid(kind, choice.message.content, choice.message.tool_calls, choice.finish_reason)

    def _stream(self, kind: str, prompt: str, row: dict[str, Any], started: float) -> None:
        options = self._options("json_stream" if kind == "disconnect" else kind)
        stream = self.client.chat.completions.create(
            model=self.config.model, messages=self._messages(kind, prompt), max_tokens=self.config.max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}, **options)
        text, arguments, finish, ended = "", {}, None, False
        for chunk in stream:
            if chunk.usage:
                row["tokens"] = chunk.usage.completion_tokens
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            if (delta.content or delta.tool_calls) and "ttft" not in row:
                row["ttft"] = time.perf_counter() - started
                if kind == "disconnect":
                    stream.close()  # the client goes away after the first token
                    row["valid"] = True
                    return
            text += delta.content or ""
            for call in delta.tool_calls or []:
                arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
            finish = chunk.choices[0].finish_reason or finish
        ended = finish is not None
        row["finish_reason"] = finish
        calls = [{"function": {"arguments": a}} for _, a in sorted(arguments.items())]
        row["valid"] = ended and _valid(kind, text or None, calls or None, finish)

    def _malformed(self, index: int, row: dict[str, Any]) -> None:
        which = MALFORMED[(index // len(KINDS)) % len(MALFORMED)]
        row["kind"] = f"malformed:{which}"
        if which == "not_json":
            response = self.http.post(f"{self.config.base_url}/chat/completions", content=b'{"messages": [',
                                      headers={"content-type": "application/json", "authorization": "Bearer none"})
            row["status"] = response.status_code
            return
        fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object",
                                                                              "minProperties": -1}}}
        model = "no-such-model" if which == "unknown_model" else self.config.model
        self.client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                            max_tokens=8, **({"response_format": fmt} if which == "bad_schema"
                                                             else {}))


def _valid(kind: str, content: str | None, calls: Any, finish: str | None) -> bool:
    import jsonschema

    if finish == "length":
        return True  # cut by max_tokens: nothing to validate, counted apart
    try:
        if kind.startswith("tool"):
            if not calls:
                return kind == "tool_auto" and bool(content)
            for call in calls:
                arguments = call["function"]["arguments"] if isinstance(call, dict) else call.function.arguments
                jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
            return True
        if kind.startswith("json"):
            jsonschema.validate(json.loads(content or ""), PERSON_SCHEMA)
        return content is not None
    except (ValueError, jsonschema.ValidationError):
        return False


def _summary(rows: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    served = [r for r in rows if not r["kind"].startswith("malformed") and r["kind"] != "disconnect"]
    tokens = sum(r["tokens"] for r in served)
    return {"requests": len(rows), "wall_s": round(wall, 3), "requests_per_s": round(len(served) / wall, 3),
            "completion_tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_s": _quantile([r["ttft"] for r in served], 0.5),
            "ttft_p99_s": _quantile([r["ttft"] for r in served], 0.99),
            "latency_p50_s": _quantile([r["latency"] for r in served], 0.5),
            "latency_p99_s": _quantile([r["latency"] for r in served], 0.99),
            "valid": sum(bool(r["valid"]) for r in served), "well_formed": len(served),
            "length": sum(r.get("finish_reason") == "length" for r in served),
            "statuses": dict(Counter(str(r["status"]) for r in rows)),
            "server_errors": sum(r["status"] >= 500 or r["status"] < 0 for r in rows)}


def run_mix_bench(config: MixConfig) -> dict[str, Any]:
    """The mixed load with ``clients`` at once, then its well-formed requests one at a time."""
    sender = _Sender(config)
    sender.send(0)  # warm-up: compiles the schema, not timed
    started = time.perf_counter()
    with ThreadPoolExecutor(config.clients) as pool:
        rows = list(pool.map(sender.send, range(config.requests)))
    mixed = _summary(rows, time.perf_counter() - started)
    well_formed = [i for i in range(config.requests)
                   if KINDS[i % len(KINDS)] not in ("malformed", "disconnect")][:config.serial_requests]
    started = time.perf_counter()
    serial_rows = [sender.send(i) for i in well_formed]
    serial = _summary(serial_rows, time.perf_counter() - started)
    bad = [r for r in rows if r["kind"].startswith("malformed") and not 400 <= r["status"] < 500]
    summary = {"mixed": mixed, "one_at_a_time": serial,
               "throughput_ratio": round(mixed["tokens_per_s"] / serial["tokens_per_s"], 2)
               if serial["tokens_per_s"] else None,
               "malformed_not_4xx": len(bad)}
    return {"config": asdict(config), "summary": summary, "rows": rows, "serial_rows": serial_rows}


def format_mix_table(report: dict[str, Any]) -> str:
    """The two runs side by side as a markdown table."""
    label = report["config"]["label"] or report["config"]["base_url"]
    lines = [f"server: {label}; throughput ratio (tokens/s, mixed / one at a time): "
             f"{report['summary']['throughput_ratio']}", "",
             "| load | requests | wall s | req/s | tok/s | TTFT p50 / p99 s | latency p50 / p99 s | valid | statuses |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in ("mixed", "one_at_a_time"):
        s = report["summary"][name]
        lines.append(f"| {name} | {s['requests']} | {s['wall_s']} | {s['requests_per_s']} | {s['tokens_per_s']} | "
                     f"{s['ttft_p50_s']} / {s['ttft_p99_s']} | {s['latency_p50_s']} / {s['latency_p99_s']} | "
                     f"{s['valid']}/{s['well_formed']} | {s['statuses']} |")
    return "\n".join(lines)
