"""``BatchJob``: the settings every row of a bulk job is decoded under (plain data, so it travels
to Ray actors). Its own module, so that the job runner, the Ray engine and the row decoder all
depend on it and not on each other."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..options import DEFAULT_WHITESPACE, one_constraint
from ..params import GenerationParams


@dataclass
class BatchJob:
    """What every row is decoded under. Plain data, so it travels to Ray actors.

    Constraint: at most one of ``schema`` (JSON Schema text or dict), ``tools`` (OpenAI tool
    dicts), ``regex``, ``choices``, ``grammar`` (Lark text, file or shipped name).
    """

    schema: Any = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    regex: str | None = None
    choices: list[str] | None = None
    grammar: str | None = None
    model: str = "smollm2"
    draft: str | None = "auto"
    backend: str = "auto"
    whitespace: str = DEFAULT_WHITESPACE
    loop_guard: bool = True
    string_guard: bool = True
    device: str = "auto"
    dtype: str = "auto"
    params: GenerationParams = GenerationParams()
    """How every row decodes (with ``seed``, the rows of one ``generate`` call sample with
    ``seed``, ``seed + 1``, ...)."""
    max_batch_size: int = 16
    chat: bool = True
    torch_compile: str = "off"
    """``Generator``'s ``torch_compile`` (``options.COMPILE_MODES``): ``"auto"`` pays for a long job."""

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``Generator.generate`` for every row."""
        kwargs: dict[str, Any] = {"params": self.params, "chat": self.chat}
        for name in ("schema", "regex", "choices", "grammar"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if self.tools is not None:
            kwargs.update(tools=self.tools, tool_choice=self.tool_choice)
        return kwargs

    def generator(self) -> Any:
        """A ``Generator`` for this job's model, draft, engine and device."""
        from ..api import Generator

        return Generator(self.model, draft=self.draft, backend=self.backend, whitespace=self.whitespace,
                         loop_guard=self.loop_guard, string_guard=self.string_guard, device=self.device,
                         dtype=self.dtype, max_batch_size=self.max_batch_size, torch_compile=self.torch_compile)

    def check(self) -> None:
        """Check the constraint up front: a bad one fails the job before any row, with its typed error."""
        one_constraint({name: getattr(self, name) for name in ("schema", "tools", "regex", "choices", "grammar")})
        from ..constraints import Choice, Grammar, JsonSchema, Regex

        if self.schema is not None:  # each raises its typed error for a bad constraint
            JsonSchema(self.schema)
        if self.regex is not None:
            Regex(self.regex)
        if self.choices is not None:
            Choice(self.choices)
        if self.grammar is not None:
            Grammar(self.grammar)
        if self.tools is not None and (not isinstance(self.tools, list) or not self.tools):
            raise ValueError("tools must be a non-empty list of OpenAI tool objects")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what travels to a Ray actor): ``from_dict`` reads it back."""
        return {**asdict(self), "params": self.params.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchJob:
        """The job ``to_dict`` wrote."""
        return cls(**{**data, "params": GenerationParams.from_dict(data["params"])})
