"""Tool definitions: OpenAI tool dicts or Python functions, normalised; ``ToolCall``, one call made."""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..constraints.specs import check_json_schema

CALL_MARKER = "<tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"
"""Around a tool's result shown back to the model (the hermes convention that ``CALL_MARKER`` follows)."""
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def new_call_id() -> str:
    """A fresh OpenAI-style call id, ``call_...``."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    """One call the model made: the tool's ``name`` and its validated ``arguments``."""

    name: str
    arguments: dict[str, Any] | None
    id: str = field(default_factory=new_call_id)
    arguments_text: str | None = None
    """The arguments as the model wrote them; for a call cut short by ``max_tokens`` this is the
    partial JSON text and ``arguments`` is None."""

    @property
    def complete(self) -> bool:
        """Whether the call was finished (its arguments parsed and validated)."""
        return self.arguments is not None

    def arguments_json(self) -> str:
        """The arguments as a JSON string (the partial text for an unfinished call)."""
        if self.arguments is None:
            return self.arguments_text or ""
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry (arguments as a JSON string)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json()}}


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
