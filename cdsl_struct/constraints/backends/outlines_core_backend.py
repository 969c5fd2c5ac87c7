"""outlines-core engine: regexes and choices, and JSON Schema through its schema-to-regex.

The regex is compiled into a token-level automaton (``Index``) ahead of time, so masks are a
table lookup; compiling can be slow for large schemas. ``build_regex_from_schema`` ignores
keywords it does not know, which would silently loosen the constraint, so every schema is
first checked against the keywords it honours exactly (``outlines_core_schema``) and anything
else is an ``UnsupportedFeature``.

Building the ``Index`` has no limit of its own, so a compile with a timeout builds it in a
worker process that is killed when the timeout passes (``outlines_core_process``); without a
timeout it is built in the calling thread. Built indexes are kept on disk (``disk_cache``), so a
restarted process reads the index instead of building it again. The engine's ``ValueError`` / ``RuntimeError`` for a
regex or schema it cannot handle become typed ``CompileError`` subclasses here; anything else is
a bug and propagates as itself.
"""

from __future__ import annotations

import functools
import json
import pickle
import threading

import outlines_core

from ...errors import CompileError, GrammarSyntaxError, UnsupportedFeature
from ..disk_cache import program_cache
from ..specs import Choice, ConstraintSpec, Grammar, JsonSchema, Regex
from ..state import ConstraintState
from ..vocabulary import TokenVocabulary
from ..whitespace import WhitespacePolicy
from .base import Backend, EngineProgram
from .outlines_core_process import WORKERS, EngineRejected
from .outlines_core_schema import check_schema_supported

NAME = "outlines-core"


def _oc_vocabulary(vocabulary: TokenVocabulary) -> outlines_core.Vocabulary:
    by_bytes: dict[bytes, list[int]] = {}
    for token_id, token in enumerate(vocabulary.token_bytes):
        if token and token_id not in vocabulary.special_ids:
            by_bytes.setdefault(token, []).append(token_id)
    return outlines_core.Vocabulary(vocabulary.eos_token_id, by_bytes)


def _regex_for(spec: ConstraintSpec, whitespace: WhitespacePolicy) -> str:
    if isinstance(spec, JsonSchema):
        if whitespace.item_separator != "," or whitespace.key_separator != ":":
            raise UnsupportedFeature(
                f"outlines-core cannot express the {whitespace.name!r} whitespace policy "
                "(only compact, flexible or a whitespace pattern)",
                feature=f"whitespace={whitespace.name}", backend=NAME,
            )
        check_schema_supported(spec.schema)
        try:
            return outlines_core.json_schema.build_regex_from_schema(json.dumps(spec.schema), whitespace.pattern)
        except (ValueError, RuntimeError) as exc:
            raise CompileError(f"outlines-core: {exc}") from None
    if isinstance(spec, (Regex, Choice)):
        return spec.engine_pattern
    if isinstance(spec, Grammar):
        raise UnsupportedFeature(
            "outlines-core cannot compile Lark grammars; use backend='llguidance' or 'auto'",
            feature="lark grammar", backend=NAME,
        )
    raise CompileError(f"outlines-core cannot compile {type(spec).__name__}")


class OutlinesProgram(EngineProgram):
    """A token-level automaton (``outlines_core.Index``) shared by all states."""

    def __init__(self, index: outlines_core.Index, vocabulary: TokenVocabulary) -> None:
        self.index = index
        self.vocabulary = vocabulary
        self._forced: dict[int, list[int]] = {}
        self._lock = threading.Lock()

    def new_state(self) -> ConstraintState:
        return OutlinesState(self)

    @functools.cached_property
    def nbytes(self) -> int:  # type: ignore[override]
        """The index's pickled size: about what it holds (its transition table)."""
        return len(pickle.dumps(self.index))

    def forced_from(self, state: int) -> list[int]:
        """Tokens forced from automaton ``state`` (cached per state).

        Several tokenizations of the same text are usually allowed (``{``, ``{"``, ``{"id``), so
        forcing is found at the byte level: follow the shortest allowed token while every
        allowed token starts with it, then tokenize the forced bytes canonically and keep the
        tokens the automaton accepts, minus the last one (the text after it may merge into it).
        """
        with self._lock:
            if state not in self._forced:
                self._forced[state] = self._compute_forced(state)
            return self._forced[state]

    def _compute_forced(self, state: int) -> list[int]:
        token_bytes, eos = self.vocabulary.token_bytes, self.vocabulary.eos_token_id
        forced, current = b"", state
        for _ in range(256):
            allowed = self.index.get_allowed_tokens(current) or []
            if not allowed or eos in allowed:
                break
            pieces = [token_bytes[t] for t in allowed]
            shortest = min(range(len(pieces)), key=lambda i: len(pieces[i]))
            if not all(piece.startswith(pieces[shortest]) for piece in pieces):
                break
            forced += pieces[shortest]
            current = self.index.get_next_state(current, allowed[shortest])
        try:
            text = forced.decode("utf-8")
        except UnicodeDecodeError:
            return []
        tokens = self.vocabulary.encode(text)[:-1] if text else []
        accepted, current = 0, state
        for token in tokens:
            current = self.index.get_next_state(current, token)
            if current is None:
                break
            accepted += 1
        return tokens[:accepted]


def _index_error(message: str, spec: ConstraintSpec) -> CompileError:
    """The typed error for outlines-core refusing to build an ``Index``."""
    if isinstance(spec, Regex) and ("parse" in message.lower() or "syntax" in message.lower()):
        return GrammarSyntaxError(f"outlines-core: {message}")
    return CompileError(f"outlines-core: {message}")


class OutlinesCoreBackend(Backend):
    """Compiles regexes, choices and JSON Schemas into outlines-core ``Index`` automata."""

    name = NAME
    enforces_timeout = True
    """``compile`` takes ``timeout=`` and stops the engine itself (by killing its worker)."""

    def compile(
        self, spec: ConstraintSpec, vocabulary: TokenVocabulary, whitespace: WhitespacePolicy,
        timeout: float | None = None,
    ) -> OutlinesProgram:
        """Compile ``spec``; ``CompileTimeout`` after ``timeout`` seconds (``None``: no limit)."""
        # Anchoring works around an outlines-core 0.2.14 Index bug: without it, tokens that
        # continue past a state where the text is already a full match are dropped
        # (after "1", the "." of "1.5" would be unreachable for a number).
        regex = f"(?:{_regex_for(spec, whitespace)})\\z"
        stored = program_cache(NAME)
        key = stored.key(regex, vocabulary.fingerprint)
        index = stored.load(key)
        if index is not None:
            return OutlinesProgram(index, vocabulary)
        oc_vocabulary = vocabulary.engine_object(NAME, _oc_vocabulary)
        try:
            if timeout is None:
                index = outlines_core.Index(regex, oc_vocabulary)
            else:
                index = WORKERS.build_index(regex, vocabulary, oc_vocabulary, timeout)
        except (ValueError, RuntimeError, EngineRejected) as exc:
            raise _index_error(str(exc), spec) from None
        stored.store(key, index)
        return OutlinesProgram(index, vocabulary)


class OutlinesState(ConstraintState):
    """A ``ConstraintState`` over an outlines-core ``Guide``.

    The token history is kept so ``copy`` can rebuild an equivalent guide (copying a
    ``Guide`` directly loses its rollback depth).
    """

    def __init__(self, program: OutlinesProgram, history: list[int] | None = None) -> None:
        super().__init__(program.vocabulary, NAME)
        self._program = program
        self._guide = outlines_core.Guide(program.index, max_rollback=self.MAX_ROLLBACK)
        self._history: list[int] = []
        if history:
            self._engine_consume(history)

    def _engine_fill(self, pointer: int, nbytes: int) -> None:
        self._guide.write_mask_into(pointer, nbytes // 4, 4)

    def _walk(self, tokens: list[int]) -> tuple[int, int]:
        """(tokens accepted, automaton state after them) from the current state."""
        index, state = self._program.index, self._guide.get_state()
        for count, token in enumerate(tokens):
            following = index.get_next_state(state, token) if token != self._program.vocabulary.eos_token_id else None
            if following is None:
                return count, state
            state = following
        return len(tokens), state

    def _engine_validate(self, tokens: list[int]) -> int:
        return self._walk(tokens)[0]

    def _complete_after(self, body: list[int]) -> bool:
        accepted, state = self._walk(body)
        return accepted == len(body) and self._program.index.is_final_state(state)

    def _engine_consume(self, tokens: list[int]) -> None:
        for token in tokens:
            self._guide.advance(token, return_tokens=False)
        self._history.extend(tokens)

    def _engine_rollback(self, n: int) -> None:
        self._guide.rollback_state(n)
        del self._history[-n:]

    def _engine_forced(self, limit: int) -> list[int]:
        return self._program.forced_from(self._guide.get_state())[:limit]

    def _engine_accepting(self) -> bool:
        return self._program.index.is_final_state(self._guide.get_state())

    def _engine_copy(self) -> OutlinesState:
        return OutlinesState(self._program, self._history)


BACKEND = OutlinesCoreBackend()
