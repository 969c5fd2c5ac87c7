"""Free text without a grammar engine: ``Regex(FREE_TEXT)``, what every request without a constraint
decodes under, as a table walk.

``[\\s\\S]*`` allows any text that is valid UTF-8, EOS at any character boundary and no special
token. llguidance computes that mask afresh at every position; here it is one of eight precomputed
rows, one per state of the UTF-8 decoder (between characters, or inside one still expecting so many
bytes of such a range), and a token's next state is a table entry. The masks are the same as
llguidance's (``tests/constraints/backends/test_text_backend.py`` walks both); filling one is a
copy, so free rows cost the engine's step next to nothing (``fill_text_masks``: a step's rows in one op).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import UnsupportedFeature
from ..mask import Bitmask, clear_bitmask, words_for
from ..specs import ConstraintSpec, Regex
from ..state import ConstraintState
from ..vocabulary import TokenVocabulary
from ..whitespace import WhitespacePolicy
from .base import Backend, EngineProgram

FREE_TEXT = r"[\s\S]*"
"""The constraint of an unconstrained answer: any text (special tokens excluded), EOS between characters."""
#: the name a constraint compiled here reports as its backend
NAME = "text"
#: patterns compiled here (first) under ``backend="auto"``
_FREE_PATTERNS = frozenset({FREE_TEXT, r"[\S\s]*"})

BETWEEN, REJECT = 0, -1
# the UTF-8 decoder's states (Unicode's table 3-7 of well-formed byte sequences): between characters,
# inside one expecting 1, 2 or 3 more continuation bytes (0x80-0xBF), or expecting 2 (3) more of which
# the first is narrowed (after 0xE0, 0xED, 0xF0, 0xF4)
_STATES = 8
_NEED_1, _NEED_2, _NEED_3, _AFTER_E0, _AFTER_ED, _AFTER_F0, _AFTER_F4 = range(1, 8)


def is_free_text(spec: ConstraintSpec) -> bool:
    """Whether ``spec`` is free text that this module compiles (a ``Regex`` of ``[\\s\\S]*``)."""
    return isinstance(spec, Regex) and spec.pattern in _FREE_PATTERNS


def _byte_table() -> np.ndarray:
    """``[state, byte] -> next state`` of the UTF-8 decoder (REJECT: not well formed)."""
    table = np.full((_STATES, 256), REJECT, dtype=np.int8)
    table[BETWEEN, 0x00:0x80] = BETWEEN
    table[BETWEEN, 0xC2:0xE0] = _NEED_1
    table[BETWEEN, 0xE0] = _AFTER_E0
    table[BETWEEN, 0xE1:0xED] = _NEED_2
    table[BETWEEN, 0xED] = _AFTER_ED
    table[BETWEEN, 0xEE:0xF0] = _NEED_2
    table[BETWEEN, 0xF0] = _AFTER_F0
    table[BETWEEN, 0xF1:0xF4] = _NEED_3
    table[BETWEEN, 0xF4] = _AFTER_F4
    table[_NEED_1, 0x80:0xC0] = BETWEEN
    table[_NEED_2, 0x80:0xC0] = _NEED_1
    table[_NEED_3, 0x80:0xC0] = _NEED_2
    table[_AFTER_E0, 0xA0:0xC0] = _NEED_1
    table[_AFTER_ED, 0x80:0xA0] = _NEED_1
    table[_AFTER_F0, 0x90:0xC0] = _NEED_2
    table[_AFTER_F4, 0x80:0x90] = _NEED_2
    return table


class TextTables:
    """One vocabulary's tables: ``next_state[s][t]``, the decoder's state after token ``t`` from
    state ``s`` (REJECT where the bytes are not well formed, or ``t`` is special); ``masks[s]``, the
    bitmask row of the tokens allowed in state ``s`` (EOS only between characters)."""

    def __init__(self, vocabulary: TokenVocabulary) -> None:
        size = vocabulary.size
        longest = max((len(b) for b in vocabulary.token_bytes), default=0)
        padded = np.zeros((size, max(longest, 1)), dtype=np.int16)
        lengths = np.zeros(size, dtype=np.int64)
        for token, text in enumerate(vocabulary.token_bytes):
            padded[token, :len(text)] = np.frombuffer(text, dtype=np.uint8)
            lengths[token] = len(text)
        bytes_table = _byte_table()
        states = np.empty((_STATES, size), dtype=np.int8)
        for start in range(_STATES):  # every token walked from ``start`` at once, a byte column at a time
            at = np.full(size, start, dtype=np.int8)
            for column in range(padded.shape[1]):
                live = (column < lengths) & (at != REJECT)
                at[live] = bytes_table[at[live], padded[live, column]]
            states[start] = at
        refused = [t for t in vocabulary.special_ids if 0 <= t < size]
        states[:, refused] = REJECT
        states[:, lengths == 0] = REJECT
        self.next_state: list[list[int]] = states.tolist()
        words = words_for(size)
        allowed = np.zeros((_STATES, words * 32), dtype=np.uint8)
        allowed[:, :size] = states != REJECT
        eos = [t for t in vocabulary.eos_token_ids if 0 <= t < size]
        allowed[BETWEEN, eos] = 1
        self.masks_np = np.packbits(allowed, axis=-1, bitorder="little").view(np.int32).copy()

    @functools.cached_property
    def masks(self) -> Any:
        """``masks_np`` as a torch tensor (the same memory; torch is imported only when asked)."""
        import torch

        return torch.from_numpy(self.masks_np)


def text_tables(vocabulary: TokenVocabulary) -> TextTables:
    """``vocabulary``'s tables, built once (0.06 s for SmolLM2's 49,152 tokens, 0.28 s for Qwen3's 151,669)."""
    return vocabulary.engine_object(NAME, TextTables)


class TextProgram(EngineProgram):
    """Free text compiled for one vocabulary: its tables, shared by every state."""

    def __init__(self, vocabulary: TokenVocabulary) -> None:
        self.vocabulary = vocabulary
        self.tables = text_tables(vocabulary)
        self.nbytes = 1024  # the tables belong to the vocabulary, not to the compile cache

    def new_state(self) -> ConstraintState:
        return TextState(self, [BETWEEN])


class TextState(ConstraintState):
    """Where one sequence stands in free text: the decoder's state after each consumed token
    (``_path[-1]`` now; rolling back pops)."""

    def __init__(self, program: TextProgram, path: list[int]) -> None:
        super().__init__(program.vocabulary, NAME)
        self._program = program
        self._tables = program.tables
        self._path = path

    def fill_mask(self, bitmask_row: Bitmask) -> None:
        """The state's mask row copied in (all zero once finished)."""
        started = time.perf_counter()
        if self.finished:
            clear_bitmask(bitmask_row)
        elif isinstance(bitmask_row, np.ndarray):
            bitmask_row[:] = self._tables.masks_np[self._path[-1]]
        else:
            bitmask_row.copy_(self._tables.masks[self._path[-1]])
        self.mask_seconds += time.perf_counter() - started
        self.mask_calls += 1

    def states_before(self, drafted: int) -> list[int]:
        """The decoder's state before each of the last ``drafted`` advanced tokens, and after them
        unless the last was EOS (a finished state allows nothing)."""
        if self.finished:  # EOS is not on the path
            return self._path[len(self._path) - drafted:] if drafted else []
        return self._path[len(self._path) - drafted - 1:]

    def _engine_fill(self, pointer: int, nbytes: int) -> None:
        import ctypes

        ctypes.memmove(pointer, self._tables.masks_np[self._path[-1]].ctypes.data, nbytes)

    def _engine_validate(self, tokens: list[int]) -> int:
        table, at, size = self._tables.next_state, self._path[-1], self.vocabulary.size
        for count, token in enumerate(tokens):
            at = table[at][token] if 0 <= token < size else REJECT
            if at == REJECT:
                return count
        return len(tokens)

    def _engine_consume(self, tokens: list[int]) -> None:
        table, path = self._tables.next_state, self._path
        for token in tokens:
            path.append(table[path[-1]][token])

    def _engine_rollback(self, n: int) -> None:
        del self._path[len(self._path) - n:]

    def _engine_forced(self, limit: int) -> list[int]:
        return []  # a state allows many tokens; where one alone fits, the model's pass picks it

    def _engine_accepting(self) -> bool:
        return self._path[-1] == BETWEEN

    def _engine_copy(self) -> ConstraintState:
        return TextState(self._program, list(self._path))


def fill_text_masks(jobs: Sequence[tuple[TextState, int, int]], bitmask: Any) -> None:
    """For each ``(state, drafted, first)``: the masks of a state advanced past ``drafted`` tokens of
    this step (before each and after the last) into rows ``first, first + 1, ...`` of ``bitmask``
    (zeroed; a position after EOS stays zero, as a finished state's), in one copy per vocabulary."""
    by_tables: dict[int, tuple[TextTables, list[int], list[int]]] = {}
    for state, drafted, first in jobs:
        path = state.states_before(drafted)
        _, rows, states = by_tables.setdefault(id(state._tables), (state._tables, [], []))
        rows.extend(range(first, first + len(path)))
        states.extend(path)
        state.mask_calls += len(path)
    import torch

    for tables, rows, states in by_tables.values():
        if rows:
            bitmask.index_copy_(0, torch.tensor(rows), tables.masks[torch.tensor(states)])


class TextBackend(Backend):
    """Compiles free text only (``is_free_text``); any other spec is refused."""

    name = NAME
    enforces_timeout = True  # a table build of a fraction of a second, nothing to stop

    def compile(self, spec: ConstraintSpec, vocabulary: TokenVocabulary, whitespace: WhitespacePolicy,
                timeout: float | None = None) -> EngineProgram:
        if not is_free_text(spec):
            raise UnsupportedFeature(f"the {NAME!r} backend compiles only free text ({FREE_TEXT!r})",
                                     feature="a pattern other than free text")
        return TextProgram(vocabulary)


BACKEND = TextBackend()
