"""Decoders on one batched engine: target-only, speculative (forced tokens, prompt lookup, draft
models) and the reward-steered strategies (``decoding.lookahead``)."""

from .engine import PHASES, BatchEngine, Request
from .lookahead import CDLH, CDSL, CDSL_STATES, GuidedDraft
from .loop import Proposal, Proposer, Session, forced_proposer
from .loops import DEFAULT_GUARD, SENTENCE_GUARD, LoopGuard, WordLoopGuard
from .one_sequence import decode
from .proposers import DraftModelProposer, PromptLookupProposer, build_proposers
from .sampling import SamplingParams
from .strategy import Strategy

__all__ = [
    "CDLH",
    "CDSL",
    "CDSL_STATES",
    "PHASES",
    "DEFAULT_GUARD",
    "SENTENCE_GUARD",
    "LoopGuard",
    "WordLoopGuard",
    "GuidedDraft",
    "Strategy",
    "BatchEngine",
    "DraftModelProposer",
    "PromptLookupProposer",
    "Request",
    "Proposal",
    "Proposer",
    "SamplingParams",
    "Session",
    "build_proposers",
    "decode",
    "forced_proposer",
]
