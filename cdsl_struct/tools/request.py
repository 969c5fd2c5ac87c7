"""What a request asks of the tools: which may be called and how (``ToolRequest``), the prompt
that describes them, and the schema of one call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .definitions import normalise_tools
from .formats import GENERIC, ToolFormat


class ToolPrompt(str):
    """The system prompt of a tool request, with ``after_results``: the instruction given again
    right after tool results (None: nothing to restate).

    A small model follows the instruction it read last: with the tools described only at the top
    of a long conversation, it copies its previous call instead of answering from the results.
    """

    after_results: str | None
    tool_format: ToolFormat | None
    """The format earlier calls in the conversation are written in (``prompts``)."""

    def __new__(cls, text: str, after_results: str | None = None, tool_format: ToolFormat | None = None) -> ToolPrompt:
        prompt = super().__new__(cls, text)
        prompt.after_results = after_results
        prompt.tool_format = tool_format
        return prompt


@dataclass(frozen=True)
class ToolRequest:
    """What a request allows: the tools, which may be called, and how.

    ``mode``: ``"auto"`` (text or calls) or ``"call"`` (at least one call is required).
    ``parallel``: one or more calls (each after its own marker) instead of exactly one.
    ``named``: ``tool_choice`` named the one tool to call (OpenAI then finishes with ``stop``).
    ``format``: how the calls are written (``tools.formats``; the generic one unless told).
    """

    tools: tuple[dict[str, Any], ...]
    allowed: tuple[str, ...]
    mode: str
    parallel: bool
    named: bool = False
    format: ToolFormat = GENERIC

    @property
    def call_schema(self) -> dict[str, Any]:
        """The JSON Schema of one call: ``{"name": ..., "arguments": {...}}`` (the format's arguments key)."""
        definitions: dict[str, Any] = {}
        branches = []
        for name in self.allowed:
            arguments = _hoist_definitions(self.parameters(name), name, definitions)
            key = self.format.arguments_key
            branches.append({"type": "object", "properties": {"name": {"const": name}, key: arguments},
                             "required": ["name", key], "additionalProperties": False})
        call = branches[0] if len(branches) == 1 else {"anyOf": branches}
        return {**call, "$defs": definitions} if definitions else call

    def parameters(self, name: str) -> dict[str, Any]:
        """The parameters schema of the tool ``name``."""
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"]["parameters"]
        raise KeyError(name)

    def system_prompt(self, answer_format: dict[str, Any] | None = None) -> ToolPrompt:
        """Tells the model the tools, the call format and, with ``answer_format``, the answer's schema.

        Its ``after_results`` says what to do once results are in: answer, or call another function.
        """
        described = [self._describe(t) for t in self.tools if t["function"]["name"] in self.allowed]
        shape = self.format.shape()
        lines = ["You can call these functions:", *described, "", f"To call a function, reply with {shape}."]
        if self.parallel:
            lines.append(self.format.several())
        if self.mode == "call":
            lines.append("You must call a function now.")
            return ToolPrompt("\n".join(lines), tool_format=self.format)
        if answer_format is not None:
            lines.append("Otherwise, answer with JSON matching this schema: "
                         + json.dumps(answer_format, ensure_ascii=False))
            answer = "answer with JSON matching the schema"
        else:
            lines.append("Otherwise, answer in plain text.")
            answer = "answer in plain text"
        return ToolPrompt("\n".join(lines),
                          after_results=f"If the results answer the user's request, {answer}. "
                                        "Otherwise, call another function.", tool_format=self.format)

    @staticmethod
    def _describe(tool: dict[str, Any]) -> str:
        function = tool["function"]
        return json.dumps({"name": function["name"], "description": function["description"],
                           "parameters": function["parameters"]}, ensure_ascii=False)


def _hoist_definitions(parameters: dict[str, Any], tool: str, definitions: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` without its ``$defs`` / ``definitions``, which move into ``definitions``
    under ``<tool>.<name>``; local references are rewritten to match.

    A tool's parameters sit inside the call schema, where its ``#/$defs/...`` references would
    otherwise resolve against the call schema's root.
    """
    local = {**parameters.get("definitions", {}), **parameters.get("$defs", {})}
    if not local:
        return parameters

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            out = {key: rewrite(value) for key, value in node.items()}
            ref = node.get("$ref")
            if isinstance(ref, str):
                for prefix in ("#/$defs/", "#/definitions/"):
                    if ref.startswith(prefix):
                        out["$ref"] = f"#/$defs/{tool}.{ref[len(prefix):]}"
            return out
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    for name, definition in local.items():
        definitions[f"{tool}.{name}"] = rewrite(definition)
    return {key: rewrite(value) for key, value in parameters.items() if key not in ("$defs", "definitions")}


def tool_request(tools: Sequence[Any] | None, tool_choice: Any = "auto",
                 parallel_tool_calls: bool = True, tool_format: ToolFormat = GENERIC) -> ToolRequest | None:
    """Resolve ``tools`` and ``tool_choice``; None when no call can be made (no tools, ``"none"``).

    ``tool_choice``: ``"auto"``, ``"required"``, ``"none"``, a tool's name, or
    ``{"type": "function", "function": {"name": ...}}``. ``parallel_tool_calls`` (default true,
    as OpenAI) allows more than one call. ``tool_format``: how calls are written (``tools.formats``).
    ``ValueError`` on anything else or an unknown name.
    """
    normalised = normalise_tools(tools)
    if tool_choice is None:
        tool_choice = "auto"
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if tool_choice.get("type") != "function" or not isinstance(function, dict) or "name" not in function:
            raise ValueError('tool_choice as a dict must be {"type": "function", "function": {"name": ...}}')
        tool_choice = function["name"]
    if not isinstance(tool_choice, str):
        raise ValueError(f"tool_choice must be 'auto', 'required', 'none', a tool name or a dict, got {tool_choice!r}")
    if not normalised:
        if tool_choice in ("auto", "none"):
            return None
        raise ValueError(f"tool_choice={tool_choice!r} needs tools")
    if tool_choice == "none":
        return None
    names = tuple(t["function"]["name"] for t in normalised)
    if tool_choice in ("auto", "required"):
        return ToolRequest(tuple(normalised), names, "auto" if tool_choice == "auto" else "call",
                           bool(parallel_tool_calls), format=tool_format)
    if tool_choice not in names:
        raise ValueError(f"tool_choice names {tool_choice!r}, which is not among the tools ({', '.join(names)})")
    return ToolRequest(tuple(normalised), (tool_choice,), "call", bool(parallel_tool_calls), named=True,
                       format=tool_format)
