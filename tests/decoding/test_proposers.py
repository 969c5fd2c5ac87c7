"""Prompt lookup: the vectorised search finds what a plain scan finds."""

import random

from cdsl_struct.decoding.proposers import PromptLookupProposer


def _scan(context, budget, max_ngram, min_ngram):
    """The definition: for the longest suffix first, the latest earlier match with a token after it."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start + n:start + n + budget]
    return []


def test_lookup_finds_the_latest_match_of_the_longest_suffix():
    rng = random.Random(0)
    for _ in range(3000):
        longest = rng.randint(1, 5)
        proposer = PromptLookupProposer(max_ngram=longest, min_ngram=rng.randint(1, longest))
        context = [rng.randrange(rng.choice([2, 5, 30])) for _ in range(rng.randint(0, 50))]
        budget = rng.randint(1, 8)
        assert proposer.lookup(context, budget) == _scan(context, budget, proposer.max_ngram, proposer.min_ngram)
    proposer = PromptLookupProposer()
    assert proposer.lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]  # the latest of two matches
    assert proposer.lookup([5, 6], 3) == [] and proposer.lookup([5], 3) == []
