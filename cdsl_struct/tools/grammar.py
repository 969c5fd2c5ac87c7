"""The one constraint of a request with tools: text, an answer in a format, or calls.

Function calling is a translation at the two edges of decoding: here the tools become a single
grammar (llguidance's Lark dialect, with each call's JSON embedded by ``%json``), so the row
decodes once under one constraint like any other; ``parsing`` turns the text back into calls.

Shapes of the output, ``M`` being the marker ``<tool_call>`` and ``C`` one call's JSON:

- ``tool_choice="auto"``: text without ``M`` (ends at EOS), or text then ``M C`` (then more ``M C``
  when parallel calls are allowed). With an answer format: that format's JSON, or ``M C``...
- ``"required"`` or a named tool: ``M C`` (``M C``...).

Text before the first call is the message's content. Every call's arguments satisfy the tool's
parameters schema, so a complete output always parses into valid calls.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..constraints.closed_objects import close_objects
from ..constraints.specs import Grammar
from ..constraints.whitespace import DEFAULT_WHITESPACE, WhitespacePolicy
from .definitions import CALL_MARKER
from .request import ToolRequest

_TEXT = "/(?s:.*)/ & ~/(?s:.*<tool_call>.*)/"
_TEXT_THEN_MARKER = "/(?s:.*)<tool_call>/ & ~/(?s:.*<tool_call>.+)/"


class ToolCallsGrammar(Grammar):
    """The grammar of a tool request's output (compiled by llguidance only).

    ``answer_format``: the JSON Schema an answer that is not a call must follow (OpenAI's
    ``response_format`` beside ``tools``); None for free text. ``whitespace``: the JSON layout
    of calls and answers, as for ``JsonSchema``.
    """

    def __init__(self, request: ToolRequest, *, answer_format: dict[str, Any] | None = None,
                 whitespace: str | WhitespacePolicy = DEFAULT_WHITESPACE) -> None:
        policy = WhitespacePolicy.parse(whitespace)
        text = _lark(request, answer_format, policy)
        object.__setattr__(self, "source", text)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "origin", "<tool calls>")
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "answer_format", answer_format)
        object.__setattr__(self, "whitespace", policy)

    def with_closed_objects(self) -> ToolCallsGrammar:
        """This grammar with every tool's parameters and the answer format closed to undeclared keys
        (``constraints.closed_objects``, applied by ``compile()`` unless ``extra_properties=True``);
        ``self`` when closing changes nothing."""
        tools = tuple({**tool, "function": {**tool["function"],
                                            "parameters": close_objects(tool["function"]["parameters"])}}
                      for tool in self.request.tools)
        answer = close_objects(self.answer_format) if self.answer_format is not None else None
        if tools == self.request.tools and answer == self.answer_format:
            return self
        return ToolCallsGrammar(replace(self.request, tools=tools), answer_format=answer, whitespace=self.whitespace)

    def parser(self) -> Any:
        """The output as text: it is read into calls by ``parse_tool_output``, not by lark."""
        return _AsText()

    def parse(self, text: str) -> Any:
        """The output as text, as ``parser`` gives it (lark cannot read ``%json``)."""
        return text


class _AsText:
    @staticmethod
    def parse(text: str) -> str:
        return text


def _lark(request: ToolRequest, answer_format: dict[str, Any] | None, policy: WhitespacePolicy) -> str:
    calls = "(MARKER call)+" if request.parallel else "MARKER call"
    if request.mode == "call":
        start = calls
    elif answer_format is not None:
        start = f"answer | {calls}"
    else:
        more = " (MARKER call)*" if request.parallel else ""
        start = f"TEXT | TEXT_THEN_MARKER call{more}"
    lines = [f"start: {start}", f"call: %json {_embedded(request.call_schema, policy)}",
             f'MARKER: "{CALL_MARKER}"', f"TEXT: {_TEXT}", f"TEXT_THEN_MARKER: {_TEXT_THEN_MARKER}"]
    if answer_format is not None:
        lines.insert(1, f"answer: %json {_embedded(answer_format, policy)}")
    return "\n".join(lines) + "\n"


def _embedded(schema: Any, policy: WhitespacePolicy) -> str:
    """A schema for ``%json``, carrying the whitespace policy the way llguidance reads it."""
    from ..constraints.backends.llguidance_backend import _json_options  # one source of the options

    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    return json.dumps({**schema, "x-guidance": _json_options(policy)}, ensure_ascii=False)
