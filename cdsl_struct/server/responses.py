"""Response bodies of the OpenAI-compatible endpoints: completions, chat completions, stream chunks.

``finish_reason`` is the Result's (``stop``, ``length``), ``tool_calls`` when the answer is tool
calls, and the extension value ``constraint_dead_end`` when the constraint allowed no token.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class Finished:
    """A finished generation and the number of tokens of its prompt."""

    result: Any
    prompt_tokens: int


def new_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-...``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def tool_call_json(call: Any, index: int | None = None) -> dict[str, Any]:
    """A ``ToolCall`` in OpenAI's shape; ``arguments`` is a JSON string. ``index`` for stream deltas."""
    data: dict[str, Any] = {"id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
    return data if index is None else {"index": index, **data}


def finish_reason(result: Any) -> str:
    """OpenAI's finish reason of a Result."""
    if result.finish_reason == "stop" and getattr(result, "tool_calls", None):
        return "tool_calls"
    return result.finish_reason


def chat_message(result: Any) -> dict[str, Any]:
    """The assistant message: tool calls (content null) or the text."""
    calls = getattr(result, "tool_calls", None) or []
    if calls and result.finish_reason == "stop":
        return {"role": "assistant", "content": None, "tool_calls": [tool_call_json(call) for call in calls]}
    return {"role": "assistant", "content": result.text}


def chat_completion(done: Finished, model: str) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    result = done.result
    return {
        "id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": chat_message(result), "logprobs": None,
                     "finish_reason": finish_reason(result)}],
        "usage": usage(done.prompt_tokens, len(result.tokens)),
    }


def text_completion(done: list[Finished], model: str) -> dict[str, Any]:
    """A ``text_completion`` object with one choice per prompt."""
    return {
        "id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": i, "text": d.result.text, "logprobs": None, "finish_reason": finish_reason(d.result)}
                    for i, d in enumerate(done)],
        "usage": usage(sum(d.prompt_tokens for d in done), sum(len(d.result.tokens) for d in done)),
    }


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class ChunkWriter:
    """Stream chunks of one answer (``chat.completion.chunk`` or ``text_completion``), same id throughout."""

    def __init__(self, model: str, *, chat: bool) -> None:
        self.model = model
        self.chat = chat
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

    def usage(self, done: Finished) -> str:
        """The last chunk of ``stream_options.include_usage``: no choices, the token counts."""
        return sse({**self._envelope([]), "usage": usage(done.prompt_tokens, len(done.result.tokens))})
