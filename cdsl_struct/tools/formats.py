"""Tool-call formats: how a model family writes its calls, picked from its chat template.

A model calls tools best in the format it was trained on. Each ``ToolFormat`` says how calls are
written: a ``trigger`` that starts them in free text, the ``open`` text before the first call's
JSON, the ``separator`` between two calls, the ``close`` after the last, and the key that holds
the arguments. The grammar (``tools.grammar``) and the reader (``tools.parsing``) are built from
these fields, so a format is data, not code:

- ``hermes`` (Qwen 2.5 / Qwen 3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, blocks one after another (what Qwen 3's template tells the model);
- ``llama3`` (Llama 3.1+ JSON tool use): ``{"name": ..., "parameters": {...}}``, calls joined by ``"; "``
  (the JSON itself is the trigger: free text never holds ``{"name": "``);
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, {...}]``;
- ``gemma`` (Gemma 3: its template has no tool syntax, so the fenced ``tool_code`` block of Google's
  function-calling guide, holding a JSON call as in its JSON variant): ````tool_code\\n{"name": ...,
  "parameters": {...}}\\n````;
- ``deepseek`` (DeepSeek V3 / R1): ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``,
  then the arguments in a ``json`` fence, ``<｜tool▁call▁end｜>``, and ``<｜tool▁calls▁end｜>`` after the last;
- ``generic`` (the fallback, this library's own): ``<tool_call>{"name": ..., "arguments": {...}}``, calls
  one after another.

``detect_format(chat_template)`` picks one from markers in the template's text (then from the
family's turn markers); ``resolve_format(name_or_auto, tokenizer)`` is what ``Generator(tool_format=)``
and ``serve --tool-format`` use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument

AUTO = "auto"


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes tool calls (see the module docstring)."""

    name: str
    trigger: str
    """What starts the calls in free text (free text never holds it otherwise)."""
    open: str
    """The text before the first call's JSON; it starts with ``trigger``, or is empty when the call's
    JSON itself starts with the trigger (``llama3``)."""
    separator: str
    """Between one call's JSON and the next one's."""
    close: str
    """After the last call's JSON."""
    arguments_key: str = "arguments"
    name_then: str | None = None
    """When set, a call is the tool's name as plain text, then this string, then the arguments' JSON
    (no object around them: DeepSeek); otherwise a call is ``{"name": ..., arguments_key: {...}}``."""

    @property
    def trigger_in_call(self) -> bool:
        """Whether the trigger is the start of a call's JSON (nothing is written before the JSON)."""
        return not self.open

    def written(self, calls: Sequence[dict[str, Any]]) -> str:
        """``calls`` (``{"name", "arguments"}`` dicts) written as the model writes them (``json.dumps``
        layout): for earlier calls in a conversation and the example in the tools prompt."""
        if self.name_then is not None:
            bodies = [call["name"] + self.name_then + json.dumps(call["arguments"], ensure_ascii=False)
                      for call in calls]
        else:
            bodies = [json.dumps({"name": call["name"], self.arguments_key: call["arguments"]}, ensure_ascii=False)
                      for call in calls]
        return self.open + self.separator.join(bodies) + self.close

    def shape(self) -> str:
        """One call as the system prompt shows it, with placeholders."""
        if self.name_then is not None:
            return f"{self.open}<function name>{self.name_then}<JSON object of arguments>{self.close}"
        return (f'{self.open}{{"name": <function name>, "{self.arguments_key}": <JSON object of arguments>}}'
                f"{self.close}")

    def several(self) -> str:
        """How the system prompt says to write more than one call."""
        if self.open.startswith(self.trigger) and self.separator.endswith(self.open):
            return f"To call several functions, write one {self.trigger} block after another."
        return f"To call several functions, separate the calls with {json.dumps(self.separator)}."


GENERIC = ToolFormat("generic", "<tool_call>", "<tool_call>", "<tool_call>", "")
HERMES = ToolFormat("hermes", "<tool_call>", "<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>")
LLAMA3 = ToolFormat("llama3", '{"name": "', "", "; ", "", arguments_key="parameters")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS][", ", ", "]")
GEMMA = ToolFormat("gemma", "```tool_code", "```tool_code\n", "\n```\n```tool_code\n", "\n```",
                   arguments_key="parameters")

_DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
DEEPSEEK = ToolFormat("deepseek", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁begin｜>" + _DS_CALL,
                      "\n```<｜tool▁call▁end｜>\n" + _DS_CALL, "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                      name_then="\n```json\n")

FORMATS: dict[str, ToolFormat] = {f.name: f for f in (GENERIC, HERMES, LLAMA3, MISTRAL, GEMMA, DEEPSEEK)}
"""The known formats by name."""
FORMAT_NAMES = (AUTO, *FORMATS)

_TEMPLATE_MARKERS: tuple[tuple[str, ToolFormat], ...] = (
    ("[TOOL_CALLS]", MISTRAL),
    ("<｜tool▁calls▁begin｜>", DEEPSEEK),
    ("<tool_call>", HERMES),
    ("<|python_tag|>", LLAMA3),
    ("tool_code", GEMMA),
    ("<|start_header_id|>", LLAMA3),  # a Llama 3 template without the tool part: the family's format
    ("<start_of_turn>", GEMMA),
)
"""Markers looked for in a chat template, in order: tool-call markers first, then a family's turns."""


def detect_format(chat_template: str | None) -> ToolFormat:
    """The format a model with this chat template was trained to call tools in (``GENERIC`` when
    nothing in it says)."""
    if not isinstance(chat_template, str):
        return GENERIC
    for marker, found in _TEMPLATE_MARKERS:
        if marker in chat_template:
            return found
    return GENERIC


def resolve_format(tool_format: str | ToolFormat | None, tokenizer: Any = None) -> ToolFormat:
    """``tool_format`` as a ``ToolFormat``: a name in ``FORMATS``, a ``ToolFormat``, or ``"auto"`` /
    None (detected from ``tokenizer``'s chat template). ``InvalidArgument`` for an unknown name."""
    if isinstance(tool_format, ToolFormat):
        return tool_format
    if tool_format in (None, AUTO):
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # some tokenizers keep several named templates
            template = template.get("tool_use") or template.get("default")
        return detect_format(template)
    if tool_format not in FORMATS:
        raise InvalidArgument(f"unknown tool format {tool_format!r}; choose one of {', '.join(FORMAT_NAMES)}",
                              param="tool_format")
    return FORMATS[tool_format]
