"""The one constraint of a request with tools: text, an answer in a format, or calls.

Function calling is a translation at the two edges of decoding: here the tools become a single
grammar (llguidance's Lark dialect, with each call's JSON embedded by ``%json``), so the row
decodes once under one constraint like any other; ``parsing`` turns the text back into calls.

The calls are written in the request's format (``tools.formats``: hermes, llama3, mistral, gemma,
generic), built as a structural tag (``constraints.structural_tag``) whose trigger is the format's.
Shapes of the output, ``T`` being the trigger, ``O``/``S``/``E`` the format's open, separator and
close, ``C`` one call's JSON:

- ``tool_choice="auto"``: text without ``T`` (ends at EOS), or text then ``O C`` (``S C``... when
  parallel calls are allowed) ``E``. With an answer format: that format's JSON, or ``O C``... ``E``.
- ``"required"`` or a named tool: ``O C`` (``S C``...) ``E``.

In the generic format ``O`` = ``S`` = ``<tool_call>`` and ``E`` is empty. Text before the first call
is the message's content. Every call's arguments satisfy the tool's parameters schema, so a
complete output always parses into valid calls.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Any

from ..constraints.closed_objects import close_objects
from ..constraints.specs import Grammar
from ..constraints.structural_tag import lark_literal, special_tokens_in, text_then, text_without
from ..constraints.whitespace import DEFAULT_WHITESPACE, WhitespacePolicy
from .formats import ToolFormat
from .request import ToolRequest


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

    def engine_grammar(self, policy: WhitespacePolicy, vocabulary: Any = None) -> str:
        """What llguidance compiles: this grammar, where the format's markers that are special tokens
        of ``vocabulary`` may also be written as those tokens (the JSON layout is this grammar's own
        ``whitespace``, not ``policy``)."""
        import llguidance

        specials = format_specials(self.request.format, vocabulary) if vocabulary is not None else {}
        text = _lark(self.request, self.answer_format, self.whitespace, specials) if specials else self.text
        return llguidance.LLMatcher.grammar_from_lark(text)

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


def _lark(request: ToolRequest, answer_format: dict[str, Any] | None, policy: WhitespacePolicy,
          specials: dict[str, int] | None = None) -> str:
    """The grammar of ``request``'s output in its format (``tools.formats``): free text, then a
    trigger and the calls, as a structural tag whose one tag holds all the calls. ``specials``: the
    format's markers that are one special token of the vocabulary (Qwen's ``<tool_call>``), by
    text: each may be written as that token or spelled out."""
    fmt = request.format
    lit = functools.partial(lark_literal, specials=specials or {})
    body = "call_rest" if fmt.trigger_in_call or fmt.name_then is not None else "call"
    more = f" (sep {body if not fmt.trigger_in_call else 'trigger call_rest'})*" if request.parallel else ""
    token = (specials or {}).get(fmt.trigger)
    lines = [f"opened: TEXT_THEN_TRIGGER{f' | TEXT <[{token}]>' if token is not None else ''}"]
    if fmt.trigger_in_call:  # the call's JSON starts with the trigger (llama3)
        calls = f"trigger call_rest{more}"
        after_text = f"opened call_rest{more}"
        lines += [*_named_calls(request, policy), f"trigger: {lit(fmt.trigger)}"]
    else:
        opened = fmt.open[len(fmt.trigger):]
        calls = f"open {body}{more}"
        after_text = f"opened {lit(opened)} {body}{more}" if opened else f"opened {body}{more}"
        lines.append(f"open: {lit(fmt.open)}")
        if fmt.name_then is not None:  # NAME, then the arguments' JSON (DeepSeek)
            lines += _named_calls(request, policy)
        else:
            lines.append(f"call: %json {_embedded(request.call_schema, policy)}")
    close = f" {lit(fmt.close)}" if fmt.close else ""
    if request.mode == "call":
        start = calls + close
    elif answer_format is not None:
        start = f"answer | {calls}{close}"
        lines.append(f"answer: %json {_embedded(answer_format, policy)}")
    else:
        start = f"TEXT | {after_text}{close}"
    lines = [f"start: {start}", *lines, f"TEXT: {text_without([fmt.trigger])}",
             f"TEXT_THEN_TRIGGER: {text_then(fmt.trigger, [fmt.trigger])}"]
    if request.parallel:
        lines.append(f"sep: {lit(fmt.separator)}")
    return "\n".join(lines) + "\n"


def format_specials(fmt: ToolFormat, vocabulary: Any) -> dict[str, int]:
    """The special tokens of ``vocabulary`` whose text is one of ``fmt``'s markers or inside them
    (Qwen 3's ``<tool_call>`` and ``</tool_call>``), by text: the model writes them as one token."""
    return special_tokens_in(vocabulary, (fmt.trigger, fmt.open, fmt.separator, fmt.close))


def _named_calls(request: ToolRequest, policy: WhitespacePolicy) -> list[str]:
    """``call_rest``, one branch per tool, each tool's arguments under its own schema: what follows the
    trigger in a format whose call starts with it (``NAME", "parameters": ARGS}``), or a call that is
    the name then the arguments (``NAME`` ``name_then`` ``ARGS``)."""
    fmt = request.format
    branches, lines = [], []
    schema = request.call_schema
    defs = schema.get("$defs")
    for k, name in enumerate(request.allowed):
        head = name + fmt.name_then if fmt.name_then is not None else f'{json.dumps(name)[1:]}, "{fmt.arguments_key}": '
        tail = "" if fmt.name_then is not None else ' "}"'
        arguments = request.parameters(name) if not defs else {**_branch(schema, k)["properties"][fmt.arguments_key],
                                                              "$defs": defs}
        branches.append(f"call_{k}")
        lines.append(f"call_{k}: {_string(head)} arguments_{k}{tail}")
        lines.append(f"arguments_{k}: %json {_embedded(arguments, policy)}")
    return [f"call_rest: {' | '.join(branches)}", *lines]


def _branch(schema: dict[str, Any], k: int) -> dict[str, Any]:
    return schema["anyOf"][k] if "anyOf" in schema else schema


def _string(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _embedded(schema: Any, policy: WhitespacePolicy) -> str:
    """A schema for ``%json``, carrying the whitespace policy the way llguidance reads it."""
    from ..constraints.backends.llguidance_backend import _json_options  # one source of the options

    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    return json.dumps({**schema, "x-guidance": _json_options(policy)}, ensure_ascii=False)
