"""StepWidth: the width a step's speculation is cut to, under a padded or a ragged batch."""

from cdsl_struct.decoding.loop import Proposal
from cdsl_struct.decoding.width import StepWidth


def test_one_long_proposal_pays_in_a_ragged_batch_and_not_in_a_padded_one():
    # sixteen rows, one with four drafted tokens: padded, every row would feed five positions
    proposals = [Proposal(tokens=[1, 2, 3, 4])] + [Proposal() for _ in range(15)]
    assert StepWidth(cost_ratio=1 / 32, padded=True).choose(proposals) == 1
    assert StepWidth(cost_ratio=1 / 32, padded=False).choose(proposals) == 5


def test_forced_tokens_are_worth_their_positions_at_one_row():
    assert StepWidth(cost_ratio=1 / 32).choose([Proposal(tokens=[7, 8, 9], forced=3)]) == 4
