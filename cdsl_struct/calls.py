"""A ``generate`` call resolved: what a request decodes under and how (``Call``), and the helpers
that read its Result back (tool calls, partial values). ``Generator`` (``api.py``) uses them; they hold
no model. Reading the call's arguments (the constraint, the reward) is ``arguments``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .constraints import CompiledConstraint, ConstraintSpec, Grammar, JsonSchema
from .constraints.reasoning import Reasoning
from .decoding import SamplingParams
from .decoding.penalties import Penalties
from .keywords import Keywords
from .options import Method
from .params import GenerationParams
from .result import Result, parse_value
from .rewards import Reward
from .streaming import partial_calls_reader, partial_reader
from .tools import InvalidToolCall, ToolRequest, parse_tool_output


@dataclass(frozen=True)
class Call:
    """One ``generate`` call, resolved: what to decode under, how, and for how long."""

    compiled: CompiledConstraint
    method: Method
    """``params.method`` resolved for this Generator (never ``AUTO``)."""
    params: GenerationParams
    sampling: SamplingParams
    reward: Reward | None = None
    tools: ToolRequest | None = None
    system: str | None = None
    answer_format: ConstraintSpec | None = None
    """With tools: the spec of an answer that is not a call (``schema=`` beside ``tools``)."""
    reasoning: Reasoning | None = None
    """Think first, then answer under ``compiled`` (``reasoning=``)."""
    keywords: Keywords | None = None
    """The keyword request (``keywords=``), whose coverage each Result reports."""

    @property
    def penalties(self) -> Penalties | None:
        return Penalties(self.params.presence_penalty, self.params.frequency_penalty) \
            if self.params.penalised else None


def budget_mode(call: Call) -> str:
    """``close`` or ``cut`` for ``call`` (``GenerationParams.on_budget``; ``auto``: close JSON and
    grammar answers and a keyword request's sentence; cut tool calls, whose closing would invent
    arguments an agent might run)."""
    mode = call.params.on_budget
    if mode == "auto":
        form = call.keywords.constraint if call.keywords is not None else None
        closable = call.tools is None and (isinstance(call.compiled.spec, (JsonSchema, Grammar))
                                           or (form is not None and call.compiled.spec == form))
        return "close" if closable else "cut"
    return mode


def partial_reader_for(call: Call) -> Callable[[str], Any] | None:
    """How a stream of ``call`` reads partial values: its JSON schema's, or under tools the calls
    begun so far with their partial arguments."""
    if call.tools is not None:
        return partial_calls_reader(call.tools.format)
    return partial_reader(call.compiled.spec)


def read_calls(tools: ToolRequest, answer: ConstraintSpec | None, result: Result) -> Result:
    """``result`` split into content and calls; a complete output's value is its calls (or, with no
    call, its answer, parsed by the answer format when there is one)."""
    complete = result.complete
    try:
        output = parse_tool_output(tools, result.text, complete=complete)
    except InvalidToolCall:  # cannot happen under the constraint; never pass it on as valid
        complete = False
        output = parse_tool_output(tools, result.text, complete=False)
    value = None
    if complete:
        value = output.calls or (parse_value(answer, output.content or "") if answer else output.content)
    return replace(result, content=output.content, tool_calls=output.calls, complete=complete, value=value)
