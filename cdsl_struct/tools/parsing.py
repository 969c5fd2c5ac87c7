"""From output text back to tool calls: whole (``parse_tool_output``) or as it streams (``CallStream``).

The output is text, then calls written in the request's format (``tools.formats``: the trigger and
open, each call's JSON, separators, the close; see ``grammar``). ``CallStream`` reads it delta by
delta the way OpenAI streams a message: content deltas while text is written, then per call a
first delta with its id and name and then fragments of its arguments string. A trigger is never
shown as content: text that could still become the trigger is held back until it cannot.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from ..errors import InvalidToolCall
from .definitions import ToolCall, new_call_id
from .formats import GENERIC, ToolFormat
from .request import ToolRequest

_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@functools.lru_cache(maxsize=16)
def _arguments_key(key: str) -> re.Pattern[str]:
    return re.compile(r'\s*,\s*"' + re.escape(key) + r'"\s*:\s*')


@dataclass
class CallDelta:
    """A piece of a streamed call: ``name`` and ``id`` on its first delta, then ``arguments`` text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class _Call:
    id: str
    text: str = ""  # the call's JSON as written so far
    name: str | None = None
    head: int = 0  # where the name part of ``text`` ends
    arguments_started: bool = False
    arguments: str = ""  # the arguments' JSON text as written so far
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    arguments_done: bool = False
    closed: bool = False


@dataclass
class CallStream:
    """Incremental reader of a tool-call output in ``format`` (the generic one unless given).
    ``push(delta)`` returns ``(content, call_deltas)``."""

    format: ToolFormat | None = None
    content: str = ""
    calls: list[_Call] = field(default_factory=list)
    _held: str = ""
    _between: bool = False  # a call just ended: a separator or the close comes next
    _done: bool = False  # the close was read: nothing follows

    def __post_init__(self) -> None:
        if self.format is None:
            self.format = GENERIC

    def push(self, delta: str) -> tuple[str, list[CallDelta]]:
        """The content text and call pieces that ``delta`` completes."""
        shown, pieces = "", []
        text = self._held + delta
        self._held = ""
        fmt = self.format or GENERIC
        while text and not self._done:
            call = self.calls[-1] if self.calls and not self.calls[-1].closed else None
            if call is not None:
                text = self._advance(call, text, pieces)
                self._between = call.closed
                continue
            if self._between:
                text = self._after_call(text)
                continue
            if self.calls:  # between calls a separator started a call; anything else ends them
                break
            found = text.find(fmt.trigger)
            if found < 0:
                keep = _prefix_at_end(text, fmt.trigger)
                shown += text[:len(text) - keep]
                self._held = text[len(text) - keep:]
                break
            shown += text[:found]
            text = text[found:]
            if not fmt.trigger_in_call:
                if not text.startswith(fmt.open) and fmt.open.startswith(text):
                    self._held = text  # the open is not whole yet
                    break
                text = text[len(fmt.open) if text.startswith(fmt.open) else len(fmt.trigger):]
            self.calls.append(_Call(id=new_call_id()))
        self.content += shown
        return shown, pieces

    def _after_call(self, text: str) -> str:
        """Read what follows a call: a separator (a new call starts) or the close (the end); the
        start of either is held back until it is whole."""
        fmt = self.format or GENERIC
        self._between = False
        if fmt.separator and text.startswith(fmt.separator):
            self.calls.append(_Call(id=new_call_id()))
            return text[len(fmt.separator):]
        if fmt.separator.startswith(text) or (fmt.close.startswith(text) and text != fmt.close):
            self._held, self._between = text, True
            return ""
        self._done = True
        return ""

    def flush(self) -> str:
        """Content held back as a possible trigger start, once the output has ended."""
        held, self._held = self._held, ""
        if self.calls:  # after a call, held text is the close or a separator that never came
            return ""
        self.content += held
        return held

    def _advance(self, call: _Call, text: str, pieces: list[CallDelta]) -> str:
        """Consume ``text`` into ``call``; returns what follows the call's end."""
        index = len(self.calls) - 1
        name_then = (self.format or GENERIC).name_then
        if call.name is None and name_then is not None:  # NAME, then the arguments' JSON
            call.text += text
            found = call.text.find(name_then)
            if found < 0:
                return ""
            call.name = call.text[:found]
            pieces.append(CallDelta(index, id=call.id, name=call.name))
            text, call.text = call.text[found + len(name_then):], call.text[:found + len(name_then)]
            call.head, call.arguments_started = len(call.text), True
        if call.name is None:
            call.text += text
            found = _NAME.match(call.text)
            if not found:
                return ""
            call.name = json.loads(f'"{found.group(1)}"')
            pieces.append(CallDelta(index, id=call.id, name=call.name))
            text, call.text = call.text[found.end():], call.text[:found.end()]
            call.head = found.end()
        if not call.arguments_started:
            call.text += text
            found = _arguments_key((self.format or GENERIC).arguments_key).match(call.text, call.head)
            if not found:
                return ""
            call.arguments_started = True
            text, call.text = call.text[found.end():], call.text[:found.end()]
        fragment = []
        for position, char in enumerate(text):
            call.text += char
            if call.arguments_done:
                if char == "}":
                    call.closed = True
                    self._emit(pieces, index, "".join(fragment))
                    return text[position + 1:]
                continue
            if char.isspace() and call.depth == 0 and not fragment and not call.arguments:
                continue  # layout between the key and the arguments' value
            fragment.append(char)
            if call.in_string:
                if call.escaped:
                    call.escaped = False
                elif char == "\\":
                    call.escaped = True
                elif char == '"':
                    call.in_string = False
                continue
            if char == '"':
                call.in_string = True
            elif char in "{[":
                call.depth += 1
            elif char in "}]":
                call.depth -= 1
                if call.depth == 0:
                    call.arguments_done = True
                    if name_then is not None:  # no object around the arguments: the call ends here
                        call.closed = True
                        self._emit(pieces, index, "".join(fragment))
                        return text[position + 1:]
        self._emit(pieces, index, "".join(fragment))
        return ""

    def _emit(self, pieces: list[CallDelta], index: int, fragment: str) -> None:
        if fragment:
            self.calls[index].arguments += fragment
            pieces.append(CallDelta(index, arguments=fragment))


def _prefix_at_end(text: str, marker: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@dataclass
class ToolOutput:
    """An output read as a message: ``content`` (None when empty) and ``calls``."""

    content: str | None
    calls: list[ToolCall]


def parse_tool_output(request: ToolRequest, text: str, *, complete: bool,
                      ids: list[str] | None = None) -> ToolOutput:
    """Read a tool request's output. A ``complete`` one (ended under its constraint) must parse
    into valid calls, else ``InvalidToolCall``; an incomplete one (cut by ``max_tokens``) gives the
    calls written so far, the last with ``arguments=None`` and its partial ``arguments_text``.
    ``ids``: the call ids to use (those already streamed), in order."""
    fmt = request.format
    if fmt.trigger_in_call and complete and _is_answer(request, text):
        return ToolOutput(text, [])  # a JSON answer that opens like a call (``{"name": "...``)
    stream = CallStream(fmt)
    stream.push(text)
    stream.flush()
    content = stream.content
    calls = []
    for index, call in enumerate(stream.calls):
        call_id = ids[index] if ids and index < len(ids) else call.id
        if call.closed:
            written = call.text if fmt.name_then is None else \
                json.dumps({"name": call.name, fmt.arguments_key: _json_or_none(call.arguments)})
            calls.append(_validated(request, written, call_id))
        elif complete:
            raise InvalidToolCall(f"tool call {index} is not finished: {call.text!r}")
        elif call.name is not None:
            calls.append(ToolCall(call.name, None, id=call_id, arguments_text=call.arguments))
    if not stream.calls and complete and request.mode == "call":
        raise InvalidToolCall("a call was required but the output has none")
    content = content.strip() if stream.calls else content
    if stream.calls and not content and not calls:
        # a call was cut before its name was whole: no call, no content, and never the call's
        # markup ("" keeps ``Result`` from showing the raw text as its content)
        return ToolOutput("", calls)
    return ToolOutput(content or None, calls)


def _validated(request: ToolRequest, text: str, call_id: str) -> ToolCall:
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidToolCall(f"tool call is not JSON: {exc.msg}") from None
    if not isinstance(data, dict) or data.get("name") not in request.allowed:
        raise InvalidToolCall(f"not a call of an allowed tool: {data!r}")
    arguments = data.get(request.format.arguments_key)
    schema = request.parameters(data["name"])
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(validator(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if errors:
        raise InvalidToolCall(f"{data['name']}: invalid arguments: {errors[0].message}")
    return ToolCall(data["name"], arguments, id=call_id,
                    arguments_text=json.dumps(arguments, ensure_ascii=False))


def _is_answer(request: ToolRequest, text: str) -> bool:
    """Whether ``text`` is one JSON value that is not a call of the request's tools (in a format whose
    call is bare JSON, an answer in an answer format can start as a call does)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return False
    key = request.format.arguments_key
    return not (isinstance(data, dict) and set(data) == {"name", key} and data["name"] in request.allowed)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None
