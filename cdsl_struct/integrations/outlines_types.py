"""Outlines output types as cdsl_struct specs.

``to_spec(output_type)`` takes what a user of the ``outlines`` package passes as an output type
and returns the equivalent ``JsonSchema``, ``Regex``, ``Choice`` or ``Grammar``:

- Outlines terms: ``outlines.types.JsonSchema`` / ``Regex`` / ``CFG`` / ``Choice`` and the regex
  DSL (``either``, ``optional``, ``between``, ``+`` / ``|`` ...), the built-in types
  (``outlines.types.integer``, ``email``, ``date`` ...);
- Python type forms, with Outlines' meaning: ``int``, ``float``, ``bool``, ``str``, ``date``,
  ``time``, ``datetime``, ``dict`` (any JSON), ``Literal[...]``, ``Enum`` classes, ``Union`` /
  ``Optional``, ``list[T]``, ``tuple[...]``, ``dict[K, V]``; pydantic models, dataclasses,
  ``TypedDict`` classes, genson ``SchemaBuilder`` objects and callables (JSON Schema of the
  signature).

The output constrained is exactly the one Outlines would constrain: regex-shaped types go through
Outlines' own ``python_types_to_terms`` and ``to_regex``. Literal and Enum types whose values are all
strings become ``Choice`` specs without needing Outlines installed; everything else needs the extra
``outlines``.

``Result.value`` is a value of the output type: structured types become JSON Schema specs (a
pydantic instance for models; a dataclass or TypedDict value for those); a Python type form
becomes a ``TypedRegex`` / ``TypedChoice`` / ``TypedGrammar``, a spec like its base whose ``parse``
reads the finished text as the type (``typed_values``): ``list[int]`` gives ``[1, 2]``, ``int``
gives ``3``, ``bool`` gives ``True``, ``str`` the text between the quotes, ``date`` a
``datetime.date``, an ``Enum`` its member, ``dict`` (any JSON) a dict. Outlines' own terms
(``types.Regex``, ``types.email``, the regex DSL) stay text, as in Outlines.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import typing
from typing import Any

from ..constraints.specs import Choice, ConstraintSpec, Grammar, JsonSchema, Regex, register_spec_converter
from ..errors import OutputInvalid, UnsupportedFeature
from .typed_values import value_reader

__all__ = ["TypedChoice", "TypedGrammar", "TypedRegex", "is_output_type", "to_spec"]


@dataclasses.dataclass(frozen=True)
class TypedRegex(Regex):
    """A ``Regex`` whose finished output is a value of a Python type: ``model.read(text)``.

    ``model`` (a ``typed_values.ValueReader``, or anything with ``read``) is not part of the
    constraint: the compile cache shares the engine program with the plain ``Regex`` and keeps one
    compiled constraint per model, as for pydantic models."""

    model: Any = dataclasses.field(default=None, compare=False)
    writes_json = True
    """The regexes of Python types write their values as JSON (``list[str]`` -> ``["a", "b"]``); a type
    whose values have no strings (``int``, ``date``) opens none, so the string guard never acts there."""

    def parse(self, text: str) -> Any:
        """The value of a finished output (``OutputInvalid`` if it names none)."""
        return self.model.read(text)


class TypedChoice(Choice):
    """A ``Choice`` whose chosen string is read by ``model.read`` (an ``Enum``'s member)."""

    model: Any

    def __init__(self, options: Any, model: Any) -> None:
        super().__init__(options)
        object.__setattr__(self, "model", model)

    def parse(self, text: str) -> Any:
        """The value of the chosen option."""
        return self.model.read(text)


@dataclasses.dataclass(frozen=True, eq=False)
class TypedGrammar(Grammar):
    """A ``Grammar`` whose finished output is read by ``model.read`` instead of lark (``dict``'s
    JSON grammar gives a dict)."""

    model: Any = dataclasses.field(default=None, compare=False)
    writes_json = True

    def parse(self, text: str) -> Any:
        """The value of a finished output."""
        return self.model.read(text)


class _EnumReader:
    """An all-string ``Enum``'s member from its value."""

    def __init__(self, enum_type: type[enum.Enum]) -> None:
        self.python_type = enum_type

    def read(self, text: str) -> Any:
        """The member whose value is ``text``."""
        return self.python_type(text)


class _JsonReader:
    """Any JSON value (``dict`` under Outlines' JSON grammar, a JSON Schema with Outlines' whitespace)."""

    def __init__(self, python_type: Any = None) -> None:
        self.python_type = python_type

    def read(self, text: str) -> Any:
        """``text`` parsed as JSON, a dict where the type is ``dict``."""
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise OutputInvalid(f"the finished output is not JSON: {exc}") from None
        if self.python_type is dict and not isinstance(value, dict):
            raise OutputInvalid(f"the finished output is JSON but no object: {text[:80]!r}")
        return value


@functools.lru_cache(maxsize=256)
def _enum_reader(enum_type: type[enum.Enum]) -> _EnumReader:
    return _EnumReader(enum_type)


_ANY_JSON = _JsonReader()
_DICT_JSON = _JsonReader(dict)

_TYPE_FORM_ORIGINS = (typing.Literal, typing.Union, list, tuple, dict)


def is_output_type(value: Any) -> bool:
    """True if ``value`` is an Outlines object or a Python type form ``to_spec`` understands."""
    module = getattr(type(value), "__module__", "") or ""
    if module == "outlines" or module.startswith("outlines.") or module == "genson" or module.startswith("genson."):
        return True
    if isinstance(value, type):
        return True  # classes: int/str/..., Enum, dataclass, TypedDict, pydantic (checked in to_spec)
    if typing.get_origin(value) is not None:
        return True  # Literal[...], Optional[...], list[int], ...
    return callable(value)


def to_spec(output_type: Any) -> ConstraintSpec:
    """The cdsl_struct spec that constrains output exactly as Outlines' ``output_type`` does.

    Raises ``UnsupportedFeature`` for an Outlines type with no spec here (a CFG nested inside a
    regex DSL term), ``TypeError`` for a value that is no output type, and ``ImportError`` (naming
    the extra) when the type needs the ``outlines`` package and it is not installed.
    """
    if isinstance(output_type, ConstraintSpec):
        return output_type
    native = _native_spec(output_type)
    if native is not None:
        return native
    return _outlines_spec(output_type)


# --- without Outlines --------------------------------------------------------------------------


def _native_spec(value: Any) -> ConstraintSpec | None:
    """Specs that need no Outlines: string Literals and Enums, pydantic models, dataclasses, TypedDicts."""
    if typing.get_origin(value) is typing.Literal:
        options = typing.get_args(value)
        if options and all(isinstance(option, str) for option in options):
            return Choice(options)
        return None
    if isinstance(value, type) and issubclass(value, enum.Enum):
        options = tuple(member.value for member in value)
        if options and all(isinstance(option, str) for option in options) and not _enum_function_members(value):
            return TypedChoice(options, _enum_reader(value))
        return None
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        return JsonSchema(value)
    if isinstance(value, type) and (dataclasses.is_dataclass(value) or _is_typeddict(value)):
        adapter = _adapter_model(value)
        return JsonSchema(adapter.schema, model=adapter)
    return None


def _enum_function_members(value: type) -> bool:
    """Outlines also counts plain functions assigned in an Enum's body as members."""
    prefix = f"{value.__qualname__}."
    return any(callable(v) and not k.startswith("_") and not getattr(v, "__qualname__", prefix).startswith(prefix)
               for k, v in vars(value).items() if type(v).__name__ == "function")


def _is_typeddict(value: type) -> bool:
    try:
        from typing_extensions import is_typeddict
    except ImportError:  # pragma: no cover
        is_typeddict = typing.is_typeddict
    return is_typeddict(value)


class _TypeAdapterModel:
    """Turns parsed JSON into a dataclass / TypedDict value (``Result.value``), like a pydantic model."""

    def __init__(self, python_type: type) -> None:
        from pydantic import TypeAdapter

        self.python_type = python_type
        self._adapter = TypeAdapter(python_type)
        self.schema = self._adapter.json_schema()

    def model_validate(self, data: Any) -> Any:
        """The value of ``data`` as the wrapped type."""
        return self._adapter.validate_python(data)

    def __repr__(self) -> str:
        return f"TypeAdapterModel({self.python_type.__qualname__})"


@functools.lru_cache(maxsize=256)
def _adapter_model(python_type: type) -> _TypeAdapterModel:
    # One adapter per type: compiled constraints are cached per (schema, model) pair.
    return _TypeAdapterModel(python_type)


# --- through Outlines --------------------------------------------------------------------------


def _outlines_spec(value: Any) -> ConstraintSpec:
    try:
        from outlines.types import dsl
    except ImportError as exc:
        raise ImportError(
            f"{value!r} is an Outlines output type; install the extra: pip install 'cdsl_struct[outlines]'"
        ) from exc
    if not isinstance(value, dsl.Term):
        return _typed(_term_spec(_python_term(value, dsl)), value)
    return _term_spec(value)


def _python_term(value: Any, dsl: Any) -> Any:
    """Outlines' term of a Python type form (``TypeError`` for a value that is none)."""
    try:
        return dsl.python_types_to_terms(value)
    except (TypeError, RecursionError) as exc:
        raise TypeError(f"not an output type cdsl_struct or Outlines understands: {value!r} ({exc})") from None


def _typed(spec: ConstraintSpec, python_type: Any) -> ConstraintSpec:
    """``spec`` (the constraint of a Python type form) with the reader of the type's values."""
    if isinstance(spec, JsonSchema):
        return spec  # a callable's or genson builder's schema: parsed JSON already
    if isinstance(spec, Grammar):
        return TypedGrammar(spec.source, model=_DICT_JSON if python_type is dict else _ANY_JSON)
    if isinstance(spec, Choice):
        return TypedChoice(spec.options, value_reader(python_type))
    if isinstance(spec, Regex):  # every field of the spec kept, the reader added
        given = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init}
        return TypedRegex(**given, model=value_reader(python_type))
    return spec


def _term_spec(value: Any) -> ConstraintSpec:
    """The spec of an Outlines term (its output is text, as in Outlines, but for JSON Schema terms)."""
    from outlines.types import dsl

    if isinstance(value, dsl.JsonSchema):
        schema = json.loads(value.schema)
        if value.whitespace_pattern is None:
            return JsonSchema(schema)
        # Outlines' own whitespace rule is part of the constraint: keep it exactly, as a regex.
        from outlines_core.json_schema import build_regex_from_schema

        return TypedRegex(build_regex_from_schema(value.schema, value.whitespace_pattern), model=_ANY_JSON)
    if isinstance(value, dsl.CFG):
        return Grammar(value.definition)
    if isinstance(value, dsl.Regex):
        return Regex(value.pattern)
    if isinstance(value, dsl.Choice) and value.items and all(isinstance(i, str) for i in value.items):
        return Choice(value.items)
    term = _python_term(value, dsl)
    if isinstance(term, dsl.JsonSchema | dsl.CFG | dsl.Regex):
        return _term_spec(term)
    if isinstance(term, dsl.String):
        return Choice([term.value])
    try:
        pattern = dsl.to_regex(term)
    except TypeError as exc:  # a CFG inside a regex term: Outlines cannot express it either
        raise UnsupportedFeature(f"{value!r} cannot be turned into one constraint: {exc}",
                                 feature="outlines-term") from None
    return Regex(pattern)


register_spec_converter(is_output_type, to_spec)
