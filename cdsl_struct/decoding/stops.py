"""Stop strings: where one may end a constrained output, and holding them back from a stream.

A stop string ends the output, without itself, only where the text before it is a complete
output under the row's constraint (for free text: anywhere). Elsewhere, inside a JSON string for
instance, it is ordinary text and decoding goes on. The check runs after each step on the new
text only; the output's tokens are cut at the stop string (re-encoding the part of a token
before it, when the stop string starts inside a token, and checking those tokens against the
constraint like any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StopStrings:
    """A row's stop strings and how far its text has been searched."""

    def __init__(self, stops: Sequence[str]) -> None:
        stops = [s for s in stops if s]
        if not stops:
            raise ValueError("stop strings must not be empty")
        self.stops = tuple(stops)
        self.longest = max(len(s) for s in self.stops)
        self.searched = 0  # characters of the text already searched for a stop string start
        self.text = ""

    def end(self, session: Any) -> bool:
        """If a stop string that may end the output has appeared, cut the output before it and
        return True (the row then ends complete)."""
        text = session.text_of(session.output)
        start = max(0, self.searched - self.longest + 1)
        hits = sorted(found for s in self.stops for found in _occurrences(text, s, start))
        self.searched = len(text)
        for position in hits:
            if _cut(session, text[:position]):
                self.text = text[:position]
                return True
        return False


def _occurrences(text: str, stop: str, start: int) -> list[int]:
    found, at = [], text.find(stop, start)
    while at >= 0:
        found.append(at)
        at = text.find(stop, at + 1)
    return found


def _cut(session: Any, before: str) -> bool:
    """Roll the output back to exactly the text ``before`` if the constraint accepts it as complete."""
    output, state = session.output, session.state
    keep = len(output)
    while keep > 0 and not before.startswith(session.text_of(output[:keep])):
        keep -= 1
    undone = output[keep:]
    if len(undone) > state.MAX_ROLLBACK:
        return False
    rest = before[len(session.text_of(output[:keep])):]
    tokens = list(session.compiled.vocabulary.encode(rest)) if rest else []
    state.rollback(len(undone))
    if state.validate(tokens) == len(tokens):
        state.advance(tokens)
        if state.is_complete():
            del output[keep:]
            output.extend(tokens)
            return True
        state.rollback(len(tokens))
    state.advance(undone)
    return False


class StopHoldback:
    """Text deltas of a stream, less anything that could still turn out to start a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.sent = ""
        self.text = ""

    def push(self, delta: str) -> str:
        """What of the text so far is safe to send now."""
        self.text += delta
        safe = len(self.text) - _held(self.text, self.stops)
        for stop in self.stops:
            found = self.text.find(stop, max(0, len(self.sent) - len(stop)))
            if found >= 0:
                safe = min(safe, found)
        if safe <= len(self.sent):
            return ""
        out, self.sent = self.text[len(self.sent):safe], self.text[:safe]
        return out

    def finish(self, final_text: str) -> str:
        """The rest of the final text, once the Result is known."""
        if not final_text.startswith(self.sent):
            return ""
        rest, self.sent = final_text[len(self.sent):], final_text
        return rest


def _held(text: str, stops: Sequence[str]) -> int:
    """The longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for size in range(min(len(text), len(stop) - 1), best, -1):
            if stop.startswith(text[-size:]):
                best = size
                break
    return best
