"""Soft constraints: rewards in [0, 1] that score partial and final text.

A reward never loosens a hard constraint; decoders use it to choose among outputs the
constraint already allows.
"""

from .base import CallableReward, MinReward, Reward, RewardError, WeightedMean, checked_score
from .harmlessness import Harmlessness
from .keywords import KeywordCoverage, inflections, list_shaped
from .progress import RegexMatch, SchemaProgress

__all__ = [
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
