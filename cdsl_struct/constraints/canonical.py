"""Canonical token boundaries: keep constrained outputs spelled the way the tokenizer spells text.

A mask allows every token whose bytes keep the output valid, so a model may write ``"New"`` as
``"`` ``N`` ``ew`` although the tokenizer would never produce that split; such spellings are rare
in training and pull a small model off its own distribution. ``CanonicalFilter`` narrows a mask
so that the pair (previous token ``p``, next token ``t``) re-tokenises as ``[p, t]``: every
bigram of the output is then canonical (a necessary condition for the whole output being
canonical; the bench measures how close that gets).

Cheap per step, for byte-level BPE: a pair can only be non-canonical if a merge crosses the
boundary between ``p`` and ``t``. Before the first crossing merge each side merges exactly as it
would alone, so that merge joins a node ``x`` on the right spine of ``p``'s merge tree with a
node ``y`` on the left spine of ``t``'s, at a rank below the ranks that join ``x`` and ``y`` to
their own neighbours. That rank test (precomputed spines, an index of left-spine nodes) gives a
short list of candidates per ``p``; each candidate is checked exactly by re-tokenising the two
tokens' text. The pre-tokenizer can also move a boundary without any crossing merge, so a ``p``
ending in whitespace is checked against every token (``\\s+(?!\\S)`` splits a run by what
follows) and a ``p`` ending in punctuation against every token that starts with punctuation (a
punctuation run swallows the ``'`` of ``'s``). Results are cached per ``p``.

The filter only removes tokens, and ``narrow`` leaves a mask alone when it would remove every
allowed token, so the hard constraint is never loosened and never made unsatisfiable.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .backends.base import EngineProgram
from .mask import Bitmask, words_for
from .vocabulary import TokenVocabulary, UnsupportedTokenizer

if TYPE_CHECKING:
    from .compiler import CompiledConstraint
    from .state import ConstraintState

_INF = np.iinfo(np.int64).max
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")
_PUNCTUATION = frozenset(b for b in range(0x21, 0x7F) if not chr(b).isalnum())


class CanonicalFilter:
    """Per previous token, the next tokens whose pair does not re-tokenise as itself.

    Build with ``CanonicalFilter.for_tokenizer(tokenizer, vocabulary)`` (cached per vocabulary).
    ``narrow(row, previous)`` clears those tokens from a mask row (keeping the row unchanged when
    nothing would be left) and says what it did. Thread-safe.
    """

    def __init__(self, tokenizer: Any, vocabulary: TokenVocabulary) -> None:
        if vocabulary.scheme != "byte-level":
            raise UnsupportedTokenizer("canonical token boundaries need a byte-level BPE tokenizer")
        start = time.perf_counter()
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        model = json.loads(backend.to_str()).get("model", {})
        if model.get("type") != "BPE":
            raise UnsupportedTokenizer(f"canonical token boundaries need a BPE model, got {model.get('type')!r}")
        self.vocabulary = vocabulary
        self._backend = backend
        pieces: dict[str, int] = model["vocab"]
        size = vocabulary.size
        self._left = np.full(size, -1, dtype=np.int64)
        self._right = np.full(size, -1, dtype=np.int64)
        self._rank = np.full(size, _INF, dtype=np.int64)  # rank of the merge that forms the token
        by_left: dict[int, list[tuple[int, int]]] = {}
        for rank, merge in enumerate(model.get("merges", [])):
            a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
            left, right, whole = pieces.get(a), pieces.get(b), pieces.get(a + b)
            if left is None or right is None or whole is None:
                continue
            by_left.setdefault(left, []).append((right, rank))
            if self._rank[whole] == _INF:
                self._left[whole], self._right[whole], self._rank[whole] = left, right, rank
        self._merges_by_left = {x: (np.array([y for y, _ in pairs], dtype=np.int64),
                                    np.array([r for _, r in pairs], dtype=np.int64)) for x, pairs in by_left.items()}
        self._build_left_spine_index(size)
        self._punctuation_first = np.array(
            [t for t, text in enumerate(vocabulary.token_bytes) if text and text[0] in _PUNCTUATION], dtype=np.int64)
        self._words = words_for(size)
        self._keep: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.build_seconds = time.perf_counter() - start
        self.check_seconds = 0.0

    _instances: dict[str, CanonicalFilter] = {}
    _instances_lock = threading.Lock()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocabulary: TokenVocabulary | None = None) -> CanonicalFilter:
        """The filter of ``tokenizer`` (built once per vocabulary; raises ``UnsupportedTokenizer``
        for tokenizers other than byte-level BPE)."""
        vocabulary = vocabulary or TokenVocabulary.from_tokenizer(tokenizer)
        with cls._instances_lock:
            found = cls._instances.get(vocabulary.fingerprint)
            if found is None:
                found = cls._instances[vocabulary.fingerprint] = cls(tokenizer, vocabulary)
            return found

    # --- building -----------------------------------------------------------------------------

    def _build_left_spine_index(self, size: int) -> None:
        """(y, t, bound) for every node y on the left spine of every token t, sorted by y; bound
        is the rank at which y joins its right neighbour inside t (infinite for t itself)."""
        ys, ts, bounds = [], [], []
        special = self.vocabulary.special_ids
        for t in range(size):
            if t in special:
                continue
            node, bound = t, _INF
            while node >= 0:
                ys.append(node)
                ts.append(t)
                bounds.append(bound)
                node, bound = int(self._left[node]), int(self._rank[node])
        order = np.argsort(np.array(ys, dtype=np.int64), kind="stable")
        self._spine_y = np.array(ys, dtype=np.int64)[order]
        self._spine_t = np.array(ts, dtype=np.int64)[order]
        self._spine_bound = np.array(bounds, dtype=np.int64)[order]

    def _right_spine(self, p: int) -> list[tuple[int, int]]:
        spine, node, bound = [], p, _INF
        while node >= 0:
            spine.append((node, bound))
            node, bound = int(self._right[node]), int(self._rank[node])
        return spine

    def candidates(self, p: int) -> np.ndarray:
        """Tokens t for which a merge could cross the boundary of (p, t), or the pre-tokenizer
        could split the pair differently: a superset of the non-canonical pairs after ``p``."""
        text = self.vocabulary.token_bytes[p]
        if text and text[-1] in _WHITESPACE:
            return np.arange(self.vocabulary.size, dtype=np.int64)
        found = [self._punctuation_first] if text and text[-1] in _PUNCTUATION else []
        for x, x_bound in self._right_spine(p):
            merges = self._merges_by_left.get(x)
            if merges is None:
                continue
            ys, ranks = merges
            usable = ranks < x_bound
            for y, rank in zip(ys[usable].tolist(), ranks[usable].tolist(), strict=True):
                lo, hi = np.searchsorted(self._spine_y, [y, y + 1])
                ts = self._spine_t[lo:hi]
                found.append(ts[self._spine_bound[lo:hi] > rank])
        return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)

    def is_canonical_pair(self, p: int, t: int) -> bool:
        """Whether the text of ``p`` followed by ``t`` re-tokenises as exactly ``[p, t]``
        (pairs whose bytes are not valid UTF-8 count as canonical: they cannot be re-tokenised)."""
        token_bytes = self.vocabulary.token_bytes
        try:
            text = (token_bytes[p] + token_bytes[t]).decode("utf-8")
        except UnicodeDecodeError:
            return True
        return self._backend.encode(text, add_special_tokens=False).ids == [p, t]

    def non_canonical_after(self, p: int) -> np.ndarray:
        """The tokens t (ascending) for which (p, t) is not canonical."""
        special = self.vocabulary.special_ids
        return np.array([t for t in self.candidates(p).tolist()
                         if t not in special and not self.is_canonical_pair(p, t)], dtype=np.int64)

    def keep_words(self, p: int) -> np.ndarray | None:
        """Mask words that keep every token except the non-canonical ones after ``p`` (None: keep all)."""
        with self._lock:
            if p in self._keep:
                return self._keep[p]
        start = time.perf_counter()
        bad = self.non_canonical_after(p)
        keep = None
        if bad.size:
            bits = np.zeros(self._words * 32, dtype=np.uint8)
            bits[bad] = 1
            cleared = np.packbits(bits, bitorder="little").view(np.int32)
            keep = ~cleared
        with self._lock:
            self._keep[p] = keep
            self.check_seconds += time.perf_counter() - start
        return keep

    # --- use ----------------------------------------------------------------------------------

    def narrow(self, row: Bitmask, previous: int) -> str:
        """Clear the tokens that would follow ``previous`` non-canonically from ``row``.

        Returns ``"kept"`` (nothing to clear), ``"narrowed"`` or ``"fallback"`` (clearing would
        have left no allowed token, so the row is left as the constraint wrote it).
        """
        keep = self.keep_words(previous)
        if keep is None:
            return "kept"
        if isinstance(row, np.ndarray):
            narrowed = row & keep
            if not narrowed.any():
                return "fallback"
            row[:] = narrowed
            return "narrowed"
        import torch

        narrowed = row & torch.from_numpy(keep)
        if not bool(narrowed.any()):
            return "fallback"
        row.copy_(narrowed)
        return "narrowed"


def non_canonical_pairs(tokens: list[int], canonical: CanonicalFilter) -> int:
    """How many adjacent pairs of ``tokens`` do not re-tokenise as themselves."""
    return sum(not canonical.is_canonical_pair(p, t) for p, t in zip(tokens, tokens[1:], strict=False))


class _CanonicalProgram(EngineProgram):
    """An engine program whose states narrow their masks with a ``CanonicalFilter``."""

    def __init__(self, inner: EngineProgram, canonical: CanonicalFilter) -> None:
        self.inner = inner
        self.canonical = canonical

    def new_state(self, compiled: CompiledConstraint) -> ConstraintState:
        state = self.inner.new_state(compiled)
        state.canonical = self.canonical
        return state


def with_canonical_tokens(compiled: CompiledConstraint, tokenizer: Any) -> CompiledConstraint:
    """``compiled`` whose states keep token boundaries canonical (same constraint, narrower masks).

    ``tokenizer``: the HF tokenizer ``compiled`` was built for (its merges are read once).
    Raises ``UnsupportedTokenizer`` for tokenizers other than byte-level BPE.
    """
    if isinstance(compiled.program, _CanonicalProgram):
        return compiled
    canonical = CanonicalFilter.for_tokenizer(tokenizer, compiled.vocabulary)
    return replace(compiled, program=_CanonicalProgram(compiled.program, canonical), skipped=list(compiled.skipped))
