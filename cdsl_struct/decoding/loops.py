"""The loop guard: a row that starts repeating itself is not allowed to go round again.

Small models under a constraint sometimes fall into a cycle they never leave
(``"NuTek-NuTek-NuTek-..."``, ``"cheese", "cheese", ...``) until ``max_tokens`` cuts the output,
which is then incomplete. The guard looks at a row's output before each position the target
scores: when its last tokens are the same block of ``p`` tokens repeated (at least
``MIN_REPEATS`` times and ``MIN_TOKENS`` tokens in all, for ``p`` up to ``MAX_PERIOD``), the
token that would start the block once more loses ``PENALTY`` from its logit, before the mask.

It changes nothing else: outputs without such a cycle are untouched, and because it acts before
the constraint's mask it never admits a forbidden token; when the constraint forces the cycle's
next token (no other token allowed), that token is still taken. Speculative verification scores
the same guarded logits, so speculation stays lossless. ``Generator(loop_guard=False)`` turns it
off (a legitimate output such as an array of many equal values is then not nudged to end).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

MIN_REPEATS = 3
MIN_TOKENS = 8
MAX_PERIOD = 16
PENALTY = 1.0e4
"""Large enough to act as a ban, finite so a token the constraint forces still wins."""


@dataclass(frozen=True)
class LoopGuard:
    """When a history counts as a cycle: its last tokens are one block of ``p`` tokens
    (``p <= max_period``) repeated at least ``min_repeats`` times and ``min_tokens`` tokens in all.

    The default suits structured output (an array of a few equal values is left alone);
    ``SENTENCE_GUARD`` suits prose, where no block is written three times in a row: it stops the
    third ("a body, a body, a" goes no further).
    """

    min_repeats: int = MIN_REPEATS
    min_tokens: int = MIN_TOKENS
    max_period: int = MAX_PERIOD

    def __post_init__(self) -> None:
        if self.min_repeats < 2:
            raise ValueError(f"min_repeats must be >= 2, got {self.min_repeats}")
        if self.min_tokens < 1 or self.max_period < 1:
            raise ValueError("min_tokens and max_period must be >= 1")

    def continuation(self, history: Sequence[int]) -> int | None:
        """The token that would repeat the cycle ``history`` ends in, or None when it ends in none."""
        length = len(history)
        for period in range(1, self.max_period + 1):
            span = period * max(self.min_repeats, -(-self.min_tokens // period))
            if span > length:
                if period * self.min_repeats > length:
                    break
                continue
            start = length - span
            if all(history[i] == history[i - period] for i in range(length - 1, start + period - 1, -1)):
                return history[length - period]
        return None

    def bans(self, output: Sequence[int], proposed: Sequence[int], positions: int) -> list[tuple[int, int]]:
        """The cycle continuations of ``positions`` consecutive positions, position ``i`` following
        ``output + proposed[:i]``: ``(i, token)`` for each position whose history ends in a cycle."""
        history = list(output)
        bans = []
        for i in range(positions):
            if i:
                history.append(proposed[i - 1])
            token = self.continuation(history)
            if token is not None:
                bans.append((i, token))
        return bans

    def guard(self, logits: torch.Tensor, output: Sequence[int], proposed: Sequence[int] = ()) -> int:
        """Penalise, in place, the cycle continuations of ``logits``' rows (row ``i`` follows
        ``output + proposed[:i]``); how many were penalised."""
        bans = self.bans(output, proposed, logits.shape[0])
        penalise(logits, bans)
        return len(bans)


DEFAULT_GUARD = LoopGuard()
SENTENCE_GUARD = LoopGuard(min_repeats=2, min_tokens=2)


class WordLoopGuard(LoopGuard):
    """``SENTENCE_GUARD`` on tokens, and the same on words: no block of up to ``max_words`` words is
    written a third time in a row, whatever the case, the punctuation between the words or how the
    tokenizer split them (``"Aw, shaking, aw, shaking, aw"`` and ``"wow, wow wow"`` are cycles of
    words, not of tokens). Where the output's words end in a block written twice, each token that
    would start the block's first word once more (a token whose first run of letters and digits is a
    prefix of it: ``" a"`` for ``"aw"`` as well) is penalised like a token cycle's continuation.
    Built from ``token_bytes``, what each token writes (``TokenVocabulary.token_bytes``)."""

    def __init__(self, token_bytes: Sequence[bytes], max_words: int = 8) -> None:
        super().__init__(min_repeats=2, min_tokens=2)
        object.__setattr__(self, "max_words", max_words)
        texts = [raw.decode("utf-8", errors="ignore") for raw in token_bytes]
        starts: dict[tuple[str, bool], list[int]] = {}  # (first word run, starts with a separator)
        whole: dict[tuple[str, bool], list[int]] = {}  # the same, tokens that write more after the run
        for token_id, text in enumerate(texts):
            match = _WORD.search(text)
            if match is None:
                continue
            table = starts if match.end() == len(text) else whole
            table.setdefault((match.group().lower(), match.start() > 0), []).append(token_id)
        object.__setattr__(self, "texts", texts)
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "whole", whole)

    def bans(self, output: Sequence[int], proposed: Sequence[int], positions: int) -> list[tuple[int, int]]:
        bans = super().bans(output, proposed, positions)
        history = list(output)
        for i in range(positions):
            if i:
                history.append(proposed[i - 1])
            bans.extend((i, token) for token in self.word_continuations(history))
        return bans

    def word_continuations(self, history: Sequence[int]) -> list[int]:
        """The tokens that would start the third run of the block of words ``history`` ends in."""
        text = "".join(self.texts[t] for t in history[-4 * self.max_words:] if 0 <= t < len(self.texts))
        words = _WORD.findall(text.lower())
        if len(words) < 2:
            return []
        mid_word = bool(text) and text[-1].isalnum()  # the last word may go on: only a separator starts another
        for period in range(1, min(self.max_words, len(words) // 2) + 1):
            if words[-period:] == words[-2 * period:-period]:
                first = words[-period]
                tokens = []
                for end in range(1, len(first) + 1):
                    for separated in ((True,) if mid_word else (True, False)):
                        tokens += self.starts.get((first[:end], separated), [])
                        if end == len(first):
                            tokens += self.whole.get((first, separated), [])
                return tokens
        return []


#: a word: a run of letters and digits
_WORD = re.compile(r"[^\W_]+")


def loop_continuation(history: Sequence[int]) -> int | None:
    """``DEFAULT_GUARD.continuation``."""
    return DEFAULT_GUARD.continuation(history)


def loop_bans(output: Sequence[int], proposed: Sequence[int], positions: int) -> list[tuple[int, int]]:
    """``DEFAULT_GUARD.bans``."""
    return DEFAULT_GUARD.bans(output, proposed, positions)


def penalise(logits: torch.Tensor, bans: Sequence[tuple[int, int]]) -> None:
    """Lower each ``(row, token)`` of ``logits`` by ``PENALTY``, in place, in one op for all of them."""
    if bans:
        rows, tokens = zip(*bans, strict=True)
        index = torch.tensor([rows, tokens], dtype=torch.long).to(logits.device, non_blocking=True)
        logits.index_put_((index[0], index[1]), torch.tensor(-PENALTY, dtype=logits.dtype, device=logits.device),
                          accumulate=True)
