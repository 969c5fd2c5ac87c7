"""Request models of the OpenAI-compatible endpoints and their translation to ``Generator.generate``.

Unknown OpenAI fields are accepted and ignored; fields whose meaning the server cannot honour
(``logit_bias``, ``echo``, ``suffix``, ``best_of``) are refused with a 400 naming them rather
than silently dropped. ``n`` runs n rows of the batch; ``stop`` ends an output only where its
constraint accepts the text before the stop string (``cdsl_struct.decoding.stops``); logprobs
are those of the distribution actually sampled from (``cdsl_struct.decoding.logprobs``).
Extension fields: ``regex``, ``grammar`` (Lark text, never a file), ``choices``, ``keywords``,
``method``, and ``chat`` on completions. ``ServerLimits`` bounds what one request may ask.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..constraints.reasoning import Reasoning
from ..constraints.specs import Grammar
from ..errors import CdslError, InvalidArgument
from ..options import ConflictingConstraints, one_constraint
from ..params import MAX_TOP_LOGPROBS, GenerationParams
from ..tools.formats import FORMATS
from .errors import APIError


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask: ``max_tokens``, ``n``, and the size and nesting of a schema,
    grammar or regex it sends (beyond them: 400 naming the field)."""

    max_tokens: int = 4096
    max_n: int = 8
    max_constraint_bytes: int = 64 * 1024
    max_schema_depth: int = 48
    max_rows: int = 16
    """Rows one request may add to the batch (``/v1/completions`` prompts times ``n``)."""
    max_stop_chars: int = 256
    max_grammar_rules: int = 300
    """Rules and terminals a client's Lark grammar defines: lark's Earley parser takes time quadratic
    in them to build (a 1,000-rule grammar took 4-18 s, a 3,000-rule one about 40 s, on 2 cores)."""

    def check_constraint(self, param: str, value: Any) -> None:
        """400 when a client's schema, grammar or regex is too large or too deeply nested."""
        size = len(json.dumps(value, ensure_ascii=False)) if not isinstance(value, str) else len(value.encode())
        if size > self.max_constraint_bytes:
            raise APIError(400, f"{param} is {size} bytes; this server accepts at most {self.max_constraint_bytes}.",
                           param=param, code="constraint_too_large")
        rules = len(_RULE_DEFINITION.findall(value)) if param == "grammar" and isinstance(value, str) else 0
        if rules > self.max_grammar_rules:
            raise APIError(400, f"grammar defines {rules} rules and terminals; this server accepts at most "
                           f"{self.max_grammar_rules}.",
                           param=param, code="constraint_too_large")
        if _depth(value) > self.max_schema_depth:
            raise APIError(400, f"{param} is nested deeper than {self.max_schema_depth} levels.", param=param,
                           code="constraint_too_deep")


_RULE_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\{[^}]*\})?(?:\.-?\d+)?[ \t]*:", re.MULTILINE)
"""The start of a Lark rule or terminal definition (``name:``, ``?name:``, ``NAME.2:``, ``name{x}:``)."""


def _check_streamed_logprobs(asked: bool) -> None:
    """Streamed chunks carry no log-probabilities yet: say so rather than drop them silently."""
    if asked:
        raise APIError(400, "logprobs cannot be streamed by this server yet; send a non-streamed request for them.",
                       param="logprobs", code="unsupported_parameter")


def _depth(value: Any) -> int:
    depth, level = 0, [value]
    while level:
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node)]
        depth += 1
    return depth


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class JsonSchemaFormat(_Model):
    """``response_format.json_schema``: ``name``, ``schema``, optional ``description`` and ``strict``."""

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextFormat(_Model):
    """``{"type": "text"}``: no constraint."""

    type: Literal["text"]


class JsonObjectFormat(_Model):
    """``{"type": "json_object"}``: any JSON object."""

    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Model):
    """``{"type": "json_schema", "json_schema": {...}}``: JSON valid against the schema."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class StructuralTagResponseFormat(_Model):
    """``{"type": "structural_tag", ...}``: free text in which triggers start constrained tags, in vLLM's
    shape (``structures``, ``triggers``) or XGrammar's (``format``); see ``constraints.structural_tag``."""

    type: Literal["structural_tag"]
    structures: list[Any] | None = None
    triggers: list[Any] | None = None
    format: dict[str, Any] | None = None

    def spec(self) -> Any:
        """The ``StructuralTag`` it asks for (``InvalidStructuralTag`` / ``InvalidSchema`` when malformed)."""
        from ..constraints.structural_tag import from_response_format

        return from_response_format(self.model_dump(exclude_none=True))


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat | StructuralTagResponseFormat,
                           Field(discriminator="type")]


class StreamOptions(_Model):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts;
    ``partial_values`` (ours) puts the answer's typed partial value so far in each content chunk
    (``partial_value``, a JSON schema's answer) and each call's partial arguments in its argument
    chunks (``partial_arguments``): every one a prefix of the final value."""

    include_usage: bool = False
    partial_values: bool = False


class FunctionDefinition(_Model):
    """A tool's function: name, description, JSON Schema of its parameters."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Model):
    """A tool in OpenAI's format."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Model):
    """The function named by ``tool_choice``."""

    name: str


class NamedToolChoice(_Model):
    """``{"type": "function", "function": {"name": X}}``: this tool must be called."""

    type: Literal["function"] = "function"
    function: NamedFunction


class ChatMessage(_Model):
    """A chat message, passed on to the Generator (which renders it with the chat template)."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True)
class GenerateCall:
    """What one request asks of the Generator: the prompt, how to decode it (``params``), what
    under (``kwargs``: the constraint, tools, keywords, ``chat``), and which field carried the
    constraint (the ``param`` of a compile error)."""

    prompt: Any
    params: GenerationParams = GenerationParams()
    kwargs: dict[str, Any] = field(default_factory=dict)
    constraint_param: str | None = None
    n: int = 1
    named_tool: bool = False
    """``tool_choice`` named a function: OpenAI then finishes a call with ``stop``."""

    @property
    def is_batch(self) -> bool:
        """Whether ``prompt`` is several prompts (strings or message lists: ``generate_batch``),
        not one (a string or one message list: ``generate``)."""
        return isinstance(self.prompt, list) and not all(isinstance(p, dict) for p in self.prompt)

    @property
    def tool_mode(self) -> bool:
        """Whether the output may hold tool calls."""
        return bool(self.kwargs.get("tools")) and self.kwargs.get("tool_choice") != "none"


class _GenerationRequest(_Model):
    """Fields shared by both endpoints."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # extensions
    regex: str | None = None
    grammar: str | None = None
    choices: list[str] | None = Field(default=None, min_length=1)
    keywords: list[str] | dict[str, Any] | None = None
    """Words the answer should hold (``generate(keywords=)``): a list, or ``{"words": [...], "name":
    bool, "form": "sentence" | "paragraph" | "text", "instruction": "... {words} ..."}``
    (``Keywords``' fields); each choice reports ``keywords``:
    ``{"covered": [...], "missing": [...]}``."""
    method: str | None = None
    on_budget: str | None = None
    """``close`` / ``cut`` / ``auto`` (``GenerationParams.on_budget``); a closed answer's choice
    says ``closed_by_budget: true``."""
    reasoning: bool | int | dict[str, Any] | None = None
    """Think first, then answer under the constraint (``generate(reasoning=)``: true, a budget of
    thinking tokens, or ``{"budget", "open", "close", "required"}``); the thinking comes back as
    ``reasoning_content``, as vLLM and DeepSeek's API give it."""
    chat_template_kwargs: dict[str, Any] | None = None
    """As vLLM reads it: ``{"enable_thinking": bool}`` turns reasoning on or off where
    ``reasoning`` is not given (other keys are refused)."""

    def _check(self, limits: ServerLimits) -> None:
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported.", param="logit_bias", code="unsupported_parameter")
        if self.n > limits.max_n:
            raise APIError(400, f"n={self.n} is over this server's limit of {limits.max_n}.", param="n",
                           code="invalid_value")
        if self.n > 1 and self.stream:
            raise APIError(400, "n > 1 cannot be streamed; send n=1 streams or a non-streamed request.",
                           param="n", code="unsupported_parameter")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])  # count: GenerationParams
        if any(len(stop) > limits.max_stop_chars for stop in stops):
            raise APIError(400, f"a stop string may have at most {limits.max_stop_chars} characters.", param="stop",
                           code="invalid_value")

    def _constraint(self) -> tuple[dict[str, Any], str | None]:
        given: dict[str, Any] = {}
        fmt = self.response_format
        if isinstance(fmt, JsonObjectFormat):
            given["response_format"] = ("schema", {"type": "object"})
        elif isinstance(fmt, JsonSchemaResponseFormat):
            schema = fmt.json_schema.schema_
            if schema is None:
                raise APIError(400, "response_format.json_schema.schema is required.",
                               param="response_format.json_schema.schema", code="invalid_schema")
            given["response_format"] = ("schema", schema)
        elif isinstance(fmt, StructuralTagResponseFormat):
            try:
                given["response_format"] = ("grammar", fmt.spec())
            except CdslError as exc:
                from .errors import from_exception

                raise from_exception(exc, param="response_format") from exc
        if self.regex is not None:
            given["regex"] = ("regex", self.regex)
        if self.grammar is not None:  # text only: a client never names a file on the server
            given["grammar"] = ("grammar", Grammar.from_text(self.grammar))
        if self.choices is not None:
            given["choices"] = ("choices", self.choices)
        try:
            chosen = one_constraint(given)
        except ConflictingConstraints as exc:
            names = ", ".join(exc.given)
            message = f"Give at most one of response_format (json), regex, grammar and choices; got {names}."
            raise APIError(400, message, param=exc.given[1], code="conflicting_constraints") from None
        if chosen is None:
            return {}, None
        param, (keyword, value) = chosen
        return {keyword: value}, param

    def constraint_field(self) -> str | None:
        """The request field that carries its constraint (before it is read), if any."""
        for param, value in (("grammar", self.grammar), ("regex", self.regex), ("choices", self.choices),
                             ("response_format", self.response_format)):
            if value is not None and not (param == "response_format" and not isinstance(
                    value, (JsonObjectFormat, JsonSchemaResponseFormat, StructuralTagResponseFormat))):
                return param
        return None

    def _sized_constraint(self, limits: ServerLimits) -> tuple[dict[str, Any], str | None]:
        fmt = self.response_format
        schema = fmt.json_schema.schema_ if isinstance(fmt, JsonSchemaResponseFormat) else \
            fmt.model_dump(exclude_none=True) if isinstance(fmt, StructuralTagResponseFormat) else None
        for param, value in (("response_format", schema), ("regex", self.regex), ("grammar", self.grammar)):
            if value is not None:
                limits.check_constraint(param, value)
        try:
            return self._constraint()
        except APIError:
            raise
        except Exception as exc:  # a grammar's syntax error: the caller maps it to 400
            from .errors import from_exception

            raise from_exception(exc, param="grammar") from exc

    def _params(self, default_max_tokens: int, max_tokens: int | None, limits: ServerLimits,
                logprobs: int | None) -> GenerationParams:
        """The request's ``GenerationParams`` (fields it leaves out take the library's defaults)."""
        if max_tokens is not None and max_tokens > limits.max_tokens:
            raise APIError(400, f"max_tokens={max_tokens} is over this server's limit of {limits.max_tokens}.",
                           param="max_tokens", code="invalid_value")
        given = {name: getattr(self, name) for name in ("temperature", "top_p", "seed", "method", "stop",
                                                         "presence_penalty", "frequency_penalty", "on_budget")
                 if getattr(self, name) is not None}
        try:
            return GenerationParams(max_tokens=min(max_tokens or default_max_tokens, limits.max_tokens),
                                    logprobs=logprobs, **given)
        except InvalidArgument as exc:
            raise APIError(400, str(exc), param=exc.param, code="invalid_value") from None

    def _extensions(self) -> dict[str, Any]:
        given: dict[str, Any] = {"keywords": self.keywords} if self.keywords is not None else {}
        template = self.chat_template_kwargs or {}
        if set(template) - {"enable_thinking"}:
            raise APIError(400, "chat_template_kwargs takes only enable_thinking here.",
                           param="chat_template_kwargs", code="unsupported_parameter")
        reasoning = self.reasoning if self.reasoning is not None else template.get("enable_thinking")
        if reasoning is not None:
            try:
                given["reasoning"] = Reasoning.of(reasoning)
            except InvalidArgument as exc:
                raise APIError(400, str(exc), param="reasoning", code="invalid_value") from None
        return given

    @property
    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def include_partials(self) -> bool:
        """Whether a streamed answer's chunks carry partial values (``stream_options.partial_values``)."""
        return bool(self.stream_options and self.stream_options.partial_values)


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "required", "none"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    tool_format: str | None = None
    """Our extension: write this request's calls in a family's format (``hermes``, ``llama3``,
    ``mistral``, ``gemma``, ``deepseek``, ``generic``) instead of the server's."""
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def to_call(self, default_max_tokens: int, limits: ServerLimits = ServerLimits()) -> GenerateCall:
        """The Generator call this request asks for (raises ``APIError`` for what is not supported)."""
        self._check(limits)
        _check_streamed_logprobs(bool(self.stream and self.logprobs))
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}].", param="top_logprobs",
                           code="invalid_value")
        kwargs, param = self._sized_constraint(limits)
        if "schema" in kwargs and self.tools:
            param = "response_format"
        params = self._params(default_max_tokens, self.max_completion_tokens or self.max_tokens, limits,
                              (self.top_logprobs or 0) if self.logprobs else None)
        kwargs.update(self._extensions())
        tools = [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None
        if tools:
            for i, tool in enumerate(tools):
                limits.check_constraint(f"tools[{i}].function.parameters", tool["function"].get("parameters") or {})
            kwargs["tools"] = tools
            param = param or "tools"
            kwargs["parallel_tool_calls"] = self.parallel_tool_calls is not False
        if self.tool_format is not None:
            if self.tool_format not in FORMATS:
                raise APIError(400, f"unknown tool_format {self.tool_format!r}; choose one of {', '.join(FORMATS)}.",
                               param="tool_format", code="invalid_value")
            kwargs["tool_format"] = self.tool_format
        named = isinstance(self.tool_choice, NamedToolChoice)
        if self.tool_choice is not None:
            choice = self.tool_choice
            kwargs["tool_choice"] = choice.model_dump() if named else choice
        messages = [message.model_dump(exclude_none=True) for message in self.messages]
        prompt: Any = messages if self.n == 1 else [messages] * self.n
        return GenerateCall(prompt=prompt, params=params, kwargs=kwargs, constraint_param=param, n=self.n,
                            named_tool=named)


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``: ``prompt`` is a string, or a list of strings (a batch, not streamed).

    The prompt is continued as it is; the extension ``chat: true`` sends it as one user message
    through the chat template instead.
    """

    prompt: str | list[str]
    chat: bool = False
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def to_call(self, default_max_tokens: int, limits: ServerLimits = ServerLimits()) -> GenerateCall:
        """The Generator call this request asks for (raises ``APIError`` for what is not supported)."""
        self._check(limits)
        _check_streamed_logprobs(bool(self.stream and self.logprobs is not None))
        for name, unsupported in (("echo", self.echo), ("suffix", self.suffix),
                                  ("best_of", self.best_of not in (None, 1))):
            if unsupported:
                raise APIError(400, f"{name} is not supported.", param=name, code="unsupported_parameter")
        prompt: Any = self.prompt
        if isinstance(prompt, list):
            if not prompt:
                raise APIError(400, "prompt is an empty list.", param="prompt", code="invalid_value")
            if len(prompt) * self.n > limits.max_rows:
                raise APIError(400, f"{len(prompt)} prompts times n={self.n} is over this server's limit of "
                                    f"{limits.max_rows} rows per request; send fewer prompts per request.",
                               param="prompt", code="invalid_value")
            if len(prompt) == 1:
                prompt = prompt[0]
            elif self.stream:
                raise APIError(400, "A list of prompts cannot be streamed; send them one by one.",
                               param="prompt", code="unsupported_parameter")
        kwargs, param = self._sized_constraint(limits)
        params = self._params(default_max_tokens, self.max_tokens, limits, self.logprobs)
        kwargs.update(self._extensions(), chat=self.chat)
        if self.n > 1:  # prompt-major, as OpenAI orders the choices
            prompts = prompt if isinstance(prompt, list) else [prompt]
            prompt = [p for p in prompts for _ in range(self.n)]
        return GenerateCall(prompt=prompt, params=params, kwargs=kwargs, constraint_param=param, n=self.n)

