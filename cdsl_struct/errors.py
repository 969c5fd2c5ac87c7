"""Typed errors raised by cdsl_struct. Every message says what is wrong and what to do."""

from __future__ import annotations


class CdslError(Exception):
    """Base class of every error cdsl_struct raises on purpose."""


class CompileError(CdslError):
    """A constraint could not be compiled (bad spec, or a feature the engine cannot express)."""


class InvalidSchema(CompileError):
    """The JSON Schema itself is invalid (fails the JSON Schema metaschema, or is not JSON)."""


class UnsatisfiableSchema(CompileError):
    """The JSON Schema is valid but no JSON value satisfies it."""


class UnsupportedFeature(CompileError):
    """The constraint uses a feature that the selected engine cannot express exactly.

    ``feature`` names it; a looser constraint is never substituted.
    """

    def __init__(self, message: str, *, feature: str, backend: str | None = None) -> None:
        super().__init__(message)
        self.feature = feature
        self.backend = backend


class GrammarSyntaxError(CompileError):
    """A Lark grammar or regex has a syntax error; ``line`` and ``column`` locate it (1-based)."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class UnknownGrammar(CompileError, ValueError):
    """A grammar given by name (a bare identifier, see ``Grammar``) that is not a shipped grammar.

    ``name`` is the name asked for, ``known`` the shipped names, ``suggestion`` the closest of them
    (``None`` when none is close).
    """

    def __init__(self, message: str, *, name: str, known: tuple[str, ...] = (),
                 suggestion: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.known = known
        self.suggestion = suggestion


class InvalidStructuralTag(CompileError, ValueError):
    """A structural tag that cannot be built as given: no tags or triggers, a tag's begin that starts
    with no trigger, triggers inside each other, a content of the wrong kind (the message says which)."""


class CompileTimeout(CompileError):
    """Compiling took longer than the allowed timeout."""


class MatcherError(CdslError):
    """An engine's matcher failed while decoding (an engine fault, not a verdict on the spec)."""


class InvalidToken(CdslError):
    """A token was advanced that the constraint does not allow in the current state."""

    def __init__(self, message: str, *, token_id: int | None = None, position: int | None = None) -> None:
        super().__init__(message)
        self.token_id = token_id
        self.position = position


class RollbackError(CdslError):
    """A rollback asked for more tokens than the state can undo."""


class TokenizerNotFound(CdslError):
    """A tokenizer name, path or id could not be resolved or fetched."""


class IncompatibleTokenizers(CdslError):
    """Two tokenizers (e.g. draft and target) do not map token ids to the same bytes."""


class OutputInvalid(CdslError):
    """A finished output that does not satisfy its constraint (an engine fault): never returned as valid."""


class InvalidArgument(CdslError, ValueError):
    """A bad argument, with ``param``: the name of the one at fault (``generate``'s, which the
    server's request fields share), so that a 400 can name it."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLong(CdslError, ValueError):
    """A prompt over the model's context (with ``max_tokens``) or the configured prompt limit."""


class ConflictingConstraints(CdslError, ValueError):
    """More than one hard constraint was given; ``given`` names them in the order passed."""

    def __init__(self, message: str, given: list[str]) -> None:
        super().__init__(message)
        self.given = given


class InvalidToolCall(CdslError, ValueError):
    """A call's arguments do not validate against the tool's parameters schema."""


class RequestCancelled(CdslError):
    """Raised by ``Row.wait`` for a request cancelled before it started decoding."""


class ModelNotFound(CdslError):
    """A model name, path or id could not be resolved or loaded."""


class DeviceUnavailable(CdslError):
    """The requested device does not exist on this machine (or this torch build)."""


class UnsupportedTokenizer(CdslError):
    """The tokenizer's token-to-bytes scheme is not one cdsl_struct understands."""


class RewardError(CdslError):
    """A reward returned something that is not a number in [0, 1]."""


class InputError(CdslError, ValueError):
    """A bulk job's input file is unreadable as its JSON lines: says which line and why."""
