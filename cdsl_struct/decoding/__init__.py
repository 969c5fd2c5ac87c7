"""Decoders sharing one step loop: target-only and speculative (forced tokens, prompt lookup,
draft models)."""

from .loop import Proposal, Proposer, Session, decode, forced_proposer
from .proposers import DraftModelProposer, PromptLookupProposer, build_proposers
from .sampling import SamplingParams

__all__ = [
    "DraftModelProposer",
    "PromptLookupProposer",
    "Proposal",
    "Proposer",
    "SamplingParams",
    "Session",
    "build_proposers",
    "decode",
    "forced_proposer",
]
