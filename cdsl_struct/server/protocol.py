"""Request models of the OpenAI-compatible endpoints and their translation to ``Generator.generate``.

Unknown OpenAI fields are accepted and ignored; fields whose meaning the server cannot honour
(``n`` > 1, ``stop``, ``logprobs``, penalties, ``logit_bias``, ``echo``, ``suffix``, ``best_of``)
are refused with a 400 naming them rather than silently dropped. Extension fields: ``regex``,
``grammar``, ``choices``, ``keywords``, ``method``, and ``chat`` on completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError


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


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat,
                           Field(discriminator="type")]


class StreamOptions(_Model):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts."""

    include_usage: bool = False


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


@dataclass
class GenerateCall:
    """What one request asks of the Generator: the prompt, keyword arguments, and which field
    carried the constraint (the ``param`` of a compile error)."""

    prompt: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    constraint_param: str | None = None


class _GenerationRequest(_Model):
    """Fields shared by both endpoints."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # extensions
    regex: str | None = None
    grammar: str | None = None
    choices: list[str] | None = Field(default=None, min_length=1)
    keywords: list[str] | None = None
    method: str | None = None

    def _refuse_unsupported(self) -> None:
        if self.n not in (None, 1):
            raise APIError(400, f"n={self.n} is not supported: this server returns one choice per prompt (n=1).",
                           param="n", code="unsupported_parameter")
        if self.stop:
            raise APIError(400, "stop sequences are not supported: cutting the output could break its constraint. "
                                "Use regex, grammar or response_format to shape where it ends.",
                           param="stop", code="unsupported_parameter")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported.", param=name, code="unsupported_parameter")
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported.", param="logit_bias", code="unsupported_parameter")

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
        for name in ("regex", "grammar", "choices"):
            if getattr(self, name) is not None:
                given[name] = (name, getattr(self, name))
        if len(given) > 1:
            raise APIError(400, f"Give at most one of response_format (json), regex, grammar and choices; got "
                                f"{', '.join(given)}.", param=list(given)[1], code="conflicting_constraints")
        if not given:
            return {}, None
        param, (keyword, value) = next(iter(given.items()))
        return {keyword: value}, param

    def _sampling(self, default_max_tokens: int, max_tokens: int | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_tokens": max_tokens or default_max_tokens}
        for name in ("temperature", "top_p", "seed", "method", "keywords"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs

    @property
    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "required", "none"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def to_call(self, default_max_tokens: int) -> GenerateCall:
        """The Generator call this request asks for (raises ``APIError`` for what is not supported)."""
        self._refuse_unsupported()
        if self.logprobs or self.top_logprobs:
            raise APIError(400, "logprobs are not supported.", param="logprobs", code="unsupported_parameter")
        kwargs, param = self._constraint()
        kwargs.update(self._sampling(default_max_tokens, self.max_completion_tokens or self.max_tokens))
        tools = [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None
        if tools:
            kwargs["tools"] = tools
            param = param or "tools"
            if self.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = self.parallel_tool_calls
        if self.tool_choice is not None:
            choice = self.tool_choice
            kwargs["tool_choice"] = choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
        messages = [message.model_dump(exclude_none=True) for message in self.messages]
        return GenerateCall(prompt=messages, kwargs=kwargs, constraint_param=param)


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
    logprobs: int | None = None

    def to_call(self, default_max_tokens: int) -> GenerateCall:
        """The Generator call this request asks for (raises ``APIError`` for what is not supported)."""
        self._refuse_unsupported()
        for name, unsupported in (("echo", self.echo), ("suffix", self.suffix),
                                  ("best_of", self.best_of not in (None, 1)), ("logprobs", self.logprobs)):
            if unsupported:
                raise APIError(400, f"{name} is not supported.", param=name, code="unsupported_parameter")
        prompt: Any = self.prompt
        if isinstance(prompt, list):
            if not prompt:
                raise APIError(400, "prompt is an empty list.", param="prompt", code="invalid_value")
            if len(prompt) == 1:
                prompt = prompt[0]
            elif self.stream:
                raise APIError(400, "A list of prompts cannot be streamed; send them one by one.",
                               param="prompt", code="unsupported_parameter")
        kwargs, param = self._constraint()
        kwargs.update(self._sampling(default_max_tokens, self.max_tokens))
        kwargs["chat"] = self.chat
        return GenerateCall(prompt=prompt, kwargs=kwargs, constraint_param=param)

