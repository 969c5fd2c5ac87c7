"""``cdsl-struct bench serve``: the same json_schema chat requests against any OpenAI-compatible
server (``cdsl-struct serve``, vLLM, ...), one at a time and concurrently.

Each request asks for a famous person's name, age and city as JSON under a strict schema
(greedy, ``max_tokens`` bounded). Reported per concurrency level: wall time, completion tokens
as the server reports them and as the target tokenizer re-tokenises the answers (servers count
differently: a constrained server may spell text with more tokens than the canonical
tokenisation), tokens/s by both counts, requests/s, latency p50/p99, and how many answers are
valid JSON under the schema. Start the servers yourself (see BENCHMARKS.md for the commands);
this harness only sends requests, so both servers see byte-identical requests.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"], "additionalProperties": False,
}
PEOPLE = ("Ada Lovelace", "Albert Einstein", "Marie Curie", "Isaac Newton", "Nikola Tesla", "Charles Darwin",
          "Galileo Galilei", "Leonardo da Vinci", "Wolfgang Amadeus Mozart", "Frida Kahlo", "Mahatma Gandhi",
          "Abraham Lincoln", "Jane Austen", "William Shakespeare", "Alan Turing", "Cleopatra", "Napoleon Bonaparte",
          "Queen Victoria", "Ludwig van Beethoven", "Vincent van Gogh", "Pablo Picasso", "Florence Nightingale",
          "Johann Sebastian Bach", "Rosalind Franklin", "Nelson Mandela", "Winston Churchill", "Confucius",
          "Hypatia", "Sigmund Freud", "Grace Hopper", "Emmy Noether", "Srinivasa Ramanujan")


@dataclass
class ServeBenchConfig:
    """What to send and where."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "smollm2"
    requests: int = 16
    concurrency: tuple[int, ...] = (1, 16)
    max_tokens: int = 60
    tokenizer: str = "smollm2"
    label: str = ""


def prompts(count: int) -> list[str]:
    """``count`` extraction prompts, cycling through the famous people."""
    return [f"Give the name, age at death and city of birth of {PEOPLE[i % len(PEOPLE)]} as JSON."
            for i in range(count)]


def run_serve_bench(config: ServeBenchConfig) -> dict[str, Any]:
    """Send the requests at each concurrency level; per-request rows and a summary per level."""
    import jsonschema
    from openai import OpenAI

    from ..models import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer)
    client = OpenAI(base_url=config.base_url, api_key="none", max_retries=0, timeout=600)
    response_format = {"type": "json_schema",
                       "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}

    def one(prompt: str, started: float) -> dict[str, Any]:
        sent = time.perf_counter()
        reply = client.chat.completions.create(
            model=config.model, messages=[{"role": "user", "content": prompt}], max_tokens=config.max_tokens,
            temperature=0, response_format=response_format)
        text = reply.choices[0].message.content or ""
        try:
            jsonschema.validate(json.loads(text), PERSON_SCHEMA)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        return {"prompt": prompt, "text": text, "finish_reason": reply.choices[0].finish_reason, "valid": valid,
                "completion_tokens": reply.usage.completion_tokens if reply.usage else 0,
                "retokenised": len(tokenizer.encode(text, add_special_tokens=False)),
                "latency": time.perf_counter() - sent, "end": time.perf_counter() - started}

    one(prompts(1)[0], time.perf_counter())  # warm-up (first-request compiles), not timed
    levels, rows = [], []
    for concurrency in config.concurrency:
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            done = list(pool.map(one, prompts(config.requests), [started] * config.requests))
        wall = time.perf_counter() - started
        rows += [{"concurrency": concurrency, **row} for row in done]
        latencies = sorted(row["latency"] for row in done)
        reported = sum(row["completion_tokens"] for row in done)
        retokenised = sum(row["retokenised"] for row in done)
        levels.append({
            "concurrency": concurrency, "wall_s": round(wall, 3), "completion_tokens": reported,
            "retokenised_tokens": retokenised, "tokens_per_s": round(reported / wall, 2),
            "retokenised_tokens_per_s": round(retokenised / wall, 2), "requests_per_s": round(len(done) / wall, 3),
            "p50_s": round(latencies[len(latencies) // 2], 3),
            "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
            "valid": sum(row["valid"] for row in done), "requests": len(done),
            "finish": dict(Counter(row["finish_reason"] for row in done)),
        })
    return {"config": asdict(config), "summary": {"levels": levels}, "rows": rows}


def format_table(report: dict[str, Any]) -> str:
    """The summary as a markdown table."""
    label = report["config"]["label"] or report["config"]["base_url"]
    lines = [f"server: {label}", "",
             "| concurrency | wall s | completion tokens (reported / re-tokenised) | tok/s (reported / re-tok.) "
             "| req/s | p50 s | p99 s | valid |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for level in report["summary"]["levels"]:
        lines.append(f"| {level['concurrency']} | {level['wall_s']} | {level['completion_tokens']} / "
                     f"{level['retokenised_tokens']} | {level['tokens_per_s']} / {level['retokenised_tokens_per_s']} | "
                     f"{level['requests_per_s']} | {level['p50_s']} | {level['p99_s']} | "
                     f"{level['valid']}/{level['requests']} |")
    return "\n".join(lines)
