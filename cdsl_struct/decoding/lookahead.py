"""Reward-steered decoding with lookaheads: CDLH and CDSL (arXiv 2412.10418).

Both are strategies the batched engine steps (``decoding.strategy``), keep every hard constraint (all tokens come from
masked distributions and advance the one constraint state) and count what they cost.

- ``CDLH``: at each step the top-k masked target candidates are each extended by a d-token
  greedy roll-out with the target (the k roll-outs run as one batch), scored
  ``log p(candidate) + lam * reward(text with candidate and roll-out)``; the best candidate is
  committed. The k roll-outs are rows of the engine's batch (branches of the sequence's cache):
  d target passes per token, each shared with every other row of the batch.
- ``CDSL``: the draft writes a d-token lookahead under the constraint; one target pass verifies
  it (acceptance ``a``: the fraction the target's greedy choice agrees with) and the reward
  scores the text with the lookahead (``r``). ``a >= a_t`` and ``r >= r_t``: keep the verified
  lookahead; otherwise fall back to the target (a CDLH step, or one target token).
- ``GuidedDraft``: CDSL's default draft policy, a draft model that weighs the reward (and the
  words it suggests) when it picks each token, so that lookaheads carry the reward.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..constraints import CompiledConstraint, ConstraintState
from ..constraints.mask import allocate_bitmask, allows_only, apply_bitmask
from ..models.batch import Feed
from ..models.runner import ModelRunner
from ..rewards.base import Reward, as_reward
from .guards import WORD_OPENERS, RewardGuard
from .loop import (
    MAX_FORCED,
    Proposal,
    Proposer,
    Session,
    closing,
    closing_step,
    fill_deferred_masks,
    forced_proposer,
    mask_positions,
    verify,
)
from .loops import SENTENCE_GUARD, LoopGuard
from .mask_fill import draft_with_mask
from .sampling import allowed_top, any_allowed, choose, distribution, masked_logits
from .strategy import MAIN, Passes, StepProgram
from .strings import guard_strings

CDSL_STATES = ("accept", "reject_acceptance", "reject_reward", "reject_both")


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass
class CDLH:
    """Constrained decoding with lookahead heuristics (NeuroLogic A*esque)."""

    reward: Reward | Any
    k: int = 5
    d: int = 3
    lam: float = 5.0
    optimism: float = 0.5
    """Credit an unfinished roll-out with this share of the reward it may still earn,
    ``r + optimism * (1 - r)`` (times the share of the token budget left), so that ending early
    with the reward unmet scores lower."""
    loop_guard: LoopGuard | None = SENTENCE_GUARD
    """Candidates and roll-outs that would write a block of tokens a third time in a row are
    pushed below every other allowed token (``decoding.loops``); None: off."""
    reward_guard: bool = False
    string_guard: bool = False
    """A JSON schema's string value the target leaves open for a closing bracket ends there, in the
    candidates and their roll-outs (``decoding.strings``)."""
    """The candidates and their roll-outs leave out spent words and tokens that lose the reward for
    good (``decoding.guards``) where anything else is allowed. Off by default: CDLH as the paper
    has it, the baseline CDSL is measured against; ``Generator`` turns it on for its keyword
    requests, and CDSL for the fallback it builds (with ``avoid_lost``)."""

    def __post_init__(self) -> None:
        _check_unit("optimism", self.optimism)
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.d < 0:
            raise ValueError(f"d must be >= 0, got {self.d}")
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        self.reward = as_reward(self.reward)
        self._guard = RewardGuard(self.reward) if self.reward_guard else None

    @property
    def branches(self) -> int:
        """Roll-out rows a step adds beside the sequence's own."""
        return self.k if self.d > 0 else 0

    def steps(self, session: Session, logits: torch.Tensor | None = None, guarded: bool = False) -> StepProgram:
        """One CDLH step: the target's logits at the next position (``logits``, or one pass;
        ``guarded``: they already carry the loop guard), the top-k candidates' roll-outs, and the
        best candidate committed."""
        state = session.state
        if logits is None:
            if closing(session):
                return (yield from closing_step(session, self._guard, self.string_guard))
            logits = (yield Passes.target(Feed(MAIN, session.sequence)))[0][-1]
        masked = apply_bitmask(logits.clone(), session.current_mask())
        if self.loop_guard is not None and not guarded:
            session.stats.loop_guarded += self.loop_guard.guard(masked[None], session.output)
        if self._guard is not None:
            self._guard.guard(session, session.answer_of(session.output), masked)
        if self.string_guard:
            guard_strings(session, [], masked, last_only=True)
        logp = torch.log_softmax(masked, dim=-1)
        values, indices = allowed_top(logp, self.k)
        if not len(indices):
            return []
        candidates = [int(t) for t in indices]
        rollouts, ended = yield from greedy_rollouts(session, candidates, self.d, self.loop_guard, self._guard,
                                                     self.string_guard)
        best, best_score = candidates[0], -float("inf")
        for candidate, lp, rollout, end in zip(candidates, values.tolist(), rollouts, ended, strict=True):
            tokens = session.output + [candidate] + rollout
            score = lp + self.lam * optimistic_reward(session, self.reward, tokens, end, self.optimism)
            if score > best_score:
                best, best_score = candidate, score
        state.advance(best)
        session.output.append(best)
        return [best]


def greedy_rollouts(session: Session, candidates: list[int], d: int, loop_guard: LoopGuard | None = None,
                    guard: RewardGuard | None = None, string_guard: bool = False) -> StepProgram:
    """Greedy masked ``d``-token continuations by the target of every candidate next token after
    the session's sequence, and whether each ends the output: a program of ``d`` target passes,
    each roll-out a branch of the sequence's cache (local key ``("rollout", i)``); a roll-out that
    ends or meets a dead end is fed no further. ``loop_guard`` keeps each roll-out out of cycles
    as the committed output is kept; ``guard``, off what the reward counts against it, as the
    candidates are (so a candidate is not judged by a roll-out that loses the reward where another
    token would not); ``string_guard``, with strings ended as the candidates' are."""
    if d == 0:
        return [[] for _ in candidates], [output_ended(session, c) for c in candidates]
    states = []
    for candidate in candidates:
        twin = session.state.copy()
        twin.advance(candidate)
        states.append(twin)
    rollouts: list[list[int]] = [[] for _ in candidates]
    row = allocate_bitmask(session.compiled.vocab_size)
    prefix = session.sequence
    for _ in range(d):
        live = [i for i, s in enumerate(states) if not s.finished]
        if not live:
            break
        logits = yield Passes(tuple(Feed(("rollout", i), prefix + [candidates[i]] + rollouts[i], parent=MAIN)
                                    for i in live))
        for i, row_logits in zip(live, logits, strict=True):
            states[i].fill_mask(row)
            choice = apply_bitmask(row_logits[-1].clone(), row)
            if loop_guard is not None:
                loop_guard.guard(choice[None], session.output + [candidates[i]] + rollouts[i])
            if guard is not None:
                guard.guard(session, session.answer_of(session.output + [candidates[i]] + rollouts[i]), choice)
            if string_guard:
                guard_strings(session, [candidates[i], *rollouts[i]], choice, last_only=True)
            if not any_allowed(choice):
                states[i].finished = True  # a dead end: the roll-out ends here
                continue
            token = int(torch.argmax(choice))
            states[i].advance(token)
            rollouts[i].append(token)
    return rollouts, [state_ended(s, session.compiled) for s in states]


class SuggestedWords:
    """The token sequences of a reward's suggested words, each encoded once."""

    def __init__(self, reward: Reward) -> None:
        self.reward = reward
        self._encoded: dict[str, list[int]] = {}

    def fitting(self, session: Session, prefix: list[int], logp: torch.Tensor, room: int) -> list[list[int]]:
        """The suggested words (after a space, or as they are and capitalised where a word may
        start: at the start, after a space, or after an opening quote or bracket, e.g. the first
        word of a JSON string) that the constraint allows after ``prefix`` within ``room`` tokens;
        ``logp`` is the masked distribution at that position."""
        text = session.answer_of(prefix)
        spellings = []
        for word in self.reward.suggestions(text):
            spellings.append(" " + word)
            if not text or text[-1].isspace() or text[-1] in WORD_OPENERS:
                spellings += [word, word.capitalize()]
        found = []
        for spelling in spellings:
            if spelling not in self._encoded:
                self._encoded[spelling] = session.compiled.vocabulary.encode(spelling)
            tokens = self._encoded[spelling]
            if (tokens and len(tokens) <= room and torch.isfinite(logp[tokens[0]])
                    and session.state.validate(tokens) == len(tokens)):
                found.append(tokens)
        return found


class GuidedDraft:
    """A draft model steered by the reward: each step writes the best of the draft's top-k masked
    tokens, and of the words the reward suggests (``Reward.suggestions``, e.g. the inflections of
    keywords still missing), by ``log q(first token) + lam * reward(text with it)``.

    A one-word lookahead heuristic at draft cost (one draft pass per step, a few reward calls):
    it lets CDSL's lookaheads carry the reward (a keyword the target alone would not write yet,
    or not among its top-k at all, as CDLH needs), which the target then verifies. A suggested
    word is written whole (all its tokens) and only where the constraint allows it. A candidate
    that does not end the output is credited ``optimism`` of the reward it may still earn, as in
    CDLH. ``lam = 0`` is the plain greedy draft. The lookahead stops early after a token of the
    draft's own whose probability is below ``stop_below`` (the target is then likely to disagree,
    and drafting further would be wasted). With ``avoid_spent`` (default) the draft does not start
    a word the reward counts against the text if repeated, and with ``avoid_lost`` (default) it
    writes no token that loses the reward for good (``decoding.guards``), as CDSL's target does not
    either: the lookahead could not win that reward back. ``loop_guard``
    keeps the draft from writing a block a third time in a row, as the target's guard would refuse
    it (``decoding.loops``); ``string_guard`` ends a JSON string value the draft leaves open for a
    closing bracket, as the target's would (``decoding.strings``).
    """

    name = "guided-draft"

    def __init__(self, draft: ModelRunner | Any, reward: Reward | Any, k: int = 5, lam: float = 20.0,
                 optimism: float = 0.5, suggest: bool = True, stop_below: float = 0.5,
                 avoid_spent: bool = True, loop_guard: LoopGuard | None = SENTENCE_GUARD,
                 avoid_lost: bool = True, string_guard: bool = False) -> None:
        _check_unit("optimism", optimism)
        _check_unit("stop_below", stop_below)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        self.model = draft.model if isinstance(draft, ModelRunner) else draft
        self.reward, self.k, self.lam = as_reward(reward), k, lam
        self.optimism, self.suggest, self.stop_below = optimism, suggest, stop_below
        self._words = SuggestedWords(self.reward)
        self._guard = RewardGuard(self.reward, spent=avoid_spent, lost=avoid_lost) \
            if avoid_spent or avoid_lost else None
        self.loop_guard, self.string_guard = loop_guard, string_guard

    def steps(self, session: Session, proposal: Proposal, budget: int) -> Generator[Passes, list[torch.Tensor], None]:
        """Extend ``proposal`` by up to ``budget`` tokens (advancing the state): a program of one
        draft pass per step, which the engine batches with the other rows drafting on the model."""
        end = len(proposal.tokens) + budget
        while len(proposal.tokens) < end:
            passes = Passes.on_draft(self.model, session.sequence + proposal.tokens)
            outputs, mask = yield from draft_with_mask(session, passes)  # the mask filled during the pass
            logits = outputs[0][-1]
            prefix = session.output + proposal.tokens
            choice = masked_logits(logits, mask)
            if self.loop_guard is not None:
                self.loop_guard.guard(choice[None], prefix)
            if self._guard is not None:
                choice = self._guard.guard(session, session.answer_of(prefix), choice)
            if self.string_guard:
                guard_strings(session, proposal.tokens, choice, last_only=True)
            logp = torch.log_softmax(choice, dim=-1)
            _, indices = allowed_top(logp, self.k)
            if not len(indices):
                return
            chosen = [int(indices[0])]
            if self.lam > 0:
                candidates = [[int(t)] for t in indices]
                if self.suggest:
                    candidates += self._words.fitting(session, prefix, logp, end - len(proposal.tokens))
                chosen = max(candidates, key=lambda c: float(logp[c[0]]) + self.lam * optimistic_reward(
                    session, self.reward, prefix + c, output_ended(session, c), self.optimism))
            steered = chosen[0] != int(indices[0]) or len(chosen) > 1
            for i, token in enumerate(chosen):
                proposal.masks.append(mask if i == 0 else session.current_mask())
                if not session.speculate(proposal, token, None):
                    return
                if steered:
                    proposal.steered.add(len(proposal.tokens) - 1)
                if session.state.finished:
                    return
            if not steered and math.exp(float(logp[chosen[0]])) < self.stop_below:
                return


@dataclass
class CDSL:
    """Constrained decoding with speculative lookaheads: draft lookahead, target + reward verify.

    Each step the draft writes up to ``d`` tokens under the constraint and one target pass
    scores every position. ``a`` is the fraction of lookahead tokens the target agrees with,
    each judged given the ones before (its masked argmax under greedy decoding, the test
    ``u < p/q`` under sampling); ``r`` is the reward of the text with the lookahead. The four
    states and what each commits:

    - ``accept`` (a >= a_t, r >= r_t): with ``commit="steered"`` (default) the lookahead up to
      the first token that is neither agreed by the target nor chosen by the reward-guided draft
      over its own first choice (so a keyword the target would not have written first survives,
      while the draft's own wording is held to the target's), then the target's next token when
      it does not end the output; ``"lookahead"`` keeps the whole lookahead; ``"prefix"`` only
      the agreed prefix and the target's correction (lossless speculation).
    - ``reject_acceptance`` (r passes, a fails): the agreed prefix and the target's correction,
      exactly what lossless speculative decoding commits; no extra pass.
    - ``reject_reward`` / ``reject_both``: the reward failed, so the target decides with a CDLH
      step (``fallback="cdlh"``) or its own token (``"target"``). With ``reward_on="ending"``
      the agreed tokens before the premature ending are kept and the fallback chooses there.

    The defaults (d 6, a_t 0.5, r_t 0.99, steered commits, a ``GuidedDraft`` with lam 20 and
    stop_below 0.5 around a bare draft runner) come from the CommonGen sweep (docs/benchmarks/2026-11-23-commongen.md),
    whose keyword reward is judged on endings; a reward judged on every prefix (``"text"``)
    usually wants a lower ``reward_threshold`` (0.99 sends most steps to the fallback).
    """

    draft: Proposer | GuidedDraft | ModelRunner | torch.nn.Module
    """A ``GuidedDraft``, a draft model or its runner (then guided by the reward in a
    ``GuidedDraft``), or any proposer (prompt lookup, a draft model proposer with its own cache)."""
    reward: Reward | Any
    d: int = 6
    acceptance_threshold: float = 0.5
    reward_threshold: float = 0.99
    fallback: str = "cdlh"
    reward_on: str = "auto"
    """``"text"``: r scores the text with the lookahead (for rewards that judge every prefix, such
    as harmlessness). ``"ending"``: r scores it as final text only when the lookahead ends the
    output, and is 1 otherwise (for rewards met by the end, such as keyword coverage: an
    unfinished text may still earn its reward, so only a premature ending is rejected).
    ``"auto"``: ``"ending"`` when the reward is ``earned_by_end``, else ``"text"``."""
    commit: str = "steered"
    steer_ratio: float = 0.0
    """With ``commit="steered"``: a token the reward steered the draft to survives only where the
    target gives it at least this share of the probability of its own first choice there (0:
    always; 1: only the target's choice). Keeps keywords where the target finds them plausible
    and drops the insertions it finds jarring ("The game was scored field goal.")."""
    cdlh: CDLH | None = None
    avoid_spent: bool = True
    """The target's choices (what it agrees with, its corrections, its own next token, the
    candidates of a CDLH fallback) leave out a word the reward counts against the text if repeated
    (``Reward.spent``: a keyword already written ``max_repeats`` times; ``decoding.guards``), where
    anything else is allowed: greedy, the target would otherwise repeat a keyword in a list it
    keeps going ("a game, a kid, a rock, a game"), and reward judged on endings never sees it."""
    loop_guard: LoopGuard | None = SENTENCE_GUARD
    """The target's choices and the draft's (when CDSL builds it, and its CDLH fallback when CDSL
    builds that) never write a block of tokens a third time in a row (``decoding.loops``): the
    reward judged on endings does not see a sentence that lists "a body, a body, a body" until
    ``max_tokens``, and a target agrees with the cycle its draft started. None: off."""
    avoid_lost: bool = True
    """The target's choices and the draft's (when CDSL builds it) leave out a token after which the
    text has lost the reward for good or ends where it is lost (``Reward.losing``: the comma or full
    stop that makes the text a list of the keywords), where anything else is allowed: judged on
    endings, the reward sees a list only once a lookahead ends it, by then agreed by the target."""
    optimism: float = 0.5
    """The ``optimism`` of the ``GuidedDraft`` and the CDLH fallback CDSL builds (``CDLH.optimism``): lower
    credits an unfinished text less for the reward it may still earn, so the reward is sought sooner."""
    string_guard: bool = False
    """A JSON schema's string value the target (and the draft and fallback CDSL builds) leaves open for a
    closing bracket ends there (``decoding.strings``)."""
    states: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.d < 1:
            raise ValueError(f"d must be >= 1, got {self.d}")
        _check_unit("acceptance_threshold", self.acceptance_threshold)
        _check_unit("reward_threshold", self.reward_threshold)
        _check_unit("steer_ratio", self.steer_ratio)
        _check_unit("optimism", self.optimism)
        for name, value, allowed in (("fallback", self.fallback, ("cdlh", "target")),
                                     ("reward_on", self.reward_on, ("auto", "text", "ending")),
                                     ("commit", self.commit, ("lookahead", "steered", "prefix"))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        self.reward = as_reward(self.reward)
        if self.reward_on == "auto":
            self.reward_on = "ending" if self.reward.earned_by_end else "text"
        if isinstance(self.draft, (ModelRunner, torch.nn.Module)):
            self.draft = GuidedDraft(self.draft, self.reward, optimism=self.optimism, loop_guard=self.loop_guard,
                                     avoid_lost=self.avoid_lost, string_guard=self.string_guard)
        if self.cdlh is None:
            self.cdlh = CDLH(self.reward, optimism=self.optimism, loop_guard=self.loop_guard,
                             reward_guard=self.avoid_lost, string_guard=self.string_guard)
        self._forced: Proposer = forced_proposer()
        self._guard = RewardGuard(self.reward, spent=self.avoid_spent, lost=self.avoid_lost) \
            if self.avoid_spent or self.avoid_lost else None

    @property
    def branches(self) -> int:
        """Roll-out rows a fallback step adds beside the sequence's own."""
        return self.cdlh.branches if self.fallback == "cdlh" else 0

    def steps(self, session: Session) -> StepProgram:
        """One CDSL step: the lookahead (draft passes), one target pass verifying it, and the
        commit of its state (a fallback CDLH step adds its roll-out passes)."""
        if closing(session):
            return (yield from closing_step(session, self._guard, self.string_guard))
        proposal = Proposal()
        room = session.max_tokens - len(session.output) - 1
        if room > 0:
            self._forced.propose(session, proposal, min(room, MAX_FORCED))
            budget = min(self.d, room - len(proposal.tokens))
            if not session.state.finished and budget > 0:
                if isinstance(self.draft, GuidedDraft):
                    yield from self.draft.steps(session, proposal, budget)
                else:
                    self.draft.propose(session, proposal, budget)
        proposal.masks.append(None)
        session.stats.proposed += len(proposal.tokens)
        tokens, drafted = proposal.tokens, len(proposal.tokens)
        logits = (yield Passes.target(Feed(MAIN, session.sequence + tokens, drafted + 1)))[0]
        fill_deferred_masks(session, proposal)
        masked = mask_positions(logits, proposal.masks)
        if self.loop_guard is not None:
            session.stats.loop_guarded += self.loop_guard.guard(masked, session.output, tokens)
        if self._guard is not None:
            for i in range(drafted + 1):
                self._guard.guard(session, session.answer_of(session.output + tokens[:i]), masked[i])
        if self.string_guard:  # last: among what the guards leave, the quote where it is still allowed
            guard_strings(session, tokens, masked)
        ends = state_ended(session.state, session.compiled)
        accepted, extra = verify(session, proposal, masked)
        agrees = [True] * accepted + [False] + self._judge(session, proposal, masked, start=accepted + 1)
        a = sum(agrees[:drafted]) / drafted if drafted else 1.0
        lost = self._lost_at(session, tokens)
        if lost is not None:
            r = 0.0
        elif self.reward_on == "ending" and not ends:
            r = 1.0
        else:
            r = self.reward(session.answer_of(session.output + tokens), final=ends)
        passed_a, passed_r = a >= self.acceptance_threshold, r >= self.reward_threshold
        state = CDSL_STATES[0] if passed_a and passed_r else (
            "reject_acceptance" if passed_r else ("reject_reward" if passed_a else "reject_both"))
        self.states[state] += 1
        session.stats.accepted += accepted
        kept = drafted if self.commit == "lookahead" else next(
            (i for i in range(drafted) if not agrees[i] and not self._steer_holds(proposal, masked, i)), drafted)
        if state == "accept" and self.commit != "prefix" and kept:
            session.state.rollback(drafted - kept)
            session.output.extend(tokens[:kept])
            return tokens[:kept] + self._target_token(session, masked[kept])
        corrected = tokens[:accepted] + ([] if extra is None else [extra])
        if passed_r and self._lost_at(session, corrected) is None:
            session.state.rollback(drafted - accepted)
            if extra is not None:
                session.state.advance(extra)
            session.output.extend(corrected)
            return corrected
        if passed_r:  # the target's correction would lose the reward: the fallback chooses there instead
            keep = accepted
        else:
            keep = min(accepted, _closing_index(session, tokens)) if self.reward_on == "ending" else 0
            keep = keep if lost is None else min(keep, lost)
        session.state.rollback(drafted - keep)
        session.output.extend(tokens[:keep])
        if self.fallback == "target":
            chosen = self._target_token(session, masked[keep], allow_ending=True)
        else:
            guarded = self._guard is not None or self.loop_guard is not None
            chosen = yield from self.cdlh.steps(session, masked[keep] if guarded else logits[keep],
                                                guarded=self.loop_guard is not None)
        return tokens[:keep] + chosen

    def _steer_holds(self, proposal: Proposal, masked: torch.Tensor, index: int) -> bool:
        """Whether lookahead token ``index`` was steered by the reward and the target finds it
        plausible enough (``steer_ratio``) to keep it against its own choice."""
        if index not in proposal.steered:
            return False
        if self.steer_ratio <= 0.0:
            return True
        row = masked[index]
        return float(row[proposal.tokens[index]] - row.max()) >= math.log(self.steer_ratio)

    def _lost_at(self, session: Session, tokens: list[int]) -> int | None:
        """The index of the first of ``tokens`` after which the output has lost the reward for good
        (``Reward.failed``: a list of the keywords, say), None where none does or the output had
        lost it before them (then nothing is left to save)."""
        failed = self.reward.failed
        if not tokens or not failed(session.answer_of(session.output + tokens)) \
                or failed(session.answer_of(session.output)):
            return None  # a lost text stays lost, so one with all of tokens not lost has no lost prefix
        return next(i for i in range(len(tokens)) if failed(session.answer_of(session.output + tokens[:i + 1])))

    def _target_token(self, session: Session, choice: torch.Tensor, allow_ending: bool = False) -> list[int]:
        """Commit the target's own next token (``choice``: its masked logits); unless ``allow_ending``,
        not one that ends the output, nor then one that loses the reward (the next step decides there;
        the fallback, ``allow_ending``, must commit a token)."""
        if session.state.finished:
            return []
        if not any_allowed(choice):
            return []
        token = choose(choice, session.params, session.generator)
        if not allow_ending and self._lost_at(session, [token]) is not None:
            return []
        session.state.advance(token)
        if not allow_ending and state_ended(session.state, session.compiled):
            session.state.rollback(1)
            return []
        session.output.append(token)
        return [token]

    @staticmethod
    def _judge(session: Session, proposal: Proposal, masked: torch.Tensor, start: int) -> list[bool]:
        """Whether the target agrees with each lookahead token from ``start`` on, given the ones before
        (``masked``: the target's masked logits at every position)."""
        agrees = []
        for i in range(start, len(proposal.tokens)):
            token = proposal.tokens[i]
            target_logits = masked[i]
            if session.params.greedy:
                agrees.append(int(torch.argmax(target_logits)) == token)
                continue
            p = distribution(target_logits, session.params)
            q = proposal.draft_probs[i]
            q_token = 1.0 if q is None else float(q[token])
            agrees.append(float(torch.rand((), generator=session.generator)) * q_token < float(p[token]))
        return agrees


def state_ended(state: ConstraintState, compiled: CompiledConstraint) -> bool:
    """Whether the output has ended: EOS written, complete with nothing but EOS allowed, or nothing
    left but tokens the constraint forces up to such an end (in JSON: the closing quote and
    braces after the last string's final character). The last free choice is where a reward
    judged on endings must be judged: after it nothing can be added."""
    if state.finished:
        return True
    if state.is_complete():
        return _only_eos_allowed(state, compiled)
    path = state.forced_tokens(limit=MAX_FORCED)
    if not path:
        return False
    state.advance(path)
    try:
        return state.finished or (state.is_complete() and _only_eos_allowed(state, compiled))
    finally:
        state.rollback(len(path))


def _only_eos_allowed(state: ConstraintState, compiled: CompiledConstraint) -> bool:
    row = allocate_bitmask(compiled.vocab_size)
    state.fill_mask(row)
    return allows_only(row, compiled.vocabulary.eos_token_ids, compiled.vocab_size)


def output_ended(session: Session, tokens: int | Sequence[int]) -> bool:
    """Whether committing ``tokens`` next would end the output (the state is left as it was)."""
    tokens = [tokens] if isinstance(tokens, int) else list(tokens)
    if any(t in session.compiled.vocabulary.eos_token_ids for t in tokens):
        return True
    session.state.advance(tokens)
    try:
        return state_ended(session.state, session.compiled)
    finally:
        session.state.rollback(len(tokens))


def optimistic_reward(session: Session, reward: Reward, tokens: list[int], ended: bool, optimism: float) -> float:
    """The reward of the output ``tokens``. Unfinished, it is credited ``optimism`` of what it may
    still earn, scaled by the share of ``max_tokens`` left after it: with no room left there is
    nothing more to earn, so an output near its budget is no longer kept from ending. Text that has
    lost the reward for good (``Reward.failed``) earns nothing more either."""
    text = session.answer_of(tokens)
    score = reward(text, final=ended)
    if ended or reward.failed(text):
        return score
    left = max(session.max_tokens - len(tokens), 0) / session.max_tokens if session.max_tokens > 0 else 1.0
    return score + optimism * left * (1.0 - score)


def _closing_index(session: Session, tokens: list[int]) -> int:
    """The position of the lookahead token that ended the output (after it, at most forced tokens
    and EOS follow); the state is left where it was, after all of ``tokens``."""
    state = session.state
    state.rollback(len(tokens))
    closing = len(tokens) - 1
    for index, token in enumerate(tokens):
        state.advance(token)
        if state_ended(state, session.compiled):
            closing = index
            break
    state.advance(tokens[closing + 1:])
    eos = session.compiled.vocabulary.eos_token_ids
    while closing > 0 and tokens[closing] in eos:
        closing -= 1
    return max(closing, 0)
