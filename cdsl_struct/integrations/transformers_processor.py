"""A compiled constraint inside transformers' ``model.generate``.

Three lines::

    cc = cs.compile(Person, tokenizer)                                  # or one constraint per row
    out = model.generate(**inputs, **constrained(cc), max_new_tokens=64)
    texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

``constrained(...)`` returns ``logits_processor`` and ``stopping_criteria`` sharing one
``ConstraintLogitsProcessor``; ``finish_reasons(kwargs, out)`` then says which rows are complete,
cut by ``max_new_tokens``, or invalid (never shown as finished: an invalid row gets no EOS).
It works with greedy search, sampling (``do_sample=True``, also
``num_return_sequences``), beam search (``num_beams``) and batched, left-padded inputs with one
constraint per input row.

How states follow the sequences: transformers does not tell a logits processor which beam a
row came from (beam search reorders rows every step). So states are keyed by the tokens each row
has generated: at every step a row's state is its parent's (the row's tokens minus the last one)
advanced by the last token, copied when several rows share a parent. This needs no help from the
search and is exact for every search strategy that extends sequences one token per step.

The string guard (``decoding.strings``, on by default as in the engine: ``constrained(...,
string_guard=False)`` turns it off) follows each row's JSON the same way, keyed by its tokens: where a
schema's string value is open and the model moves on to a closing bracket without its quote, the
bracket's probability goes to the quote, after the mask.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from ..constraints import CompiledConstraint, ConstraintState, allocate_bitmask, apply_bitmask
from ..decoding.strings import (
    JsonScan,
    StringMoves,
    add_position,
    feed_token,
    move_to_quote,
    new_scan,
    reads_json,
    string_tokens,
)
from ..errors import InvalidToken

__all__ = ["ConstraintLogitsProcessor", "ConstraintStoppingCriteria", "constrained", "finish_reasons"]

_DEAD = None  # a row that took a token its constraint forbids (beam search keeps -inf beams) or hit a dead end


class ConstraintLogitsProcessor(LogitsProcessor):
    """Masks each row's next-token scores to what its constraint allows (EOS only when complete).

    ``constraints``: one ``CompiledConstraint`` for every input row, or a list with one per
    input row. Rows expanded by ``num_beams`` / ``num_return_sequences`` use their input row's
    constraint. A processor may be reused: a call whose sequences are no longer than the last
    call's starts a new generation. ``string_guard``: end a JSON string value the model leaves open
    for a closing bracket (see the module's docstring).
    """

    def __init__(self, constraints: CompiledConstraint | Sequence[CompiledConstraint], *,
                 string_guard: bool = True) -> None:
        self.constraints = [constraints] if isinstance(constraints, CompiledConstraint) else list(constraints)
        if not self.constraints or not all(isinstance(c, CompiledConstraint) for c in self.constraints):
            raise TypeError("constraints must be a CompiledConstraint or a non-empty list of them (cs.compile(...))")
        self.string_guard = string_guard
        self.prompt_length = 0
        self._last_length = -1
        self._expand = 1
        self._states: list[dict[tuple[int, ...], ConstraintState | None]] = []
        self._scans: list[dict[tuple[int, ...], JsonScan] | None] = []

    # --- transformers hooks ---------------------------------------------------------------------

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        length = input_ids.shape[1]
        if length <= self._last_length or not self._states:
            self._start(input_ids)
        self._last_length = length
        rows = input_ids[:, self.prompt_length:].tolist()
        keys = [tuple(row) for row in rows]
        self._advance(keys)
        mask = allocate_bitmask(self._vocab_size(), len(keys))
        unmasked = []
        for i, key in enumerate(keys):
            state = self._states[self._group(i)][key]
            if state is not _DEAD and not state.finished:
                state.fill_mask(mask[i])
                if not bool(mask[i].any()):  # a dead end: nothing allowed, and not complete
                    self._states[self._group(i)][key] = state = _DEAD
            if state is _DEAD or state.finished:
                # transformers pads finished rows itself; a dead row is not given EOS (it would
                # look finished): the stopping criteria end it after this token, and
                # ``finish_reasons`` calls it invalid. Either way the row's scores stay finite.
                unmasked.append(i)
        kept = scores[unmasked].clone() if unmasked else None
        apply_bitmask(scores, mask)
        if kept is not None:
            scores[unmasked] = kept
        if self.string_guard:
            self._guard_strings(keys, scores, set(unmasked))
        return scores

    # --- queries ----------------------------------------------------------------------------------

    def state_of(self, group: int, generated: Sequence[int]) -> ConstraintState | None:
        """The state of input row ``group`` after ``generated`` tokens, if this step holds it."""
        return self._states[group].get(tuple(generated)) if self._states else None

    def finish_reasons(self, sequences: torch.Tensor, pad_token_id: int | None = None) -> list[str]:
        """For each row ``model.generate`` returned: ``"stop"`` (its constraint is complete),
        ``"length"`` (still open: ``max_new_tokens`` ran out) or ``"invalid"`` (it took a token
        its constraint forbids or reached a dead end). Rows are replayed from the start, so this
        holds for any search; ``pad_token_id`` (the padding after a finished row) is skipped
        once the constraint is complete."""
        if sequences.shape[0] % len(self.constraints):
            raise ValueError(f"{sequences.shape[0]} sequences for {len(self.constraints)} constraints")
        per_group = sequences.shape[0] // len(self.constraints)
        reasons = []
        for i, row in enumerate(sequences[:, self.prompt_length:].tolist()):
            state: ConstraintState | None = self.constraints[i // per_group].new_state()
            for token in row:
                if state.finished and token == pad_token_id:
                    continue
                state = _step(state, token)
                if state is _DEAD:
                    break
            reasons.append("invalid" if state is _DEAD else "stop" if state.finished or state.is_complete()
                           else "length")
        return reasons

    # --- internals --------------------------------------------------------------------------------

    def _start(self, input_ids: torch.Tensor) -> None:
        rows = input_ids.shape[0]
        if rows % len(self.constraints):
            raise ValueError(f"{len(self.constraints)} constraints for {rows} sequences: pass one per input row")
        self._expand = rows // len(self.constraints)
        self.prompt_length = input_ids.shape[1]
        self._states = [{(): c.new_state()} for c in self.constraints]
        self._scans = [{(): new_scan(c.spec)} if self.string_guard and reads_json(c.spec) else None
                       for c in self.constraints]

    def _guard_strings(self, keys: list[tuple[int, ...]], scores: torch.Tensor, skipped: set[int]) -> None:
        """The string guard's moves on the masked ``scores`` of the live rows (``decoding.strings``)."""
        moves = StringMoves()
        current: list[dict[tuple[int, ...], JsonScan] | None] = [None if s is None else {} for s in self._scans]
        # a parent a single child follows moves to it, uncopied
        uses = Counter((group, key[:-1]) for group, key in {(self._group(i), key) for i, key in enumerate(keys)})
        for i, key in enumerate(keys):
            group = self._group(i)
            scans = current[group]
            if scans is None:
                continue
            if key not in scans:
                scans[key] = _scan_of(self._scans[group], key, self.constraints[group], uses, group)
            if i not in skipped:
                add_position(moves, scans[key], i)
        self._scans = current  # the scans of this step's rows only, as ``_states``
        tokens = string_tokens(self.constraints[0].vocabulary) if moves else None
        if tokens is not None:
            move_to_quote(scores, moves, tokens)

    def _advance(self, keys: list[tuple[int, ...]]) -> None:
        """Give every row's key a state: its parent's, advanced by its last token."""
        wanted: list[set[tuple[int, ...]]] = [set() for _ in self.constraints]
        for i, key in enumerate(keys):
            wanted[self._group(i)].add(key)
        for group, children in enumerate(wanted):
            previous = self._states[group]
            if children <= previous.keys():
                self._states[group] = {key: previous[key] for key in children}
                continue
            uses = Counter(key[:-1] for key in children)
            current: dict[tuple[int, ...], ConstraintState | None] = {}
            for key in sorted(children):
                parent_key = key[:-1]
                parent = previous.get(parent_key, _DEAD)
                uses[parent_key] -= 1
                if parent is _DEAD:
                    current[key] = _DEAD
                    continue
                state = parent if uses[parent_key] == 0 else parent.copy()
                current[key] = _step(state, key[-1])
            self._states[group] = current

    def _group(self, row: int) -> int:
        return row // self._expand

    def _constraint(self, row: int) -> CompiledConstraint:
        return self.constraints[self._group(row)]

    def _vocab_size(self) -> int:
        return max(c.vocab_size for c in self.constraints)


def _scan_of(previous: dict[tuple[int, ...], JsonScan], key: tuple[int, ...], constraint: CompiledConstraint,
             uses: Counter, group: int) -> JsonScan:
    """The string guard's scan of a row's tokens ``key``: the step before's (the same tokens), or its
    parent's (copied while another child of it still needs it: beams) fed the last token, or a new one
    fed them all."""
    if key in previous:
        return previous[key]
    parent = previous.get(key[:-1]) if key else None
    if parent is None:
        scan = new_scan(constraint.spec)
    else:
        uses[group, key[:-1]] -= 1
        scan = parent if uses[group, key[:-1]] == 0 else parent.copy()
    for token in key[-1:] if parent is not None else key:
        feed_token(scan, constraint.vocabulary, token)
    return scan


def _step(state: ConstraintState, token: int) -> ConstraintState | None:
    if state.finished:
        return state  # padding after EOS
    try:
        state.advance(token)
    except InvalidToken:
        return _DEAD
    return state


class ConstraintStoppingCriteria(StoppingCriteria):
    """Stops a row once its constraint has consumed EOS (also when the tokenizer's EOS is not the
    model's ``generation_config.eos_token_id``) or the row can no longer be completed."""

    def __init__(self, processor: ConstraintLogitsProcessor) -> None:
        self.processor = processor

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        start = self.processor.prompt_length
        if input_ids.shape[1] <= start:
            return done
        constraints = self.processor.constraints
        per_group = max(1, input_ids.shape[0] // len(constraints))  # beam search passes 2 * num_beams candidates
        for i, row in enumerate(input_ids[:, start:].tolist()):
            group = min(i // per_group, len(constraints) - 1)
            parent = self.processor.state_of(group, row[:-1])
            eos = constraints[group].vocabulary.eos_token_ids
            done[i] = parent is _DEAD or parent.finished or row[-1] in eos
        return done


def finish_reasons(generate_kwargs: dict[str, Any], sequences: torch.Tensor,
                   pad_token_id: int | None = None) -> list[str]:
    """``ConstraintLogitsProcessor.finish_reasons`` for the processor in ``constrained(...)``'s kwargs."""
    processor = next(p for p in generate_kwargs["logits_processor"] if isinstance(p, ConstraintLogitsProcessor))
    return processor.finish_reasons(sequences, pad_token_id)


def constrained(constraints: CompiledConstraint | Sequence[CompiledConstraint], *,
                string_guard: bool = True) -> dict[str, Any]:
    """``model.generate`` keyword arguments that decode under ``constraints`` (one, or one per input row);
    ``string_guard`` as ``ConstraintLogitsProcessor``'s."""
    processor = ConstraintLogitsProcessor(constraints, string_guard=string_guard)
    return {
        "logits_processor": LogitsProcessorList([processor]),
        "stopping_criteria": StoppingCriteriaList([ConstraintStoppingCriteria(processor)]),
    }
