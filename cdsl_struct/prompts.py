"""Prompts to token ids: a string, or chat messages rendered with the model's chat template."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from .tools.definitions import CALL_MARKER, RESULT_CLOSE, RESULT_OPEN

ROLES = ("system", "user", "assistant", "tool")


def normalise_messages(messages: Sequence[Any], *, results_as_user: bool = False,
                       tool_format: Any = None) -> list[dict[str, str]]:
    """Messages as ``{"role", "content"}`` dicts with text content.

    Content may be a string, None, or a list of ``{"type": "text", "text": ...}`` parts. An
    assistant message's ``tool_calls`` (OpenAI format) are written the way the model is told to
    write calls (``<tool_call>{"name": ..., "arguments": ...}``), so earlier calls read as the
    model's own (in ``tool_format``, a ``tools.formats.ToolFormat``, when given). ``tool`` messages
    (results) stay as they are for the chat template to show, as vLLM does; ``results_as_user``
    (for templates without a ``tool`` role) writes them in the hermes convention that
    ``CALL_MARKER`` follows instead: ``<tool_response>{"name": ..., "content": ...}</tool_response>``
    (the name found by ``tool_call_id``) in one user turn with the results beside them and a user
    message right after. ``ValueError`` on anything else.
    """
    if not messages:
        raise ValueError("messages must not be empty")
    normalised: list[dict[str, str]] = []
    names: dict[str, str] = {}  # call id -> function name, for the results that answer the calls
    results_turn = None  # with results_as_user: the turn holding the latest results
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"message {i} must be a dict with a 'role' and 'content'")
        role = message["role"]
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise ValueError(f"message {i} has unknown role {role!r}; use one of {', '.join(ROLES)}")
        content = _text_content(message.get("content"), i)
        if results_as_user and role == "tool":
            result = _result_text(message, content, names)
            if results_turn is None:
                results_turn = {"role": "user", "content": result}
                normalised.append(results_turn)
            else:
                results_turn["content"] += "\n" + result
            continue
        if results_turn is not None and role == "user":  # such templates want roles to alternate
            results_turn["content"] += "\n\n" + content
            continue
        results_turn = None
        calls = message.get("tool_calls")
        if role == "assistant" and calls:
            content += _written_calls(calls, i, names, tool_format)
        normalised.append({"role": role, "content": content})
    return normalised


def ends_with_results(messages: Sequence[Any]) -> bool:
    """Whether the model's next reply follows tool results (the last message has role ``tool``)."""
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"


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


def _written_calls(calls: Sequence[Any], index: int, names: dict[str, str], tool_format: Any) -> str:
    """An assistant message's calls as the model writes them in ``tool_format`` (a ``ToolFormat``;
    None: the generic ``<tool_call>`` layout); notes their ids."""
    if tool_format is None:
        return "".join(_written_call(call, index, names) for call in calls)
    written = [_call_as_json(call, index) for call in calls]
    for call, call_json in zip(calls, written, strict=True):
        if isinstance(call.get("id"), str):
            names[call["id"]] = call_json["name"]
    return tool_format.written(written)


def _written_call(call: Any, index: int, names: dict[str, str]) -> str:
    """A call as the model writes it (``json.dumps`` layout, as in the tools prompt); notes its id."""
    written = _call_as_json(call, index)
    if isinstance(call.get("id"), str):
        names[call["id"]] = written["name"]
    return CALL_MARKER + json.dumps(written, ensure_ascii=False)


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


def _result_text(message: dict[str, Any], content: str, names: dict[str, str]) -> str:
    """A tool message as ``<tool_response>``: JSON content is shown as JSON, other text as a string."""
    try:
        value: Any = json.loads(content)
    except json.JSONDecodeError:
        value = content
    name = names.get(message.get("tool_call_id") or "") or message.get("name")
    shown = {"name": name, "content": value} if isinstance(name, str) else {"content": value}
    return f"{RESULT_OPEN}\n{json.dumps(shown, ensure_ascii=False)}\n{RESULT_CLOSE}"


def with_system(messages: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """Add ``text`` to the system message (one is created first when there is none)."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]["content"]
        return [{"role": "system", "content": f"{first}\n\n{text}" if first else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def prompt_ids(tokenizer: Any, prompt: str | Sequence[Any], *, chat: bool = True,
               system: str | None = None, thinking: bool | None = None) -> list[int]:
    """Token ids of a prompt, ready for the assistant's reply.

    A string is one user message when ``chat`` is true and the tokenizer has a chat template,
    otherwise it is encoded as it is (``system`` text, if any, goes before it). Messages are
    rendered with the chat template (a plain ``role: content`` layout when there is none); tool
    results in a user turn where the template refuses the ``tool`` role.

    When the messages end with tool results and ``system`` has an ``after_results`` instruction
    (a ``ToolPrompt``), that instruction follows the results as a system message, or, where the
    template refuses a system message there, ends the results' turn.

    ``thinking``: for a template that can turn a model's thinking on and off (``enable_thinking``,
    Qwen 3), which to ask for (None: the template's default).
    """
    if isinstance(prompt, str):
        if not (chat and getattr(tokenizer, "chat_template", None)):
            text = f"{system}\n\n{prompt}" if system else prompt
            return list(tokenizer(text)["input_ids"])
        prompt = [{"role": "user", "content": prompt}]
    elif not isinstance(prompt, Sequence):
        raise ValueError(f"a prompt is a string or a list of messages, got {type(prompt).__name__}")
    after_results = getattr(system, "after_results", None) if ends_with_results(prompt) else None
    tool_format = getattr(system, "tool_format", None)  # a ToolPrompt's: earlier calls in its format
    renderings = [normalise_messages(prompt, tool_format=tool_format)]
    if any(isinstance(m, dict) and m.get("role") == "tool" for m in prompt):
        renderings.append(normalise_messages(prompt, results_as_user=True, tool_format=tool_format))
    if system:
        renderings = [with_system(messages, system) for messages in renderings]
    if after_results:
        renderings = [variant for messages in renderings for variant in _followed_by(messages, after_results)]
    if not getattr(tokenizer, "chat_template", None):
        layout = "".join(f"{m['role']}: {m['content']}\n" for m in renderings[0]) + "assistant:"
        return list(tokenizer(layout)["input_ids"])
    from jinja2 import TemplateError  # what a chat template raises on messages it refuses

    for messages in renderings[:-1]:
        try:
            return _templated(tokenizer, messages, thinking)
        except TemplateError:
            pass
    return _templated(tokenizer, renderings[-1], thinking)


def _followed_by(messages: list[dict[str, str]], instruction: str) -> list[list[dict[str, str]]]:
    """``messages`` then ``instruction`` as a system message; then, for templates that allow a
    system message only first, ``instruction`` at the end of the last message."""
    last = messages[-1]
    return [[*messages, {"role": "system", "content": instruction}],
            [*messages[:-1], {**last, "content": f"{last['content']}\n\n{instruction}"}]]


def _templated(tokenizer: Any, messages: list[dict[str, str]], thinking: bool | None = None) -> list[int]:
    switch = {} if thinking is None or "enable_thinking" not in (tokenizer.chat_template or "") \
        else {"enable_thinking": thinking}
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **switch)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def chat_header(tokenizer: Any) -> list[int]:
    """The tokens every one-message chat prompt of ``tokenizer``'s template starts with (its default
    system turn, the user turn's opening): what most requests share. Empty without a chat template
    or where the template refuses the probe."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    try:
        first, second = (prompt_ids(tokenizer, text) for text in ("Hello.", "Write a sentence."))
    except Exception:  # noqa: BLE001 - a template that refuses one user message has no header to share
        return []
    return list(os.path.commonprefix([first, second]))
