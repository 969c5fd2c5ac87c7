"""The requests of ``python -m benchmarks soak``: well-formed, hostile and disconnecting, each with what
a correct server answers and how to check the answer.

Request ``i`` is fully determined by ``i`` (``soak_request(i)``), so a run can be repeated. Of
every ``len(SLOTS)`` requests, most are well-formed (json_schema, choices, regex, grammar, tools,
streams, keyword-constrained, several prompts times ``n``); some are hostile (constraint bombs,
oversize lists, bodies that are not JSON, a slow body, an oversize body, a seed past 64 bits) and
some clients go away (mid-stream, before any answer, or by timing out). Several constraints
embed the request's index, so every one is compiled anew (this exercises the compile cache and
its limits) and an answer can be told apart from another request's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdsl_struct.bench.serving import PEOPLE, PERSON_SCHEMA, prompts
from cdsl_struct.bench.serving_mix import WEATHER

Check = Callable[[dict[str, Any]], bool]
"""Judges a complete 200 answer (the response body, or the chunks of a stream merged into one)."""


@dataclass(frozen=True)
class SoakRequest:
    """One request of the soak and what it should get."""

    index: int
    kind: str
    group: str
    """``well_formed``, ``hostile`` or ``disconnect``."""
    path: str
    body: Any
    """JSON-able, or ``bytes`` sent as they are."""
    expected: frozenset[int] = frozenset({200})
    stream: bool = False
    transport: str = "plain"
    """``plain``, ``slow`` (body dribbled), ``declared_oversize`` (a huge Content-Length, a few bytes),
    ``close_early`` (closed right after sending), ``give_up`` (client timeout far below the answer's
    time), ``first_chunk`` (stream closed after its first token)."""
    check: Check | None = field(default=None, compare=False)
    choices: int = 1


def _chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


def _text(answer: dict[str, Any], choice: int = 0) -> str:
    picked = answer["choices"][choice]
    return picked["text"] if "text" in picked else (picked["message"].get("content") or "")


def _stopped(answer: dict[str, Any]) -> bool:
    return all(c.get("finish_reason") == "stop" for c in answer["choices"])


def _person(answer: dict[str, Any]) -> bool:
    import jsonschema

    if not _stopped(answer):
        return answer["choices"][0].get("finish_reason") == "length"  # cut: nothing to validate
    try:
        jsonschema.validate(json.loads(_text(answer)), PERSON_SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _weather_call(answer: dict[str, Any]) -> bool:
    import jsonschema

    calls = answer["choices"][0]["message"].get("tool_calls") or []
    if answer["choices"][0].get("finish_reason") == "length":
        return True
    try:
        for call in calls:
            jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    except (ValueError, KeyError, jsonschema.ValidationError):
        return False
    return bool(calls)


def _matches(pattern: str) -> Check:
    def check(answer: dict[str, Any]) -> bool:
        import regex

        complete = _stopped(answer)
        return all(regex.fullmatch(pattern, _text(answer, i), partial=not complete) is not None
                   for i in range(len(answer["choices"])))
    return check


def _one_of(options: list[str]) -> Check:
    return lambda answer: _stopped(answer) and _text(answer) in options


def _rows(count: int) -> Check:
    """``count`` choices, indexed 0..count-1 once each, each finished."""
    return lambda answer: (sorted(c["index"] for c in answer["choices"]) == list(range(count))
                           and all(c.get("finish_reason") in ("stop", "length") for c in answer["choices"]))


def _any_text(answer: dict[str, Any]) -> bool:
    return answer["choices"][0].get("finish_reason") in ("stop", "length")


def _well_formed(i: int, slot: str) -> SoakRequest:
    person = prompts(i + 1)[i]
    weather = f"What is the weather in the city where {PEOPLE[i % len(PEOPLE)]} was born?"
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}
    make = {
        "json": lambda: ("/chat/completions", _chat(person, response_format=fmt, max_tokens=48), _person, False, 1),
        "json_stream": lambda: ("/chat/completions", _chat(person, response_format=fmt, max_tokens=48, stream=True),
                                _person, True, 1),
        "choices": lambda: ("/completions", {"prompt": f"Request {i}. Pick one code:", "max_tokens": 24,
                                             "choices": [f"alpha-{i}", f"beta-{i}"]},
                            _one_of([f"alpha-{i}", f"beta-{i}"]), False, 1),
        "regex": lambda: ("/completions", {"prompt": f"Ticket {i}:", "max_tokens": 12,
                                           "regex": f"(T{i}|t{i})-[a-z]{{1,6}}"},
                          _matches(f"(T{i}|t{i})-[a-z]{{1,6}}"), False, 1),
        "grammar": lambda: ("/completions", {"prompt": "A sum:", "max_tokens": 12,
                                             "grammar": f'start: NUM ("+" NUM)* "={i}"\nNUM: /[0-9]{{1,3}}/\n'},
                            _matches(f"[0-9]{{1,3}}(\\+[0-9]{{1,3}})*={i}"), False, 1),
        "tool": lambda: ("/chat/completions", _chat(weather, tools=[WEATHER], tool_choice="required", max_tokens=40),
                         _weather_call, False, 1),
        "rows": lambda: ("/completions", {"prompt": ["One,", "Two,"], "n": 2, "max_tokens": 6, "temperature": 0.8,
                                          "seed": i}, _rows(4), False, 4),
        "keywords": lambda: ("/completions", {"prompt": "Write a sentence about a dog and a ball:",
                                              "keywords": ["dog", "ball"], "max_tokens": 12}, _any_text, False, 1),
        "plain": lambda: ("/chat/completions", _chat("Say hello in three words.", max_tokens=12), _any_text, False, 1),
    }
    path, body, check, stream, choices = make[slot]()
    return SoakRequest(i, slot, "well_formed", path, body, stream=stream, check=check, choices=choices)


_BIG_ENUM = {"type": "array", "items": {"enum": list(range(10_000))}, "uniqueItems": True}
HOSTILE: dict[str, tuple[str, Any, frozenset[int], str]] = {
    "regex_bomb": ("/completions", {"prompt": "x", "regex": "(" * 400 + "a" + ")" * 400}, frozenset({400}), "plain"),
    "grammar_bomb": ("/completions", {"prompt": "x", "grammar": "start: x\nx: " + " ".join(['"a"?'] * 4000) + "\n"},
                     frozenset({400}), "plain"),
    "unique_enum": ("/chat/completions", _chat("x", response_format={
        "type": "json_schema", "json_schema": {"name": "e", "schema": _BIG_ENUM}}), frozenset({400}), "plain"),
    "10k_prompts": ("/completions", {"prompt": ["hi"] * 10_000, "max_tokens": 1}, frozenset({400}), "plain"),
    "huge_n": ("/chat/completions", _chat("x", n=2**70), frozenset({400}), "plain"),
    "10k_stops": ("/chat/completions", _chat("x", stop=[f"s{i}" for i in range(10_000)]), frozenset({400}), "plain"),
    "not_json": ("/chat/completions", b'{"messages": [', frozenset({422}), "plain"),
    "not_utf8": ("/chat/completions", b"\xff\xfe{", frozenset({422}), "plain"),
    "unknown_model": ("/chat/completions", _chat("x", model="no-such-model"), frozenset({404}), "plain"),
    "huge_seed": ("/chat/completions", _chat("Once", seed=2**70, temperature=1.0, max_tokens=4), frozenset({200}),
                  "plain"),
    "slow_body": ("/completions", {"prompt": "Is fire hot? Answer yes or no:", "choices": ["yes", "no"]},
                  frozenset({200}), "slow"),
    "declared_oversize": ("/chat/completions", b"{", frozenset({413}), "declared_oversize"),
}
DISCONNECTS: dict[str, tuple[str, Any, str]] = {
    "first_chunk": ("/chat/completions", _chat("Tell me a long story.", max_tokens=200, stream=True), "first_chunk"),
    "close_early": ("/chat/completions", _chat("Tell me a long story.", max_tokens=200), "close_early"),
    "give_up": ("/chat/completions", _chat("Tell me a long story.", max_tokens=200), "give_up"),
}
SLOTS = ("json", "choices", "hostile", "regex", "json_stream", "disconnect", "tool", "grammar", "json", "hostile",
         "rows", "plain", "choices", "disconnect", "keywords", "json", "hostile", "regex", "json_stream", "tool")
"""One cycle of the soak: 15 well-formed, 3 hostile and 2 disconnecting requests in 20."""


def soak_request(i: int) -> SoakRequest:
    """Request ``i`` of the soak."""
    slot = SLOTS[i % len(SLOTS)]
    cycle = i // len(SLOTS)
    if slot == "hostile":
        nth = cycle * SLOTS.count("hostile") + SLOTS[:i % len(SLOTS)].count("hostile")
        kind = list(HOSTILE)[nth % len(HOSTILE)]
        path, body, expected, transport = HOSTILE[kind]
        check = None if expected != {200} else _one_of(["yes", "no"]) if kind == "slow_body" else _any_text
        return SoakRequest(i, kind, "hostile", path, body, expected=expected, transport=transport, check=check)
    if slot == "disconnect":
        nth = cycle * SLOTS.count("disconnect") + SLOTS[:i % len(SLOTS)].count("disconnect")
        kind = list(DISCONNECTS)[nth % len(DISCONNECTS)]
        path, body, transport = DISCONNECTS[kind]
        return SoakRequest(i, kind, "disconnect", path, body, expected=frozenset(), stream=body.get("stream", False),
                           transport=transport)
    return _well_formed(i, slot)
