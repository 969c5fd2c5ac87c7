"""``ConstraintState``: where one sequence stands in a compiled constraint.

A state is cheap and per sequence. Draft and target share one: the draft advances it while it
proposes, and the verifier rolls it back to the accepted prefix. Every backend implements the
few ``_engine_*`` hooks; the rules common to all of them (EOS handling, atomic advance, rollback
accounting, timing of mask computation) live here once.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import InvalidToken, RollbackError
from .mask import Bitmask, clear_bitmask, row_pointer, set_bit

if TYPE_CHECKING:
    from .vocabulary import TokenVocabulary


class ConstraintState(ABC):
    """Per-sequence matcher over a compiled constraint's engine program, for one ``vocabulary``
    (``backend`` names the engine).

    ``fill_mask`` writes the allowed next tokens into a bitmask row (int32 words, bit ``i % 32``
    of word ``i // 32`` is token ``i``); EOS is allowed only when the output is complete.
    ``advance`` consumes tokens (atomically: on a disallowed token nothing changes and
    ``InvalidToken`` is raised); ``validate`` counts how many leading tokens would be accepted
    without changing anything; ``rollback(n)`` undoes the last ``n`` advanced tokens.
    """

    #: how many advanced tokens can always be rolled back
    MAX_ROLLBACK = 1024

    def __init__(self, vocabulary: TokenVocabulary, backend: str) -> None:
        self.vocabulary = vocabulary
        self.backend = backend
        self.num_tokens = 0
        self.finished = False
        self.mask_seconds = 0.0
        self.mask_calls = 0

    # --- public API ---------------------------------------------------------------------------

    def fill_mask(self, bitmask_row: Bitmask) -> None:
        """Write the allowed next tokens into ``bitmask_row`` (a 1-D int32 tensor or array)."""
        start = time.perf_counter()
        pointer, nbytes = row_pointer(bitmask_row, self.vocabulary.size)
        if self.finished:
            clear_bitmask(bitmask_row)
        else:
            self._engine_fill(pointer, nbytes)
            eos_ids = self.vocabulary.eos_token_ids
            if len(eos_ids) > 1 and self.is_complete():
                for eos in eos_ids[1:]:
                    set_bit(bitmask_row, eos)
        self.mask_seconds += time.perf_counter() - start
        self.mask_calls += 1

    def advance(self, token_ids: int | Sequence[int]) -> None:
        """Consume tokens; raise ``InvalidToken`` (state unchanged) if any is not allowed."""
        tokens = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if not tokens:
            return
        accepted = self.validate(tokens)
        if accepted < len(tokens):
            bad = tokens[accepted]
            shown = self.vocabulary.token_bytes[bad] if 0 <= bad < self.vocabulary.size else b"?"
            raise InvalidToken(
                f"token {bad} ({shown!r}) is not allowed after {self.num_tokens + accepted} tokens",
                token_id=bad, position=accepted,
            )
        self._consume(tokens)

    def validate(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of ``token_ids`` are acceptable from here. Never mutates."""
        tokens = list(token_ids)
        if self.finished or not tokens:
            return 0
        eos_ids = self.vocabulary.eos_token_ids
        eos_at = next((i for i, t in enumerate(tokens) if t in eos_ids), len(tokens))
        body = tokens[:eos_at]
        count = self._engine_validate(body) if body else 0
        if count == len(body) and eos_at < len(tokens) and self._complete_after(body):
            count += 1
        return count

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` advanced tokens (``n <= min(num_tokens, MAX_ROLLBACK)``)."""
        if n < 0 or n > self.num_tokens or n > self.MAX_ROLLBACK:
            raise RollbackError(
                f"cannot roll back {n} tokens: {self.num_tokens} advanced, at most {self.MAX_ROLLBACK} kept"
            )
        if n == 0:
            return
        engine_tokens = n - 1 if self.finished else n  # EOS is tracked here, never by the engine
        if engine_tokens:
            self._engine_rollback(engine_tokens)
        self.num_tokens -= n
        self.finished = False

    def forced_tokens(self, limit: int = 64) -> list[int]:
        """Tokens the constraint forces next (exactly one choice each), without advancing.

        Only tokens the state accepts: llguidance forces text as it would tokenize it, and where
        the vocabulary cannot spell a forced byte (SmolLM2 has no token for 0x04) it skips it,
        so its list is cut at the first token ``advance`` would refuse."""
        if self.finished:
            return []
        forced = self._engine_forced(limit)
        return forced[:self.validate(forced)] if forced else forced

    def closing_tokens(self) -> list[int]:
        """Tokens that close what the output has open where the state knows them without a
        search (a reasoning row's close marker while it thinks), without advancing; [] where it
        does not. The budget closer writes them first (``decoding.budget``)."""
        return []

    def is_complete(self) -> bool:
        """True when the output so far is a complete match (EOS would be accepted)."""
        return self.finished or self._engine_accepting()

    def copy(self) -> ConstraintState:
        """An independent state at the same position (history included)."""
        twin = self._engine_copy()
        twin.num_tokens, twin.finished = self.num_tokens, self.finished
        return twin

    # --- helpers ------------------------------------------------------------------------------

    def _consume(self, tokens: list[int]) -> None:
        eos_ids = self.vocabulary.eos_token_ids
        if tokens[-1] in eos_ids:
            body = tokens[:-1]
            if body:
                self._engine_consume(body)
            self.finished = True
        else:
            self._engine_consume(tokens)
        self.num_tokens += len(tokens)

    def _complete_after(self, body: list[int]) -> bool:
        if not body:
            return self._engine_accepting()
        self._engine_consume(body)
        try:
            return self._engine_accepting()
        finally:
            self._engine_rollback(len(body))

    # --- backend hooks ------------------------------------------------------------------------

    @abstractmethod
    def _engine_fill(self, pointer: int, nbytes: int) -> None: ...

    @abstractmethod
    def _engine_validate(self, tokens: list[int]) -> int:
        """Leading tokens (no EOS among them) acceptable from here."""

    @abstractmethod
    def _engine_consume(self, tokens: list[int]) -> None:
        """Consume already-validated non-EOS tokens."""

    @abstractmethod
    def _engine_rollback(self, n: int) -> None: ...

    @abstractmethod
    def _engine_forced(self, limit: int) -> list[int]: ...

    @abstractmethod
    def _engine_accepting(self) -> bool: ...

    @abstractmethod
    def _engine_copy(self) -> ConstraintState: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.backend} tokens={self.num_tokens} complete={self.is_complete()}>"
