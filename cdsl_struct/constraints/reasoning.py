"""Think first, then answer under the constraint.

A reasoning model writes its thinking between two markers (``<think>`` … ``</think>`` for Qwen 3
and DeepSeek-R1) and only then the answer. A constraint applied from the first token masks the
thinking away (vLLM#18255: the answer got worse). ``ReasoningState`` wraps a constraint's state:
the output may open the markers (or starts inside them when the prompt opened them), the
thinking is free text (no EOS, and no token that closes the marker and goes on past it) of at most
``budget`` tokens, after which the close marker is forced; then the wrapped constraint applies to
the answer. Markers are matched on bytes, so they work whether a vocabulary holds them as one
special token (Qwen 3) or spells them in pieces (SmolLM2). Being an ordinary ``ConstraintState``
(advance, validate, rollback), draft and target share it and speculative decoding stays lossless
across the close marker.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgument
from .mask import words_for
from .state import ConstraintState

if TYPE_CHECKING:
    from .compiler import CompiledConstraint
    from .vocabulary import TokenVocabulary

# (open, close) pairs as chat templates write them; the first found in a template is its pair
KNOWN_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),  # Qwen 3, DeepSeek-R1, QwQ, SmolLM3
    ("◁think▷", "◁/think▷"),  # Kimi
    ("[THINK]", "[/THINK]"),  # Magistral
    ("<|START_THINKING|>", "<|END_THINKING|>"),  # Command A reasoning
    ("<|begin_of_thought|>", "<|end_of_thought|>"),
)
DEFAULT_MARKERS = KNOWN_MARKERS[0]

# phases of a reasoning state
BEFORE, OPENING, THINKING, ANSWER = "before", "opening", "thinking", "answer"


@dataclass(frozen=True)
class Reasoning:
    """Let the output think between markers before the constraint applies (``reasoning=`` of
    ``generate``; ``True`` is ``Reasoning()``, an int is a budget).

    ``budget``: thinking tokens at most (the close marker is then forced; it is not counted);
    ``None`` uses half of ``max_tokens``, so the answer keeps room. ``open``/``close``: the
    markers; ``None`` reads them from the model's chat template (``<think>``/``</think>`` where it
    names none). ``required``: force the open marker where the prompt has not opened it (otherwise
    the model may skip thinking and answer at once).
    """

    budget: int | None = None
    open: str | None = None
    close: str | None = None
    required: bool = False

    def __post_init__(self) -> None:
        if self.budget is not None and (isinstance(self.budget, bool) or not isinstance(self.budget, int)
                                        or self.budget < 0):
            raise InvalidArgument(f"a reasoning budget is a count of tokens >= 0, got {self.budget!r}",
                                  param="reasoning")
        for marker in (self.open, self.close):
            if marker is not None and (not isinstance(marker, str) or not marker):
                raise InvalidArgument(f"reasoning markers are non-empty strings, got {marker!r}", param="reasoning")

    @classmethod
    def of(cls, value: Any) -> Reasoning | None:
        """``value`` as given to ``reasoning=``: None/False (off), True, a budget, a dict or a Reasoning."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, int):
            return cls(budget=value)
        if isinstance(value, dict):
            unknown = set(value) - {"budget", "open", "close", "required"}
            if unknown:
                raise InvalidArgument(f"unknown reasoning options {sorted(unknown)}; known: budget, open, close, "
                                      "required", param="reasoning")
            return cls(**value)
        raise InvalidArgument(f"reasoning= takes True, a token budget, a dict or a Reasoning, got "
                              f"{type(value).__name__}", param="reasoning")

    def markers(self, chat_template: str | None) -> tuple[str, str]:
        """The (open, close) markers: as given, else the chat template's, else ``<think>``'s."""
        found = template_markers(chat_template)
        return (self.open or found[0], self.close or found[1])


def template_markers(chat_template: str | None) -> tuple[str, str]:
    """The thinking markers a chat template writes (``<think>``/``</think>`` where it names none)."""
    for pair in KNOWN_MARKERS:
        if chat_template and pair[0] in chat_template and pair[1] in chat_template:
            return pair
    return DEFAULT_MARKERS


def start_phase(prompt_text: str, open_marker: str, close_marker: str) -> str:
    """Where an output starts, read from the end of its prompt: ``thinking`` when the prompt
    opened the markers without closing them (DeepSeek-R1's template), ``answer`` when it ends with
    a closed (empty) thinking block (Qwen 3 with ``enable_thinking=False``), else ``before``."""
    tail = prompt_text.rstrip()
    if tail.endswith(close_marker):
        return ANSWER
    opened, closed = prompt_text.rfind(open_marker), prompt_text.rfind(close_marker)
    return THINKING if opened >= 0 and opened > closed else BEFORE


def split_reasoning(text: str, open_marker: str, close_marker: str, phase: str = BEFORE) -> tuple[str | None, str]:
    """(thinking, answer) of an output that started in ``phase``; thinking is None where the
    output did not think, and the answer is empty while it is still thinking."""
    if phase == ANSWER:
        return None, text
    body = text
    if phase != THINKING:
        if not text.startswith(open_marker[:len(text)]) or not text:
            return None, text
        if not text.startswith(open_marker):
            return "", ""
        body = text[len(open_marker):]
    end = body.find(close_marker)
    if end < 0:
        return body, ""
    return body[:end], body[end + len(close_marker):]


@dataclass(frozen=True)
class ReasoningSpec:
    """A compiled constraint's spec when it answers after thinking: parses the answer only."""

    inner: Any
    open: str
    close: str
    phase: str
    kind: str = "reasoning"

    def split(self, text: str) -> tuple[str | None, str]:
        """(thinking, answer) of an output."""
        return split_reasoning(text, self.open, self.close, self.phase)

    def parse(self, text: str) -> Any:
        """The answer's value (``text`` is the answer, already split)."""
        from ..result import parse_value

        return parse_value(self.inner, text)


class _Masks:
    """Bitmask words a vocabulary needs for one pair of markers (built once, on first use)."""

    def __init__(self, vocabulary: TokenVocabulary, open_marker: bytes, close_marker: bytes) -> None:
        self.vocabulary, self.open, self.close = vocabulary, open_marker, close_marker
        self.words = words_for(vocabulary.size)
        self._lock = threading.Lock()
        self._thinking: dict[int, np.ndarray] = {}
        self._prefixes: dict[bytes, np.ndarray] = {}
        self._spelled: dict[bytes, int] = {}
        by_bytes: dict[bytes, list[int]] = {}
        for token, piece in enumerate(vocabulary.token_bytes):
            if piece:
                by_bytes.setdefault(piece, []).append(token)
        self._by_bytes = by_bytes
        marker_ids = {t for marker in (open_marker, close_marker) for t in self.prefix_tokens(marker)}
        refused = set(vocabulary.special_ids) - marker_ids | set(vocabulary.eos_token_ids)
        self._refused_always = sorted(t for t in refused if t < vocabulary.size)

    def _pack(self, allowed: np.ndarray) -> np.ndarray:
        bits = np.packbits(allowed, bitorder="little")
        padded = np.zeros(self.words * 4, dtype=np.uint8)
        padded[:bits.size] = bits
        return padded.view(np.int32)

    def prefix_tokens(self, remaining: bytes) -> list[int]:
        """Tokens that spell a non-empty prefix of ``remaining`` (how a marker may go on)."""
        return [t for k in range(1, len(remaining) + 1) for t in self._by_bytes.get(remaining[:k], ())]

    def spelled(self, remaining: bytes) -> int:
        """The first token of ``remaining`` as the tokenizer writes it (a forced marker's next token)."""
        with self._lock:
            if remaining not in self._spelled:
                ids = self.vocabulary.encode(remaining.decode("utf-8", errors="replace"))
                first = ids[0] if ids and remaining.startswith(self.vocabulary.token_bytes[ids[0]]) else None
                self._spelled[remaining] = first if first is not None else self.prefix_tokens(remaining)[-1]
            return self._spelled[remaining]

    def only(self, token: int) -> np.ndarray:
        """Mask words allowing ``token`` alone."""
        words = np.zeros(self.words, dtype=np.int32)
        words[token // 32] = np.int32(np.uint32(1 << (token % 32)).view(np.int32))
        return words

    def prefixes(self, remaining: bytes) -> np.ndarray:
        """Mask words allowing exactly ``prefix_tokens(remaining)``."""
        with self._lock:
            if remaining not in self._prefixes:
                allowed = np.zeros(self.vocabulary.size, dtype=bool)
                allowed[self.prefix_tokens(remaining)] = True
                self._prefixes[remaining] = self._pack(allowed)
            return self._prefixes[remaining]

    def thinking(self, matched: int) -> np.ndarray:
        """Mask words for a thinking step with ``matched`` bytes of the close marker at its end:
        every token but EOS, special tokens other than the markers', and those that would close
        the marker and write on past it."""
        with self._lock:
            if matched not in self._thinking:
                allowed = np.ones(self.vocabulary.size, dtype=bool)
                allowed[self._refused_always] = False
                last = self.close[-1:]
                for token, piece in enumerate(self.vocabulary.token_bytes):
                    if last in piece[:-1] and straddles(self.close[:matched] + piece, self.close):
                        allowed[token] = False
                self._thinking[matched] = self._pack(allowed)
            return self._thinking[matched]

    def allows_thinking(self, matched: int, token: int) -> bool:
        words = self.thinking(matched)
        return bool((int(words[token // 32]) >> (token % 32)) & 1)


def straddles(text: bytes, marker: bytes) -> bool:
    """Whether ``text`` holds ``marker`` and goes on past its first occurrence."""
    at = text.find(marker)
    return at >= 0 and at + len(marker) < len(text)


def matched_after(text: Any, marker: Any) -> int:
    """The longest proper prefix of ``marker`` that ``text`` ends with (its length; bytes or str)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


_masks_cache: dict[tuple[str, bytes, bytes], _Masks] = {}
_masks_lock = threading.Lock()


def _masks_for(vocabulary: TokenVocabulary, open_marker: bytes, close_marker: bytes) -> _Masks:
    key = (vocabulary.fingerprint, open_marker, close_marker)
    with _masks_lock:
        if key not in _masks_cache:
            if len(_masks_cache) >= 16:
                _masks_cache.pop(next(iter(_masks_cache)))
            _masks_cache[key] = _Masks(vocabulary, open_marker, close_marker)
        return _masks_cache[key]


@dataclass(frozen=True)
class _Phase:
    name: str
    matched: int = 0
    """OPENING: bytes of the open marker written; THINKING: of the close marker at the end."""
    thought: int = 0
    """THINKING: tokens thought so far."""


@dataclass
class ReasoningPlan:
    """What a reasoning row needs: markers, budget and the phase its prompt left it in."""

    open: str
    close: str
    budget: int | None
    phase: str
    masks: _Masks = field(repr=False)

    @classmethod
    def build(cls, vocabulary: TokenVocabulary, open_marker: str, close_marker: str, budget: int | None,
              phase: str) -> ReasoningPlan:
        masks = _masks_for(vocabulary, open_marker.encode(), close_marker.encode())
        if not masks.prefix_tokens(masks.close) or not masks.prefix_tokens(masks.open):
            raise InvalidArgument(f"this vocabulary cannot spell the reasoning markers {open_marker!r} / "
                                  f"{close_marker!r}", param="reasoning")
        return cls(open_marker, close_marker, budget, phase, masks)


class ReasoningState(ConstraintState):
    """A constraint's state behind a thinking segment (see the module docstring)."""

    def __init__(self, inner: ConstraintState, plan: ReasoningPlan) -> None:
        super().__init__(inner.vocabulary, inner.backend)
        self.inner, self.plan = inner, plan
        self.phase = _Phase(plan.phase)
        self._history: list[_Phase] = []  # the phase before each token advanced outside the answer
        self._answered = 0  # tokens the inner state consumed
        self._answer_entry = self.phase  # the phase the answer's first token was read in

    # --- the phase machine ----------------------------------------------------------------------

    def _at_budget(self, phase: _Phase) -> bool:
        return self.plan.budget is not None and phase.thought >= self.plan.budget

    def _allows(self, phase: _Phase, token: int) -> bool:
        masks = self.plan.masks
        if phase.name == OPENING:
            return token == masks.spelled(masks.open[phase.matched:])
        if phase.name == THINKING:
            if self._at_budget(phase):
                return token == masks.spelled(masks.close[phase.matched:])
            return masks.allows_thinking(phase.matched, token)
        return token in masks.prefix_tokens(masks.open)  # BEFORE: the open marker's start

    def _after(self, phase: _Phase, token: int) -> _Phase:
        masks, piece = self.plan.masks, self.vocabulary.token_bytes[token]
        if phase.name in (BEFORE, OPENING):
            written = phase.matched + len(piece)
            return _Phase(THINKING) if written >= len(masks.open) else _Phase(OPENING, written)
        text = masks.close[:phase.matched] + piece
        if masks.close in text:
            return _Phase(ANSWER)
        return _Phase(THINKING, matched_after(text, masks.close), phase.thought + 1)

    def _opens(self, phase: _Phase, token: int) -> bool:
        """In BEFORE: whether ``token`` starts the open marker (read as the marker, not the answer)."""
        return self._allows(phase, token)

    # --- backend hooks ------------------------------------------------------------------------

    def _engine_fill(self, pointer: int, nbytes: int) -> None:
        phase, masks = self.phase, self.plan.masks
        if phase.name == ANSWER:
            self.inner._engine_fill(pointer, nbytes)
            return
        row = np.ctypeslib.as_array((ctypes.c_int32 * (nbytes // 4)).from_address(pointer))
        if phase.name == OPENING:
            np.copyto(row, masks.only(masks.spelled(masks.open[phase.matched:])))
        elif phase.name == THINKING:
            words = masks.only(masks.spelled(masks.close[phase.matched:])) if self._at_budget(phase) \
                else masks.thinking(phase.matched)
            np.copyto(row, words)
        else:  # BEFORE: the answer's first tokens, or the open marker's
            self.inner._engine_fill(pointer, nbytes)
            np.bitwise_or(row, masks.prefixes(masks.open), out=row)

    def _engine_validate(self, tokens: list[int]) -> int:
        phase = self.phase
        for i, token in enumerate(tokens):
            if phase.name == ANSWER:
                return i + self.inner._engine_validate(tokens[i:])
            if phase.name == BEFORE and not self._opens(phase, token):
                return i + self.inner._engine_validate(tokens[i:])
            if not self._allows(phase, token):
                return i
            phase = self._after(phase, token)
        return len(tokens)

    def _engine_consume(self, tokens: list[int]) -> None:
        for i, token in enumerate(tokens):
            if self.phase.name == ANSWER or (self.phase.name == BEFORE and not self._opens(self.phase, token)):
                if not self._answered:
                    self._answer_entry = self.phase
                self.phase = _Phase(ANSWER)
                self.inner._engine_consume(tokens[i:])
                self._answered += len(tokens) - i
                return
            self._history.append(self.phase)
            self.phase = self._after(self.phase, token)

    def _engine_rollback(self, n: int) -> None:
        from_answer = min(n, self._answered)
        if from_answer:
            self.inner._engine_rollback(from_answer)
            self._answered -= from_answer
            if not self._answered:  # back where the answer began (BEFORE, or just after the close)
                self.phase = self._answer_entry
        for _ in range(n - from_answer):
            self.phase = self._history.pop()

    def _engine_forced(self, limit: int) -> list[int]:
        phase, masks = self.phase, self.plan.masks
        if phase.name == ANSWER:
            return self.inner._engine_forced(limit)
        forced: list[int] = []
        while len(forced) < limit and (phase.name == OPENING or (phase.name == THINKING and self._at_budget(phase))):
            marker = masks.open if phase.name == OPENING else masks.close
            forced.append(masks.spelled(marker[phase.matched:]))
            phase = self._after(phase, forced[-1])
        return forced

    def closing_tokens(self) -> list[int]:
        """While thinking: the rest of the close marker, spelled as the tokenizer writes it."""
        phase, masks, tokens = self.phase, self.plan.masks, []
        while phase.name == THINKING:
            tokens.append(masks.spelled(masks.close[phase.matched:]))
            phase = self._after(phase, tokens[-1])
        return tokens

    def _engine_accepting(self) -> bool:
        if self.phase.name in (OPENING, THINKING):
            return False
        return self.inner._engine_accepting()

    def _engine_copy(self) -> ReasoningState:
        twin = ReasoningState(self.inner.copy(), self.plan)
        twin.phase, twin._history, twin._answered = self.phase, list(self._history), self._answered
        twin._answer_entry = self._answer_entry
        return twin


def with_reasoning(compiled: CompiledConstraint, reasoning: Reasoning, chat_template: str | None,
                   prompt_text: str, max_tokens: int) -> CompiledConstraint:
    """``compiled`` behind a thinking segment, for one prompt (its end says where output starts)."""
    open_marker, close_marker = reasoning.markers(chat_template)
    phase = start_phase(prompt_text, open_marker, close_marker)
    if phase == BEFORE and reasoning.required:
        phase = OPENING
    budget = reasoning.budget if reasoning.budget is not None else max_tokens // 2
    plan = ReasoningPlan.build(compiled.vocabulary, open_marker, close_marker, budget, phase)
    spec = ReasoningSpec(compiled.spec, open_marker, close_marker, phase)
    return replace(compiled, spec=spec, program=_ReasoningProgram(compiled.program, plan))


class _ReasoningProgram:
    """An engine program whose states think first (duck-types ``EngineProgram``)."""

    def __init__(self, inner: Any, plan: ReasoningPlan) -> None:
        self.inner, self.plan = inner, plan
        self.nbytes = inner.nbytes

    def new_state(self) -> ConstraintState:
        return ReasoningState(self.inner.new_state(), self.plan)
