"""Response bodies of the OpenAI-compatible endpoints: completions, chat completions, stream chunks.

``finish_reason`` is the Result's (``stop``, ``length``), ``tool_calls`` when the answer is tool
calls (``stop`` when ``tool_choice`` named the function, as OpenAI does), and the extension
value ``constraint_dead_end`` when the constraint allowed no token. A call cut by
``max_tokens`` is still a tool call, with its partial arguments and ``length``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..partial import NOTHING, partial_json


def new_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-...``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(result: Any, named_tool: bool = False) -> str:
    """OpenAI's finish reason of a Result."""
    if result.finish_reason == "stop" and getattr(result, "tool_calls", None) and not named_tool:
        return "tool_calls"
    return result.finish_reason


def chat_message(result: Any) -> dict[str, Any]:
    """The assistant message: content (null when there is none) and the tool calls, if any."""
    calls = getattr(result, "tool_calls", None) or []
    message: dict[str, Any] = {"role": "assistant", "content": result.content if calls else (result.content or "")}
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    if getattr(result, "reasoning", None) is not None:
        message["reasoning_content"] = result.reasoning
    return message


def chat_logprobs(result: Any) -> dict[str, Any] | None:
    """``choices[i].logprobs`` of a chat completion (None unless they were asked for)."""
    return {"content": result.logprobs} if result.logprobs is not None else None


def text_logprobs(result: Any) -> dict[str, Any] | None:
    """The legacy completions ``logprobs`` object: tokens, their logprobs, alternatives, offsets."""
    if result.logprobs is None:
        return None
    offsets, at = [], 0
    for entry in result.logprobs:
        offsets.append(at)
        at += len(entry["token"])
    return {"tokens": [e["token"] for e in result.logprobs],
            "token_logprobs": [e["logprob"] for e in result.logprobs],
            "top_logprobs": [{alt["token"]: alt["logprob"] for alt in e["top_logprobs"]} for e in result.logprobs],
            "text_offset": offsets}


def _extensions(result: Any) -> dict[str, Any]:
    """Our extensions on a choice: ``closed_by_budget`` where the answer was closed early to fit
    ``max_tokens``, ``keywords`` (``{"covered": [...], "missing": [...]}``) where it was asked for them."""
    given: dict[str, Any] = {"closed_by_budget": True} if getattr(result, "closed_by_budget", False) else {}
    if getattr(result, "keywords", None) is not None:
        given["keywords"] = result.keywords.as_dict()
    return given


def chat_completion(results: Sequence[Any], model: str, named_tool: bool = False) -> dict[str, Any]:
    """A ``chat.completion`` object, one choice per Result (``n``)."""
    return {
        "id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": i, "message": chat_message(r), "logprobs": chat_logprobs(r),
                     "finish_reason": finish_reason(r, named_tool), **_extensions(r)} for i, r in enumerate(results)],
        "usage": usage(results[0].prompt_tokens, sum(len(r.tokens) for r in results)),
    }


def text_completion(results: Sequence[Any], model: str, n: int = 1) -> dict[str, Any]:
    """A ``text_completion`` object with ``n`` choices per prompt, prompt-major."""
    return {
        "id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": i, "text": r.text, "logprobs": text_logprobs(r), "finish_reason": finish_reason(r),
                     **_extensions(r)} for i, r in enumerate(results)],
        "usage": usage(sum(r.prompt_tokens for r in results[::n]), sum(len(r.tokens) for r in results)),
    }


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class ChunkWriter:
    """Stream chunks of one answer (``chat.completion.chunk`` or ``text_completion``), same id throughout."""

    def __init__(self, model: str, *, chat: bool, partials: bool = False) -> None:
        self.model = model
        self.chat = chat
        self.partials = partials
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}

    def delta(self, delta: dict[str, Any] | str, finish: str | None = None) -> str:
        """A chunk carrying ``delta`` (a chat delta dict, or completion text)."""
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
        return sse(self._envelope([choice]))

    def finish(self, result: Any, reason: str) -> str:
        """The chunk that ends a streamed choice: its finish reason (and ``closed_by_budget``, ``keywords``)."""
        if self.chat:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        return sse(self._envelope([{**choice, **_extensions(result)}]))

    def content(self, text: str, partial: Any = NOTHING) -> str:
        """A chunk of answer text (with the answer's partial value so far, where given)."""
        if partial is NOTHING:
            return self.delta({"content": text} if self.chat else text)
        if self.chat:
            return self.delta({"content": text, "partial_value": partial})
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None, "partial_value": partial}
        return sse(self._envelope([choice]))

    def call_delta(self, piece: Any, arguments_so_far: str | None = None) -> str:
        """A chunk of one streamed tool call: its id and name first, then argument fragments (with
        ``partial_values``, each with the arguments parsed so far: ``partial_arguments``)."""
        call: dict[str, Any] = {"index": piece.index}
        if piece.name is not None:
            call.update(id=piece.id, type="function", function={"name": piece.name, "arguments": ""})
        else:
            call["function"] = {"arguments": piece.arguments}
            if self.partials and arguments_so_far is not None:
                value = partial_json(arguments_so_far)
                if value is not NOTHING:
                    call["partial_arguments"] = value
        return self.delta({"tool_calls": [call]})

    def usage(self, result: Any) -> str:
        """The last chunk of ``stream_options.include_usage``: no choices, the token counts."""
        return sse({**self._envelope([]), "usage": usage(result.prompt_tokens, len(result.tokens))})
