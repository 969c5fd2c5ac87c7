"""Draft sources for speculative decoding, all proposing under the shared constraint state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..models.runner import ModelRunner
from .loop import Proposal, Proposer, Session, draft_pass
from .sampling import any_allowed, distribution, masked_logits


class DraftModelProposer:
    """A small model (same tokenizer) proposes one masked token per forward pass.

    Its KV cache follows the committed sequence: rejected speculation is cropped away on the
    next call. Greedy decoding proposes the masked argmax; sampling samples the masked draft
    distribution and hands it to the verifier.
    """

    name = "draft"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def fork(self) -> DraftModelProposer:
        """A proposer on the same draft model with a KV cache of its own (one per batch row)."""
        return DraftModelProposer(ModelRunner(self.runner.model, name=self.runner.name))

    def propose(self, session: Session, proposal: Proposal, budget: int) -> None:
        for _ in range(budget):
            logits = draft_pass(session, self.runner, proposal.tokens)
            mask = session.current_mask()
            proposal.masks.append(mask)
            draft_logits = masked_logits(logits, mask)
            if not any_allowed(draft_logits):
                proposal.masks.pop()
                return
            if session.params.greedy:
                token, probs = int(torch.argmax(draft_logits)), None
            else:
                probs = distribution(draft_logits, session.params)
                token = int(torch.multinomial(probs, 1, generator=session.generator))
            if not session.speculate(proposal, token, probs) or session.state.finished:
                return


class PromptLookupProposer:
    """Copy what followed the latest earlier occurrence of the current n-gram suffix.

    Searches the prompt and the output so far, longest n-gram first (``max_ngram`` down to
    ``min_ngram``); the copied span is cut where the constraint would refuse it. Costs no model
    call, and extraction tasks copy long spans from their input.
    """

    name = "lookup"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("prompt lookup needs 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, session: Session, proposal: Proposal, budget: int) -> None:
        context = session.sequence + proposal.tokens
        span = self.lookup(context, budget)
        if not span:
            return
        span = span[: session.state.validate(span)]
        for token in span:
            proposal.masks.append(None)
            if not session.speculate(proposal, token, None) or session.state.finished:
                return

    def lookup(self, context: Sequence[int], budget: int) -> list[int]:
        """The continuation after the latest earlier match of the longest matching suffix (the
        match ends before the last token, so at least one token follows it)."""
        length = len(context)
        if length < 2:
            return []
        tokens = np.fromiter(context, dtype=np.int64, count=length)
        # where an n-gram ending at p (p <= length - 2) matches the suffix: grown one token at a time
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])
        longest = min(self.max_ngram, length - 1)
        matches: list[np.ndarray] = [ends]
        for n in range(2, longest + 1):
            ends = ends[ends >= n - 1]
            ends = ends[tokens[ends - (n - 1)] == tokens[length - n]]
            matches.append(ends)
        for n in range(longest, self.min_ngram - 1, -1):
            if matches[n - 1].size:
                start = int(matches[n - 1][-1]) + 1
                return [int(t) for t in tokens[start:start + budget]]
        return []


def build_proposers(draft: str | None, target_model: Any, *, target_tokenizer: Any = None,
                    lookup: PromptLookupProposer | None = None) -> list[Proposer]:
    """Proposers for a draft spec, the grammar's forced tokens always first.

    Parts joined by ``+`` (``"lookup+bf16"``): ``"none"``, ``"lookup"`` (prompt lookup),
    ``"bf16"`` / ``"int8"`` (CPU only) / ``"layers:N"`` (self-drafts from the target's weights), or any model
    ``load_model`` accepts (an HF id, folder or GGUF file), whose tokenizer must map every id to
    the same bytes as ``target_tokenizer`` (else ``IncompatibleTokenizers``).
    """
    from ..constraints.vocabulary import TokenVocabulary
    from ..models.loading import load_model
    from ..models.runner import check_same_vocabulary, self_draft
    from .loop import forced_proposer

    proposers: list[Proposer] = [forced_proposer()]
    for part in (draft or "none").split("+"):
        if part == "none":
            continue
        if part == "lookup":
            proposers.append(lookup or PromptLookupProposer())
        elif part in ("bf16", "int8") or part.startswith("layers:"):
            proposers.append(DraftModelProposer(ModelRunner(self_draft(target_model, part), name=part)))
        else:
            loaded = load_model(part, device=ModelRunner(target_model).device)
            if target_tokenizer is None:
                raise ValueError("a separate draft model needs target_tokenizer to check compatibility")
            check_same_vocabulary(TokenVocabulary.from_tokenizer(target_tokenizer),
                                  TokenVocabulary.from_tokenizer(loaded.tokenizer))
            proposers.append(DraftModelProposer(ModelRunner(loaded.model, name=part)))
    return proposers
