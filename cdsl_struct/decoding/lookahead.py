"""Reward-steered decoding with lookaheads: CDLH and CDSL (arXiv 2412.10418).

Both are strategies for the shared step loop, keep every hard constraint (all tokens come from
masked distributions and advance the one constraint state) and count what they cost.

- ``CDLH``: at each step the top-k masked target candidates are each extended by a d-token
  greedy roll-out with the target (the k roll-outs run as one batch), scored
  ``log p(candidate) + lam * reward(text with candidate and roll-out)``; the best candidate is
  committed. d batched target passes per token.
- ``CDSL``: the draft writes a d-token lookahead under the constraint; one target pass verifies
  it (acceptance ``a``: the fraction the target's greedy choice agrees with) and the reward
  scores the text with the lookahead (``r``). ``a >= a_t`` and ``r >= r_t``: keep the verified
  lookahead; otherwise fall back to the target (a CDLH step, or one target token).
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ..constraints.mask import allocate_bitmask, apply_bitmask
from ..rewards.base import Reward, as_reward
from .loop import Proposal, Proposer, Session, forced_proposer, verify
from .proposers import DraftModelProposer

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
    lam: float = 1.0
    optimism: float = 0.0
    """Credit an unfinished roll-out with this share of the reward it may still earn,
    ``r + optimism * (1 - r)``, so that ending early with the reward unmet scores lower."""

    def __post_init__(self) -> None:
        _check_unit("optimism", self.optimism)
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.d < 0:
            raise ValueError(f"d must be >= 0, got {self.d}")
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        self.reward = as_reward(self.reward)

    def __call__(self, session: Session, logits: torch.Tensor | None = None) -> list[int]:
        state, vocab = session.state, session.compiled.vocabulary
        if logits is None:
            logits = session.target.run(session.sequence, keep=1)[-1]
        masked = apply_bitmask(logits.clone(), session.current_mask())
        logp = torch.log_softmax(masked, dim=-1)
        finite = int(torch.isfinite(logp).sum())
        if finite == 0:
            return []
        top = torch.topk(logp, min(self.k, finite))
        candidates = [int(t) for t in top.indices]
        rollouts = self._rollouts(session, candidates)
        best, best_score = candidates[0], -float("inf")
        for candidate, lp, rollout in zip(candidates, top.values.tolist(), rollouts, strict=True):
            tokens = session.output + [candidate] + rollout
            finished = bool(tokens) and tokens[-1] in vocab.eos_token_ids
            reward = self.reward(session.text_of(tokens), final=finished)
            if not finished:
                reward += self.optimism * (1.0 - reward)
            score = lp + self.lam * reward
            if score > best_score:
                best, best_score = candidate, score
        state.advance(best)
        session.output.append(best)
        return [best]

    def _rollouts(self, session: Session, candidates: list[int]) -> list[list[int]]:
        """Greedy d-token continuations of every candidate, as one batch per position."""
        vocab = session.compiled.vocabulary
        if self.d == 0:
            return [[] for _ in candidates]
        states = []
        for candidate in candidates:
            twin = session.state.copy()
            twin.advance(candidate)
            states.append(twin)
        target = session.target
        if target.length != len(session.sequence):
            target.run(session.sequence, keep=1)  # cache exactly the committed sequence
        cache = copy.deepcopy(target.cache)
        cache.batch_repeat_interleave(len(candidates))
        rollouts: list[list[int]] = [[] for _ in candidates]
        feed = list(candidates)
        row = allocate_bitmask(session.compiled.vocab_size)
        for _ in range(self.d):
            alive = [i for i, s in enumerate(states) if not s.finished]
            if not alive:
                break
            logits, cache = self._batched_pass(session, cache, feed)
            for i in range(len(candidates)):
                if states[i].finished:
                    feed[i] = vocab.eos_token_id
                    continue
                states[i].fill_mask(row)
                choice = apply_bitmask(logits[i].clone(), row)
                if not torch.isfinite(choice).any():
                    states[i].finished = True
                    feed[i] = vocab.eos_token_id
                    continue
                token = int(torch.argmax(choice))
                states[i].advance(token)
                rollouts[i].append(token)
                feed[i] = token
        return rollouts

    @staticmethod
    @torch.inference_mode()
    def _batched_pass(session: Session, cache: Any, feed: list[int]) -> tuple[torch.Tensor, Any]:
        import time

        target = session.target
        start = time.perf_counter()
        out = target.model(input_ids=torch.tensor(feed).unsqueeze(1), past_key_values=cache, use_cache=True)
        target.passes += 1
        target.positions += len(feed)
        target.seconds += time.perf_counter() - start
        return out.logits[:, -1].float(), out.past_key_values


@dataclass
class CDSL:
    """Constrained decoding with speculative lookaheads: draft lookahead, target + reward verify."""

    draft: DraftModelProposer
    reward: Reward | Any
    d: int = 4
    acceptance_threshold: float = 0.5
    reward_threshold: float = 0.0
    fallback: str = "cdlh"
    reward_on: str = "text"
    """``"text"``: r scores the text with the lookahead. ``"ending"``: r scores it as final text
    only when the lookahead ends the output, and is 1 otherwise (an unfinished text may still
    earn its reward, so only a premature ending is rejected)."""
    cdlh: CDLH | None = None
    states: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.d < 1:
            raise ValueError(f"d must be >= 1, got {self.d}")
        _check_unit("acceptance_threshold", self.acceptance_threshold)
        _check_unit("reward_threshold", self.reward_threshold)
        if self.fallback not in ("cdlh", "target"):
            raise ValueError(f"fallback must be 'cdlh' or 'target', got {self.fallback!r}")
        if self.reward_on not in ("text", "ending"):
            raise ValueError(f"reward_on must be 'text' or 'ending', got {self.reward_on!r}")
        self.reward = as_reward(self.reward)
        if self.cdlh is None:
            self.cdlh = CDLH(self.reward)
        self._forced: Proposer = forced_proposer()

    def __call__(self, session: Session) -> list[int]:
        proposal = Proposal()
        room = session.max_tokens - len(session.output) - 1
        if room > 0:
            self._forced.propose(session, proposal, min(room, 32))
            if not session.state.finished and room - len(proposal.tokens) > 0:
                self.draft.propose(session, proposal, min(self.d, room - len(proposal.tokens)))
        proposal.masks.append(session.current_mask())
        session.stats.proposed += len(proposal.tokens)
        logits = session.target.run(session.sequence + proposal.tokens, keep=len(proposal.tokens) + 1)
        accepted, extra = verify(session, proposal, logits)
        drafted = len(proposal.tokens)
        a = accepted / drafted if drafted else 1.0
        finished = session.state.finished
        if self.reward_on == "ending" and not finished:
            r = 1.0
        else:
            r = self.reward(session.text_of(session.output + proposal.tokens), final=finished)
        passed_a, passed_r = a >= self.acceptance_threshold, r >= self.reward_threshold
        state = CDSL_STATES[0] if passed_a and passed_r else (
            "reject_acceptance" if passed_r else ("reject_reward" if passed_a else "reject_both"))
        self.states[state] += 1
        if state == "accept":
            session.stats.accepted += accepted
            session.state.rollback(drafted - accepted)
            committed = proposal.tokens[:accepted]
            if extra is not None:
                session.state.advance(extra)
                committed.append(extra)
            session.output.extend(committed)
            return committed
        session.state.rollback(drafted)
        if self.fallback == "target":
            first = apply_bitmask(logits[0].clone(), proposal.masks[0])
            if not torch.isfinite(first).any():
                return []
            token = int(torch.argmax(first))
            session.state.advance(token)
            session.output.append(token)
            return [token]
        return self.cdlh(session, logits[0])
