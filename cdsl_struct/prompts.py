"""Prompts to token ids: a string, or chat messages rendered with the model's chat template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .tools.definitions import CALL_MARKER

ROLES = ("system", "user", "assistant", "tool")


def normalise_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    """Messages as ``{"role", "content"}`` dicts with text content.

    Content may be a string, None, or a list of ``{"type": "text", "text": ...}`` parts. An
    assistant message's ``tool_calls`` (OpenAI format) are written the way the model is told to
    write calls, so earlier calls read as the model's own. ``ValueError`` on anything else.
    """
    if not messages:
        raise ValueError("messages must not be empty")
    normalised = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"message {i} must be a dict with a 'role' and 'content'")
        role = message["role"]
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise ValueError(f"message {i} has unknown role {role!r}; use one of {', '.join(ROLES)}")
        content = _text_content(message.get("content"), i)
        calls = message.get("tool_calls")
        if role == "assistant" and calls:
            content += "".join(CALL_MARKER + json.dumps(_call_as_json(c, i), ensure_ascii=False, separators=(",", ":"))
                               for c in calls)
        normalised.append({"role": role, "content": content})
    return normalised


def _text_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ValueError(f"message {index}: only text content parts are supported, got {part!r}")
        return "".join(parts)
    raise ValueError(f"message {index}: content must be a string, a list of text parts or None")


def _call_as_json(call: Any, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or "name" not in function:
        raise ValueError(f"message {index}: a tool call needs a 'function' with a 'name'")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise ValueError(f"message {index}: tool call arguments are not JSON") from None
    return {"name": function["name"], "arguments": arguments}


def with_system(messages: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """Add ``text`` to the system message (one is created first when there is none)."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]["content"]
        return [{"role": "system", "content": f"{first}\n\n{text}" if first else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def prompt_ids(tokenizer: Any, prompt: str | Sequence[Any], *, chat: bool = True,
               system: str | None = None) -> list[int]:
    """Token ids of a prompt, ready for the assistant's reply.

    A string is one user message when ``chat`` is true and the tokenizer has a chat template,
    otherwise it is encoded as it is (``system`` text, if any, goes before it). Messages are
    rendered with the chat template (a plain ``role: content`` layout when there is none).
    """
    if isinstance(prompt, str):
        if not (chat and getattr(tokenizer, "chat_template", None)):
            text = f"{system}\n\n{prompt}" if system else prompt
            return list(tokenizer(text)["input_ids"])
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, Sequence):
        messages = normalise_messages(prompt)
    else:
        raise ValueError(f"a prompt is a string or a list of messages, got {type(prompt).__name__}")
    if system:
        messages = with_system(messages, system)
    if getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    layout = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return list(tokenizer(layout)["input_ids"])
