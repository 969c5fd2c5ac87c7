"""Function calling: tools in OpenAI format (or Python functions), the constraint that makes
every call valid, the prompt that describes the tools, and parsing calls into ``ToolCall``.

A call is written as JSON, ``{"name": ..., "arguments": {...}}`` (a JSON array of such objects
when parallel calls are allowed), after the marker ``<tool_call>``. The constraint is a JSON
Schema whose ``anyOf`` has one branch per allowed tool, ``name`` fixed by ``const`` and
``arguments`` that tool's parameters schema, so the model cannot write an unknown tool or
invalid arguments. With ``tool_choice="auto"`` the model first writes either the marker or
plain text (``auto_choice_pattern``); only after the marker is the call decoded.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from .constraints.specs import check_json_schema, escape_regex

CALL_MARKER = "<tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    """One call the model made: the tool's ``name`` and its validated ``arguments``."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=_new_call_id)

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry (arguments as a JSON string)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


# --- tool definitions --------------------------------------------------------------------------


def tool_from_function(fn: Callable[..., Any]) -> dict[str, Any]:
    """An OpenAI tool dict for a Python function with type hints and a docstring.

    The description is the docstring up to an ``Args:`` section; that section (Google style,
    ``name: text`` or ``name (type): text``) gives the parameter descriptions. Parameters
    without a default are required; ``*args`` / ``**kwargs`` and missing type hints are
    ``ValueError``.
    """
    import pydantic

    if not callable(fn) or not getattr(fn, "__name__", None):
        raise ValueError(f"expected a named function, got {fn!r}")
    name = fn.__name__
    description, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = _type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"{name}: *args / **kwargs cannot be described as tool parameters")
        if param.name not in hints:
            raise ValueError(f"{name}: parameter {param.name!r} has no type hint")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints[param.name], pydantic.Field(default, description=param_docs.get(param.name)))
    model = pydantic.create_model(f"{name}_parameters", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    schema["additionalProperties"] = False
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(fn)
    except Exception as exc:  # NameError on unresolved forward references, TypeError on odd callables
        raise ValueError(f"{fn.__name__}: cannot read its type hints: {exc}") from None


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:", "Parameters:")),
                 len(lines))
    description = " ".join(line.strip() for line in lines[:start] if line.strip())
    params: dict[str, str] = {}
    current, indent = None, None
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            break  # the next section (Returns:, Raises:, ...)
        found = re.match(r"^\s+\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if found and (indent is None or depth <= indent):
            current, indent = found.group(1), depth
            params[current] = found.group(2).strip()
        elif current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
    return description, params


def normalise_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Tools as OpenAI dicts ``{"type": "function", "function": {"name", "description", "parameters"}}``.

    Accepts OpenAI tool dicts, flat ``{"name", "description", "parameters"}`` dicts and Python
    functions (see ``tool_from_function``). ``ValueError`` on a bad shape, a bad or repeated
    name; ``InvalidSchema`` when a parameters schema is not a valid JSON Schema.
    """
    if tools is None:
        return []
    if isinstance(tools, (dict, str, bytes)) or not isinstance(tools, Sequence):
        raise ValueError("tools must be a list of OpenAI tool dicts or Python functions")
    normalised: list[dict[str, Any]] = []
    for tool in tools:
        if callable(tool) and not isinstance(tool, dict):
            tool = tool_from_function(tool)
        normalised.append(_normalise_tool(tool))
    names = [t["function"]["name"] for t in normalised]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"tool names must be unique; repeated: {', '.join(repeated)}")
    return normalised


def _normalise_tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise ValueError(f"a tool must be a dict or a function, got {type(tool).__name__}")
    if "function" in tool:
        if tool.get("type", "function") != "function":
            raise ValueError(f"only tools of type 'function' are supported, got {tool.get('type')!r}")
        function = tool["function"]
    elif "name" in tool:
        function = tool
    else:
        raise ValueError("a tool dict needs 'function' (OpenAI format) or 'name'")
    if not isinstance(function, dict):
        raise ValueError("a tool's 'function' must be a dict")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise ValueError(f"tool {name}: description must be a string")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = dict(_EMPTY_PARAMETERS)
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ValueError(f"tool {name}: parameters must be a JSON Schema of type 'object'")
    check_json_schema(parameters)
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# --- tool choice and the call constraint -------------------------------------------------------


@dataclass(frozen=True)
class ToolRequest:
    """What a request allows: the tools, which may be called, and how.

    ``mode``: ``"auto"`` (text or a call) or ``"call"`` (at least one call is required).
    """

    tools: tuple[dict[str, Any], ...]
    allowed: tuple[str, ...]
    mode: str
    parallel: bool

    @property
    def call_schema(self) -> dict[str, Any]:
        """The JSON Schema of the model's output after the marker: one call, or a list of calls."""
        definitions: dict[str, Any] = {}
        branches = []
        for name in self.allowed:
            arguments = _hoist_definitions(self.parameters(name), name, definitions)
            branches.append({"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
                             "required": ["name", "arguments"], "additionalProperties": False})
        call = branches[0] if len(branches) == 1 else {"anyOf": branches}
        schema = {"type": "array", "items": call, "minItems": 1} if self.parallel else call
        return {**schema, "$defs": definitions} if definitions else schema

    def parameters(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"]["parameters"]
        raise KeyError(name)

    def system_prompt(self) -> str:
        """Tells the model the tools and the call format."""
        described = [self._describe(t) for t in self.tools if t["function"]["name"] in self.allowed]
        shape = '{"name": <function name>, "arguments": <JSON object of arguments>}'
        if self.parallel:
            shape = f"a JSON array of one or more {shape} objects"
        lines = ["You can call these functions:", *described, "",
                 f"To call a function, reply with {CALL_MARKER} followed by {shape}."]
        if self.mode == "auto":
            lines.append("Otherwise, answer in plain text.")
        else:
            lines.append("You must call a function now.")
        return "\n".join(lines)

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
                 parallel_tool_calls: bool = False) -> ToolRequest | None:
    """Resolve ``tools`` and ``tool_choice``; None when no call can be made (no tools, ``"none"``).

    ``tool_choice``: ``"auto"``, ``"required"``, ``"none"``, a tool's name, or
    ``{"type": "function", "function": {"name": ...}}``. ``ValueError`` on anything else or on
    an unknown name.
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
                           bool(parallel_tool_calls))
    if tool_choice not in names:
        raise ValueError(f"tool_choice names {tool_choice!r}, which is not among the tools ({', '.join(names)})")
    return ToolRequest(tuple(normalised), (tool_choice,), "call", bool(parallel_tool_calls))


def auto_choice_pattern(marker: str = CALL_MARKER) -> str:
    """A regex matching exactly ``marker`` or any text that does not start with ``marker``.

    Text not starting with the marker is empty, a proper prefix of it, or a prefix followed by
    a character that differs from the marker's next one, then anything.
    """
    prefixes = [escape_regex(marker[:i]) for i in range(1, len(marker))]
    diverge = [escape_regex(marker[:i]) + "[^" + _class_escape(marker[i]) + "]" for i in range(len(marker))]
    return f"{escape_regex(marker)}|({'|'.join(prefixes)})?|({'|'.join(diverge)})[\\s\\S]*"


def _class_escape(char: str) -> str:
    return "\\" + char if char in "\\]^-[" else char


# --- parsing -----------------------------------------------------------------------------------


class InvalidToolCall(ValueError):
    """A call's arguments do not validate against the tool's parameters schema."""


def parse_tool_calls(request: ToolRequest, text: str) -> list[ToolCall]:
    """Parse a complete call output (after the marker) and validate each call's arguments.

    Raises ``InvalidToolCall`` if the text is not a call or the arguments fail their schema
    (the constraint should make both impossible).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidToolCall(f"tool call is not JSON: {exc.msg}") from None
    calls = data if isinstance(data, list) else [data]
    parsed = []
    for call in calls:
        if not isinstance(call, dict) or call.get("name") not in request.allowed:
            raise InvalidToolCall(f"not a call of an allowed tool: {call!r}")
        arguments = call.get("arguments")
        schema = request.parameters(call["name"])
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        errors = sorted(validator(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            raise InvalidToolCall(f"{call['name']}: invalid arguments: {errors[0].message}")
        parsed.append(ToolCall(call["name"], arguments))
    return parsed
