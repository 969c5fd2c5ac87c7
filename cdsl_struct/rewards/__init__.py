"""Soft constraints: rewards in [0, 1] that score partial and final text.

A reward never loosens a hard constraint; decoders use it to choose among outputs the
constraint already allows.
"""

from .base import CallableReward, MinReward, Reward, RewardError, WeightedMean, checked_score
from .harmlessness import Harmlessness
from .keywords import TALK_ABOUT_WORDS, KeywordCoverage, inflections, list_shaped
from .progress import RegexMatch, SchemaProgress

__all__ = [
    "TALK_ABOUT_WORDS",
    "CallableReward",
    "Harmlessness",
    "KeywordCoverage",
    "MinReward",
    "RegexMatch",
    "Reward",
    "RewardError",
    "SchemaProgress",
    "WeightedMean",
    "checked_score",
    "inflections",
    "list_shaped",
]
