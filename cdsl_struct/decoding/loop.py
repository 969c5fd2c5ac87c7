"""The pieces of one decoding step of a sequence, which the batched engine runs for every row.

Each step: proposers (the grammar's forced tokens, prompt lookup, a draft model) may speculate
tokens, advancing the shared constraint state and recording the mask of every position
(``propose``); the target scores all proposed positions plus one more in a single pass (the
engine's forward); the verifier accepts a prefix (greedy argmax match or rejection sampling),
rolls the state back past the rejected tail and commits one target-chosen token (``commit``).
With no proposer this is plain target decoding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ..constraints import CompiledConstraint, ConstraintState
from ..constraints.mask import allocate_bitmask, apply_bitmask, host_kernels, mask_on_host, words_for
from ..errors import InvalidToken
from ..models.batch import Feed
from ..models.runner import ModelRunner
from ..result import DecodeStats, Result, parse_value
from .budget import BudgetCloser
from .sampling import SamplingParams, any_allowed, choose, distribution, draw_tokens, speculative_verdict
from .strategy import MAIN, Passes, StepProgram
from .strings import StringMoves, StringTokens, guard_strings, move_to_quote

if TYPE_CHECKING:
    from .guards import RewardGuard

_log = logging.getLogger(__name__)

#: forced tokens proposed in one step at most (they cost no draft pass, only target positions)
MAX_FORCED = 32


@dataclass
class Proposal:
    """Speculated tokens (already advanced into the state) and what verifying them needs.

    ``masks[i]`` is the mask before ``tokens[i]``; ``masks[len(tokens)]`` the one after them.
    A proposer that needs no mask to propose records None there, and the loop fills the missing
    masks afterwards (``fill_deferred_masks``), in a worker thread while the target runs.
    ``draft_probs[i]`` is the draft's distribution for ``tokens[i]``, or None when the token
    was proposed deterministically (forced, looked up, or a greedy draft). ``steered`` holds the
    indices of tokens a reward-guided draft wrote instead of its own first choice.
    """

    tokens: list[int] = field(default_factory=list)
    masks: list[torch.Tensor] = field(default_factory=list)
    draft_probs: list[torch.Tensor | None] = field(default_factory=list)
    forced: int = 0
    steered: set[int] = field(default_factory=set)
    closing: bool = False
    """The row's budget closer wrote it (``decoding.budget``): its masks allow one token each."""

    @property
    def drafted(self) -> int:
        """Proposed tokens that did not come from the constraint."""
        return len(self.tokens) - self.forced


class Proposer(Protocol):
    """A draft source: extend ``proposal`` by up to ``budget`` tokens, advancing the state."""

    name: str

    def propose(self, session: Session, proposal: Proposal, budget: int) -> None: ...


@dataclass
class Session:
    """One sequence being decoded: prompt, committed output, state, sampling, counters."""

    prompt: list[int]
    compiled: CompiledConstraint
    state: ConstraintState
    params: SamplingParams
    generator: torch.Generator
    stats: DecodeStats
    output: list[int] = field(default_factory=list)
    max_tokens: int = 0
    logprobs: list[dict[str, Any]] | None = None
    """Per committed token, when the request asked for log-probabilities (``decoding.logprobs``)."""
    budget: BudgetCloser | None = None
    """Closes the output before ``max_tokens`` cuts it (``on_budget="close"``), or None."""
    json_scan: Any = None
    """The string guard's ``strings.JsonScan`` of the output so far, once it has read it."""

    @property
    def sequence(self) -> list[int]:
        """Prompt plus committed output."""
        return self.prompt + self.output

    def text_of(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (EOS dropped; invalid UTF-8 replaced)."""
        vocab = self.compiled.vocabulary
        return vocab.decode([t for t in tokens if t not in vocab.eos_token_ids]).decode("utf-8", errors="replace")

    def answer_of(self, tokens: Sequence[int]) -> str:
        """``text_of(tokens)`` without a reasoning row's thinking: the text a reward scores."""
        text = self.text_of(tokens)
        split = getattr(self.compiled.spec, "split", None)
        return split(text)[1] if split is not None else text

    def current_mask(self) -> torch.Tensor:
        """A fresh copy of the mask at the current position."""
        row = allocate_bitmask(self.compiled.vocab_size)
        self.state.fill_mask(row)
        return row

    def speculate(self, proposal: Proposal, token: int, probs: torch.Tensor | None) -> bool:
        """Advance the shared state by a proposed token (its mask is already recorded). ``False``
        when the state refuses it although its mask allowed it (an engine's mask and matcher
        disagreeing): its mask is dropped, nothing else changes, and the proposer stops there."""
        try:
            self.state.advance(token)
        except InvalidToken:
            proposal.masks.pop()
            return False
        proposal.tokens.append(token)
        proposal.draft_probs.append(probs)
        return True


def draft_pass(session: Session, runner: ModelRunner, tokens: Sequence[int]) -> torch.Tensor:
    """The draft's logits after ``session.sequence + tokens`` (one pass, counted in the session's stats)."""
    positions, seconds = runner.positions, runner.seconds
    logits = runner.run(session.sequence + list(tokens), keep=1)[-1]
    session.stats.draft_passes += 1
    session.stats.draft_positions += runner.positions - positions
    session.stats.draft_seconds += runner.seconds - seconds
    return logits


def forced_proposer() -> Proposer:
    """Tokens the constraint forces next: free to propose, verified like any other draft."""

    class Forced:
        name = "forced"

        def propose(self, session: Session, proposal: Proposal, budget: int) -> None:
            for token in session.state.forced_tokens(limit=budget):
                proposal.masks.append(None)
                if not session.speculate(proposal, token, None):
                    return
                proposal.forced += 1
                session.stats.forced += 1

    return Forced()


def propose(session: Session, proposers: Sequence[Proposer], k: int, max_tokens: int) -> Proposal:
    """What ``proposers`` speculate for this step (advanced into the state), within the budget."""
    room = max_tokens - len(session.output) - 1  # one slot stays free for the target's own token
    proposal = Proposal()
    if session.budget is not None and session.budget.watching(session):
        # near the end only forced tokens (every ending writes them) and one of the model's: a
        # step must not outrun the closer's check
        proposal.closing = session.budget.plan(session)
        for proposer in proposers:
            if proposer.name == "forced" and room > 0 and not session.state.finished:
                proposer.propose(session, proposal, min(room, MAX_FORCED))
                if session.budget.splits_a_quote(session, proposal.tokens):
                    truncate(session, proposal, len(proposal.tokens) - 1)
        proposal.masks.append(session.budget.mask(session, proposal.tokens))
        session.stats.proposed += len(proposal.tokens)
        return proposal
    if session.budget is not None:  # not yet watched: the step stops where the closer must look again
        room = min(room, session.budget.unwatched(session))
    for proposer in proposers:
        budget = min(room - len(proposal.tokens), MAX_FORCED if proposer.name == "forced" else k - proposal.drafted)
        if budget <= 0 or session.state.finished:
            continue
        proposer.propose(session, proposal, budget)
    proposal.masks.append(None)
    session.stats.proposed += len(proposal.tokens)
    return proposal


def closing(session: Session) -> bool:
    """Whether the row is near enough the end of its budget that its budget closer steps it
    (``on_budget="close"``; ``decoding.budget``): no lookahead can then outrun the closer's check."""
    return session.budget is not None and session.budget.watching(session)


def closing_step(session: Session, guard: RewardGuard | None = None, string_guard: bool = False) -> StepProgram:
    """A plain target step under the budget closer, as a target row near its end takes: the tokens
    the constraint forces, one target pass, and the model's token among those the closer allows (no
    reward: the ending's shape is the budget's). ``guard``: of those, the ones the reward counts
    against the text are left out where another is allowed (``decoding.guards``); ``string_guard``:
    a JSON string value left open for a closing bracket ends there (``decoding.strings``)."""
    proposal = propose(session, [forced_proposer()], 0, session.max_tokens)
    tokens = proposal.tokens
    logits = (yield Passes.target(Feed(MAIN, session.sequence + tokens, len(tokens) + 1)))[0]
    fill_deferred_masks(session, proposal)
    masked = mask_positions(logits, proposal.masks)
    if guard is not None:
        guard.guard(session, session.answer_of(session.output + tokens), masked[-1])
    if string_guard:
        guard_strings(session, tokens, masked)
    return commit(session, proposal, masked)


def truncate(session: Session, proposal: Proposal, keep: int) -> None:
    """Drop all but the first ``keep`` proposed tokens, rolling the state back past them."""
    drop = len(proposal.tokens) - keep
    if drop <= 0:
        return
    session.state.rollback(drop)
    forced = min(proposal.forced, keep)
    session.stats.forced -= proposal.forced - forced
    session.stats.proposed -= drop
    proposal.forced = forced
    del proposal.tokens[keep:], proposal.draft_probs[keep:], proposal.masks[keep + 1:]
    proposal.steered = {i for i in proposal.steered if i < keep}


def fill_deferred_masks(session: Session, proposal: Proposal, out: torch.Tensor | None = None) -> None:
    """Compute the masks proposers left as None, walking the state back over the proposal and
    forward again (it ends where it started). ``out``: rows ``[len(masks), words]`` (zeroed) of a
    preallocated bitmask that every mask of the proposal is written into, in place; the proposal's
    masks then are views of those rows."""
    if out is not None:
        for i, mask in enumerate(proposal.masks):
            if mask is not None:
                out[i, :mask.shape[-1]].copy_(mask)
                proposal.masks[i] = out[i]
    missing = [i for i, mask in enumerate(proposal.masks) if mask is None]
    if not missing:
        return
    tokens, state = proposal.tokens, session.state
    words = words_for(session.compiled.vocab_size)
    state.rollback(len(tokens) - missing[0])
    for i in range(missing[0], len(tokens) + 1):
        if proposal.masks[i] is None:
            if out is None:
                proposal.masks[i] = session.current_mask()
            else:
                state.fill_mask(out[i, :words])
                proposal.masks[i] = out[i]
        if i < len(tokens):
            state.advance(tokens[i])


def mask_positions(logits: torch.Tensor, masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """``logits[i]`` masked by ``masks[i]`` for every row (a copy; one host-to-device copy of the
    packed masks, unpacked on the logits' device)."""
    return apply_bitmask(logits[-len(masks):].clone(), torch.stack(list(masks)))


def greedy_choices(masked: torch.Tensor) -> list[int]:
    """The argmax of every row of masked logits, -1 for a row whose best logit is not finite (the
    mask allows nothing there), read back in one transfer for all rows."""
    if host_kernels(masked):
        return _host_choices(masked.numpy())
    best, index = masked.max(dim=-1)
    return torch.where(torch.isfinite(best), index, -1).tolist()


#: a sampling row's proposal to judge in bulk: (its first position in the logits, the proposed tokens,
#: the draft's distribution of each or None, the row's sampling parameters and generator)
VerdictRequest = tuple[int, Sequence[int], Sequence[torch.Tensor | None], SamplingParams, torch.Generator]


#: called between a step's choices and their read: (every logit row's choice, the draws or None)
BeforeRead = Callable[[torch.Tensor, torch.Tensor | None], None]


def mask_and_choose(logits: torch.Tensor, masks: torch.Tensor,
                    draws: Sequence[tuple[int, SamplingParams, torch.Generator]] = (),
                    verdicts: Sequence[VerdictRequest] = (), before_read: BeforeRead | None = None,
                    moves: tuple[StringMoves, StringTokens] | None = None
                    ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Mask ``logits`` in place by ``masks`` (one packed row per row of logits), choose greedily in
    every row (``greedy_choices``), draw a token for each of ``draws`` (``(row, params, generator)``:
    ``sampling.draw_tokens``) and judge each of ``verdicts`` (``sampling.speculative_verdict``): a few
    ops over all rows and ONE read back of all of it (on the CPU, numpy kernels over the logits'
    memory, read once). Returns (choices, draws, verdicts): each verdict (accepted, the residual's
    draw). ``before_read``, if given, gets the choices and draws as tensors where the logits are,
    before the read: what it launches on the device then runs while the host waits for the read
    (which is queued ahead of it, so it does not wait for that work). ``moves``: the string guard's
    positions, moved after the masks (``strings.move_to_quote``)."""
    if host_kernels(logits):
        rows = logits.numpy()
        mask_on_host(rows, masks)
        if moves is not None:
            move_to_quote(rows, *moves)
        # the logits are host memory here: drawing and judging over that memory reads nothing more back
        held = torch.from_numpy(rows)
        drawn_tokens = draw_tokens(held, draws) if draws else None
        judged = [speculative_verdict(held[start:start + len(tokens)], tokens, probs, params, generator).tolist()
                  for start, tokens, probs, params, generator in verdicts]
        choices = _host_choices(rows)
        if before_read is not None:
            before_read(torch.tensor(choices, dtype=torch.long), drawn_tokens)
        drawn = drawn_tokens.tolist() if drawn_tokens is not None else []
        return choices, drawn, [(accepted, token) for accepted, token in judged]
    apply_bitmask(logits, masks)
    if moves is not None:
        move_to_quote(logits, *moves)
    best, index = logits.max(dim=-1)
    parts = [torch.where(torch.isfinite(best), index, -1)]
    if draws:
        parts.append(draw_tokens(logits, draws))
    parts += [speculative_verdict(logits[start:start + len(tokens)], tokens, probs, params, generator)
              for start, tokens, probs, params, generator in verdicts]
    values = torch.cat(parts)
    if before_read is not None:
        # copied out before the launched work is queued: the read waits for the choices, not for it
        values = values.to("cpu", non_blocking=True)
        copied = torch.cuda.Event() if logits.is_cuda else None
        if copied is not None:
            copied.record()
        before_read(parts[0], parts[1] if draws else None)
        if copied is not None:
            copied.synchronize()
    values = values.tolist()
    rows, drawn = logits.shape[0], len(draws)
    judged = values[rows + drawn:]
    return values[:rows], values[rows:rows + drawn], [(judged[i], judged[i + 1]) for i in range(0, len(judged), 2)]


def _host_choices(rows: np.ndarray) -> list[int]:
    """``greedy_choices`` in numpy (its argmax: 10x torch's on an AVX2 core)."""
    index = rows.argmax(axis=-1)
    best = np.take_along_axis(rows, index[..., None], axis=-1)[..., 0]
    return np.where(np.isfinite(best), index, -1).tolist()


def commit(session: Session, proposal: Proposal, masked: torch.Tensor, choices: list[int] | None = None,
           drawn: int | None = None, verdict: tuple[int, int] | None = None) -> list[int]:
    """Verify ``proposal`` against the target's masked logits (one row per proposed position plus
    one), roll the state back past the rejected tail, and commit. Returns the committed tokens
    ([] = dead end). ``choices``: the argmax of every row, when the caller computed them in bulk;
    ``drawn``: a sampling row's token drawn at the last position in bulk; ``verdict``: a sampling
    row's verdict on its proposal, judged in bulk (both ``mask_and_choose``)."""
    accepted, extra = verify(session, proposal, masked, choices, drawn, verdict)
    session.stats.accepted += accepted
    session.state.rollback(len(proposal.tokens) - accepted)
    committed = proposal.tokens[:accepted]
    if extra is not None:
        try:
            session.state.advance(extra)
            committed.append(extra)
        except InvalidToken as exc:
            # The engine's mask allowed a token its matcher then refuses (llguidance does where
            # the vocabulary cannot spell a byte the constraint requires): nothing can follow.
            _log.warning("mask and matcher disagree, ending the row as a dead end: %s", exc)
    if not committed:
        return []
    session.output.extend(committed)
    return committed


def verify(session: Session, proposal: Proposal, masked: torch.Tensor, choices: list[int] | None = None,
           drawn: int | None = None, verdict: tuple[int, int] | None = None) -> tuple[int, int | None]:
    """How many proposed tokens the target accepts, and the token it adds after them.

    ``masked[i]`` holds the target's logits at proposed position ``i`` already masked by
    ``proposal.masks[i]`` (``mask_positions``); ``choices[i]``, if given, is their argmax
    (``greedy_choices``: -1 where nothing is allowed); ``drawn``, if given, a sampling row's draw
    at the last position (``sampling.draw_tokens``), taken when every proposed token is accepted;
    ``verdict``, if given, a sampling row's (accepted, residual draw) judged where the logits are
    (``sampling.speculative_verdict``: the same test, no read of its own).

    Greedy: accept while the masked target argmax equals the proposal; the argmax at the first
    mismatch (or after the last proposal) is the extra token. Sampling: accept token x with
    probability min(1, p(x)/q(x)) (q a point mass for deterministic proposals); on rejection,
    sample from the normalised residual max(p - q, 0); after full acceptance, sample from p.
    The extra token is None only when EOS was accepted or no token is allowed.
    """
    params, generator = session.params, session.generator
    if params.greedy and choices is None:
        choices = greedy_choices(masked)
    if verdict is not None and not params.greedy:
        if verdict[0] < len(proposal.tokens):
            return verdict[0], verdict[1] if verdict[1] >= 0 else None
    else:
        rejected = _first_rejected(session, proposal, masked, choices)
        if rejected is not None:
            return rejected
    accepted = len(proposal.tokens)
    if session.state.finished:
        return accepted, None
    if params.greedy:
        best = choices[accepted]
        return (accepted, best) if best >= 0 else (accepted, None)
    if drawn is not None:
        return accepted, drawn if drawn >= 0 else None
    final = masked[accepted]
    if not any_allowed(final):
        return accepted, None
    return accepted, choose(final, params, generator)


def _first_rejected(session: Session, proposal: Proposal, masked: torch.Tensor,
                    choices: list[int] | None) -> tuple[int, int | None] | None:
    """``verify``'s test token by token: (the index of the first proposed token the target rejects,
    the token it writes there instead), or None where it accepts them all."""
    params, generator = session.params, session.generator
    for i, token in enumerate(proposal.tokens):
        target_logits = masked[i]
        if params.greedy:
            best = choices[i]
            if best != token:
                return i, best if best >= 0 else None
            continue
        p = distribution(target_logits, params)
        q = proposal.draft_probs[i]
        q_token = 1.0 if q is None else float(q[token])
        if float(torch.rand((), generator=generator)) * q_token < float(p[token]):
            continue
        residual = p.clone()
        if q is None:
            residual[token] = 0.0
        else:
            residual = torch.clamp(p - q, min=0.0)
        if float(residual.sum()) <= 0:
            residual = p
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return None


def finish(session: Session, dead_end: bool, stopped: bool = False, cancelled: bool = False) -> Result:
    """The Result of a session that stopped (its timing counters filled by the caller first).

    Only an output that ended at EOS in a complete state, or at a stop string where the
    constraint accepts (``stopped``), is complete and gets a value: one cut by ``max_tokens`` is
    ``length`` and incomplete even where the constraint would accept it; a ``cancelled`` one is
    ``cancelled`` and incomplete.
    """
    state, stats = session.state, session.stats
    text = session.text_of(session.output)
    closed = session.budget is not None and session.budget.shaped and not cancelled and state.is_complete()
    complete = not cancelled and (state.finished or (stopped and state.is_complete()) or closed)
    reason = "cancelled" if cancelled else "length" if closed else "stop" if complete else \
        "constraint_dead_end" if dead_end else "length"
    stats.tokens = len(session.output)
    stats.mask_seconds = state.mask_seconds
    split = getattr(session.compiled.spec, "split", None)  # a reasoning row: (thinking, answer)
    reasoning, text = split(text) if split is not None else (None, text)
    value: Any = parse_value(session.compiled.spec, text) if complete else None
    logprobs = session.logprobs[:len(session.output)] if session.logprobs is not None else None
    return Result(text=text, tokens=list(session.output), finish_reason=reason, complete=complete,
                  value=value, stats=stats, logprobs=logprobs, closed_by_budget=closed, reasoning=reasoning)
