"""``Result``: what a decoder returns, and the counters that explain its cost."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .keywords import KeywordReport
    from .tools import ToolCall


def _check_schema(schema: Any, data: Any) -> None:
    """``OutputInvalid`` when ``data`` fails ``schema``; ``InvalidSchema`` when the schema cannot judge it.

    A value is returned only once the schema has accepted it. The schema was checked when its spec
    was made, but the dict can be changed after that, and a spec-like object may skip the check:
    so it is checked again here (against its metaschema, the same ``check_json_schema`` rule, cached
    per schema text) and a schema that fails, or whose validation cannot run (a ``$ref`` that
    resolves nowhere, an unknown type, a pattern Python cannot read), raises ``InvalidSchema``,
    the error the spec itself raises for such a schema: the schema is at fault, not the output
    (``OutputInvalid`` is an engine's fault), and its output is never passed as validated.
    """
    import re

    import jsonschema
    import referencing.exceptions

    from .errors import InvalidSchema, OutputInvalid

    _check_usable(schema)
    try:
        error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(data))
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType, referencing.exceptions.Unresolvable,
            re.error) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidSchema(f"the schema cannot judge the finished output, so no value is returned: {first}") from exc
    if error is not None:
        raise OutputInvalid(f"the finished output does not satisfy the schema: {error.message}")


def _check_usable(schema: Any) -> None:
    """``InvalidSchema`` (or ``UnsatisfiableSchema``) unless ``schema`` passes the spec's own check."""
    from .errors import InvalidSchema

    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise InvalidSchema(f"the schema is not JSON ({exc}), so the finished output cannot be judged") from None
    _checked_schema_text(text)


@functools.lru_cache(maxsize=256)
def _checked_schema_text(text: str) -> bool:
    """Check one schema (as JSON text) once: a valid schema's check is cached, a failing one raises."""
    from .constraints.specs import check_json_schema

    check_json_schema(json.loads(text))
    return True


@dataclass
class DecodeStats:
    """Counters of one decode; they compare strategies independently of the machine."""

    target_passes: int = 0
    target_positions: int = 0
    draft_passes: int = 0
    draft_positions: int = 0
    proposed: int = 0
    accepted: int = 0
    forced: int = 0
    loop_guarded: int = 0
    """Positions where the loop guard (``decoding.loops``) penalised a cycle's continuation."""
    mask_seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def target_passes_per_token(self) -> float:
        """Target forward passes per generated token, prefill excluded."""
        return (self.target_passes - 1) / self.tokens if self.tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["acceptance_rate"] = round(self.acceptance_rate, 4)
        data["target_passes_per_token"] = round(self.target_passes_per_token, 4)
        return {k: round(v, 5) if isinstance(v, float) else v for k, v in data.items()}


@dataclass(frozen=True)
class Result:
    """A decoded output, built once (``dataclasses.replace`` makes a changed copy). ``value`` is set
    only when the output is complete (valid).

    ``finish_reason``: ``stop`` (EOS at a complete state, or a stop string where the constraint
    accepts the text before it), ``length`` (``max_tokens`` reached),
    ``constraint_dead_end`` (no token was allowed) or ``cancelled`` (the row was cancelled in the
    batched engine). ``tool_calls`` holds the parsed calls when
    the model called tools (``value`` is then that list; a call cut by ``max_tokens`` is kept with
    ``arguments=None`` and its partial ``arguments_text``). ``text`` is the whole output as
    written; ``content`` the message text outside calls (None when there is none).
    ``logprobs``: per token, when asked for (see ``cdsl_struct.decoding.logprobs``). ``method``
    names the decoder that ran (set by ``Generator.generate``). ``closed_by_budget``: the output
    was closed early to fit ``max_tokens`` (``on_budget="close"``): complete and valid, with
    ``finish_reason`` ``length``, but a string may be short and optional members missing.
    ``reasoning``: with ``reasoning=``, what the model thought between its markers (None where it
    did not think); ``text`` and ``value`` are then the answer after the thinking.
    ``keywords``: with ``keywords=``, which of them the answer holds (``KeywordReport``: covered,
    missing; inflections count).
    """

    text: str
    tokens: list[int]
    finish_reason: str
    complete: bool
    value: Any = None
    stats: DecodeStats = field(default_factory=DecodeStats)
    tool_calls: list[ToolCall] = field(default_factory=list)
    method: str = ""
    content: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    prompt_tokens: int = 0
    closed_by_budget: bool = False
    reasoning: str | None = None
    keywords: KeywordReport | None = None

    def __post_init__(self) -> None:
        if self.content is None and not self.tool_calls:
            object.__setattr__(self, "content", self.text)


def parse_value(spec: Any, text: str) -> Any:
    """The value of a complete output: JSON (or a pydantic instance), a ``lark.Tree``, or text.

    JSON is validated against the schema as given (``jsonschema``; a pydantic model validates
    its own instance): an output an engine let through that the schema refuses raises
    ``OutputInvalid`` rather than being returned as a value, and a schema that cannot be used to
    judge it (invalid, or a ``$ref`` that resolves nowhere) raises ``InvalidSchema``: a value is
    never returned unvalidated.
    """
    kind = getattr(spec, "kind", "")
    if kind == "json_schema":
        from .errors import OutputInvalid

        try:
            data = json.loads(text)
        except ValueError as exc:
            raise OutputInvalid(f"the finished output is not JSON: {exc}") from None
        model = getattr(spec, "model", None)
        if model is not None:
            try:
                return model.model_validate(data)
            except ValueError as exc:  # pydantic's ValidationError
                raise OutputInvalid(f"the finished output does not satisfy {model.__name__}: {exc}") from None
        _check_schema(spec.schema, data)
        return data
    if callable(getattr(spec, "parse", None)):  # a grammar (a lark.Tree), a typed spec (its value)
        return spec.parse(text)
    return text
