"""llguidance engine: JSON Schema, regex, choices and Lark grammars (Earley parser + lazy lexer).

Compiling builds one prototype ``LLMatcher``; each state is a ``deep_copy`` of it, so a state
costs microseconds. Unknown schema keywords are errors (``lenient`` is forced off) and
whitespace options are forced by our policy, so no schema can loosen either.

llguidance bounds its own work (``LLParserLimits`` defaults: 1M lexer fuel, about 20 ms, for the
regexes, 500k grammar symbols, 250k lexer states), so a compile takes milliseconds, at worst
about a second; the compiler runs it in a thread and a timed-out one ends by itself within those
limits. Its ``ValueError`` for a schema it cannot convert and its matcher errors become typed
``CompileError`` subclasses here.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import llguidance

from ...errors import CompileError, GrammarSyntaxError, MatcherError, UnsatisfiableSchema, UnsupportedFeature
from ..mask import set_bit
from ..specs import Choice, ConstraintSpec, Grammar, JsonSchema, Regex
from ..state import ConstraintState
from ..vocabulary import TokenVocabulary
from ..whitespace import WhitespacePolicy
from .base import Backend, EngineProgram

NAME = "llguidance"


class _Tokenizer:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer, served from our vocabulary."""

    def __init__(self, vocabulary: TokenVocabulary) -> None:
        self.eos_token_id = vocabulary.eos_token_id
        self.bos_token_id = None
        self.tokens = vocabulary.token_bytes
        self.special_token_ids = sorted(vocabulary.special_ids)
        self._encode = vocabulary.encode

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._encode(text)


def _ll_tokenizer(vocabulary: TokenVocabulary) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_Tokenizer(vocabulary)),
        n_vocab=vocabulary.size,
        eos_token=list(vocabulary.eos_token_ids),
    )


def _json_options(whitespace: WhitespacePolicy) -> dict[str, Any]:
    options: dict[str, Any] = {
        "lenient": False,
        "item_separator": whitespace.item_separator,
        "key_separator": whitespace.key_separator,
        "whitespace_flexible": bool(whitespace.pattern),
    }
    if whitespace.pattern:
        options["whitespace_pattern"] = whitespace.pattern
    return options


def _grammar_for(spec: ConstraintSpec, whitespace: WhitespacePolicy, vocabulary: TokenVocabulary | None = None) -> str:
    if isinstance(spec, JsonSchema):
        return llguidance.LLMatcher.grammar_from_json_schema(spec.schema, overrides=_json_options(whitespace))
    if isinstance(spec, (Regex, Choice)):
        return llguidance.LLMatcher.grammar_from_regex(spec.engine_pattern)
    if isinstance(spec, Grammar):
        engine_grammar = getattr(spec, "engine_grammar", None)  # a grammar that embeds others (structural tags)
        if callable(engine_grammar):
            return engine_grammar(whitespace, vocabulary)
        return llguidance.LLMatcher.grammar_from_lark(spec.text)
    raise CompileError(f"llguidance cannot compile {type(spec).__name__}")


_UNIMPLEMENTED = re.compile(r"^Unimplemented keys?: *(\[.*\])$")
_FEATURE_PATTERNS = [
    re.compile(r"Unknown format:? *([^\n]+)"),
    re.compile(r"(\S+) (?:is|are) not supported"),
]


def engine_error(message: str, spec: ConstraintSpec) -> CompileError:
    """Turn an llguidance error message into the matching typed error.

    llguidance 1.9 reports schema errors as text only (``validate_grammar_with_warnings`` returns
    strings; ``stop_reason()`` says ``InternalError`` for a dead end), so the message is read,
    pinned to the tested engine version: the list of unimplemented keys it prints is JSON.
    """
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    text = f"llguidance: {first}"
    if "nsatisfiable" in message:
        return UnsatisfiableSchema(text)
    keys = _UNIMPLEMENTED.match(first)
    if keys:
        try:
            names = json.loads(keys.group(1))
        except ValueError:
            names = None
        if isinstance(names, list) and names:
            return UnsupportedFeature(text, feature=", ".join(map(str, names)), backend=NAME)
    for pattern in _FEATURE_PATTERNS:
        found = pattern.search(message)
        if found:
            return UnsupportedFeature(text, feature=found.group(1).strip(), backend=NAME)
    if isinstance(spec, (Regex, Grammar)) and ("parse" in message.lower() or "regex" in message.lower()):
        return GrammarSyntaxError(text)
    return CompileError(text)


class LLGuidanceProgram(EngineProgram):
    """A validated llguidance grammar with a prototype matcher to copy states from."""

    def __init__(self, prototype: llguidance.LLMatcher, vocabulary: TokenVocabulary, grammar_chars: int = 0) -> None:
        self._prototype = prototype
        self.vocabulary = vocabulary
        self._lock = threading.Lock()
        # llguidance does not report its size: its lexer and parser tables grow with the grammar
        # (bounded by its own limits); a rough per-character figure keeps the cache honest.
        self.nbytes = 64 * 1024 + 64 * grammar_chars

    def new_state(self) -> ConstraintState:
        return LLGuidanceState(self.new_matcher(), self)

    def replay(self, history: list[int]) -> llguidance.LLMatcher:
        """A fresh matcher advanced through ``history``."""
        matcher = self.new_matcher()
        if history:
            matcher.consume_tokens(history)
        return matcher

    def new_matcher(self) -> llguidance.LLMatcher:
        with self._lock:
            return self._prototype.deep_copy()


class LLGuidanceBackend(Backend):
    """Compiles every spec kind into a prototype ``LLMatcher``."""

    name = NAME
    enforces_timeout = False  # bounded by llguidance's own limits; see the module docstring

    def compile(
        self, spec: ConstraintSpec, vocabulary: TokenVocabulary, whitespace: WhitespacePolicy,
        timeout: float | None = None,
    ) -> LLGuidanceProgram:
        tokenizer = vocabulary.engine_object(NAME, _ll_tokenizer)
        try:
            grammar = _grammar_for(spec, whitespace, vocabulary)
        except ValueError as exc:
            raise engine_error(str(exc), spec) from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise engine_error(matcher.get_error(), spec)
        return LLGuidanceProgram(matcher, vocabulary, len(grammar))


class LLGuidanceState(ConstraintState):
    """A ``ConstraintState`` backed by one ``llguidance.LLMatcher``.

    The token history is kept so that a matcher that reached a dead end (llguidance's
    ``NoExtensionBias``: no token can continue) can be rebuilt; the mask there is empty.
    """

    def __init__(self, matcher: llguidance.LLMatcher, program: LLGuidanceProgram,
                 history: list[int] | None = None) -> None:
        super().__init__(program.vocabulary, NAME)
        self._matcher = matcher
        self._program = program
        self._history: list[int] = list(history or [])

    def _check(self) -> None:
        if self._matcher.is_error():
            raise MatcherError(f"llguidance matcher failed: {self._matcher.get_error().splitlines()[0]}")

    def _engine_fill(self, pointer: int, nbytes: int) -> None:
        self._matcher.unsafe_compute_mask_ptr(pointer, nbytes)
        if self._matcher.is_error() and self._matcher.get_error().split("\n", 1)[0] == "NoExtensionBias":
            ctypes.memset(pointer, 0, nbytes)
            self._matcher = self._program.replay(self._history)
            return
        self._check()

    def _engine_validate(self, tokens: list[int]) -> int:
        return self._matcher.validate_tokens(tokens)

    def _engine_consume(self, tokens: list[int]) -> None:
        if not self._matcher.consume_tokens(tokens):
            self._check()
        self._history.extend(tokens)

    def _engine_rollback(self, n: int) -> None:
        self._matcher.rollback(n)
        self._check()
        del self._history[-n:]

    def _engine_forced(self, limit: int) -> list[int]:
        eos = set(self.vocabulary.eos_token_ids)
        forced = []
        for token in self._matcher.compute_ff_tokens()[:limit]:
            if token in eos:
                break
            forced.append(token)
        return forced

    def _engine_accepting(self) -> bool:
        return self._matcher.is_accepting()

    def _complete_after(self, body: list[int]) -> bool:
        if not body:  # validate_tokens([eos]) answers 0 even where EOS is allowed
            return self._matcher.is_accepting()
        with_eos = [*body, self.vocabulary.eos_token_id]
        return self._matcher.validate_tokens(with_eos) == len(with_eos)

    def _engine_copy(self) -> LLGuidanceState:
        return LLGuidanceState(self._matcher.deep_copy(), self._program, self._history)


BACKEND = LLGuidanceBackend()

_executor: llguidance.LLExecutor | None = None
_executor_lock = threading.Lock()


def parallel_fill_supported(state: ConstraintState) -> bool:
    """Whether ``fill_drafted_masks`` can take ``state``: an llguidance state."""
    return isinstance(state, LLGuidanceState)


def fill_drafted_masks(jobs: Sequence[tuple[LLGuidanceState, list[int], int]], bitmask: Any) -> list[bool]:
    """Every job's masks in one call that llguidance spreads over its threads (no GIL held): for
    ``(state, drafted, first)``, a state advanced past the ``drafted`` tokens of this step, the mask
    before each drafted token and after the last, into rows ``first, first + 1, ...`` of ``bitmask``
    (a zeroed 2-D int32 CPU tensor; a position after EOS stays all zero, as ``fill_mask`` leaves a
    finished state's). Each state ends where it started. Per job, whether it is done; False (the
    matcher hit an error, e.g. llguidance's dead end) leaves the job to ``fill_mask``."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = llguidance.LLExecutor()
    started = time.perf_counter()
    plain, drafting, rolled = [], [], []
    failed = False
    try:
        for state, drafted, first in jobs:
            state.rollback(len(drafted))
            rolled.append((state, drafted))
            eos = state.vocabulary.eos_token_ids
            body = drafted[:next((i for i, token in enumerate(drafted) if token in eos), len(drafted))]
            if body:
                drafting.append((state._matcher, first, body))
            else:  # the draft call refuses an empty draft
                plain.append((state._matcher, first))
        target = (bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0])
        if plain:
            _executor.unsafe_compute_mask_ptr(plain, *target)
        if drafting:
            _executor.unsafe_compute_mask_ptr_with_draft_token(drafting, *target)
    except Exception:  # noqa: BLE001 - every job then goes the usual way
        failed = True
    share = (time.perf_counter() - started) / max(len(jobs), 1)
    done = []
    for (state, drafted), (_, _, first) in zip(rolled, jobs, strict=False):
        ok = not failed and not state._matcher.is_error()
        if state._matcher.is_error():
            state._matcher = state._program.replay(state._history)
        others = state.vocabulary.eos_token_ids[1:]
        if ok and others:  # llguidance sets the first EOS's bit; the others where the output is complete
            for i in range(len(drafted) + 1):
                if not state.finished and state.is_complete():
                    for eos in others:
                        set_bit(bitmask[first + i], eos)
                if i < len(drafted):
                    state._consume([drafted[i]])
        elif drafted:
            state._consume(drafted)  # accepted when they were proposed: the state is where it was
        state.mask_seconds += share
        state.mask_calls += len(drafted) + 1
        done.append(ok)
    return done + [False] * (len(jobs) - len(rolled))
