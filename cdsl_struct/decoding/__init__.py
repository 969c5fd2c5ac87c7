"""Decoders on one batched engine: target-only, speculative (forced tokens, prompt lookup, draft
models) and the reward-steered strategies (``decoding.lookahead``)."""

from .engine import BatchEngine, Request, decode
from .loop import Proposal, Proposer, Session, forced_proposer
from .proposers import DraftModelProposer, PromptLookupProposer, build_proposers
from .sampling import SamplingParams

__all__ = [
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
