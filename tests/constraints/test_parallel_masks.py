"""``fill_drafted_masks``: every row's masks in one llguidance call (its threads, no GIL) equal
the masks ``fill_deferred_masks`` computes row by row, for proposals of forced tokens, drafts and
EOS, and each state ends where it started."""

import random

import pytest
import torch

from cdsl_struct.constraints import JsonSchema, Regex, compile
from cdsl_struct.constraints.backends.llguidance_backend import fill_drafted_masks, parallel_fill_supported
from cdsl_struct.constraints.mask import words_for
from cdsl_struct.decoding.loop import Proposal, fill_deferred_masks
from cdsl_struct.models.tokenizers import load_tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def _walk(state, rng, steps):
    """Advance ``state`` by ``steps`` tokens the mask allows (random among them); the tokens."""
    tokens = []
    words = words_for(state.vocabulary.size)
    for _ in range(steps):
        if state.finished:
            break
        row = torch.zeros(words, dtype=torch.int32)
        state.fill_mask(row)
        bits = [i for i in range(state.vocabulary.size) if (int(row[i // 32]) >> (i % 32)) & 1]
        if not bits:
            break
        token = rng.choice(bits[:50] + bits[-5:])
        state.advance(token)
        tokens.append(token)
    return tokens


@pytest.mark.parametrize("more_eos", [False, True])
def test_parallel_masks_equal_row_by_row_ones(more_eos):
    """With one EOS, and with a second one (its bit set by hand where the output is complete)."""
    tokenizer = load_tokenizer("smollm2")
    eos = [tokenizer.eos_token_id] + ([1 if tokenizer.eos_token_id != 1 else 0] if more_eos else [])
    specs = [compile(JsonSchema(SCHEMA), tokenizer, eos_token_ids=eos),
             compile(Regex(r"(yes|no)\. [a-z ]{1,20}\."), tokenizer, eos_token_ids=eos)]
    rng = random.Random(4)
    words = words_for(specs[0].vocab_size)
    answer = tokenizer.encode("yes. it is.", add_special_tokens=False)
    jobs, expected, twins, first = [], [], [], 0
    for index in range(13):
        compiled = specs[1] if index == 12 else specs[index % 2]
        state, twin = compiled.new_state(), compiled.new_state()
        if index == 12:  # a draft that ends the answer with EOS
            history, drafted = answer[:2], answer[2:] + eos[:1]
            state.advance(history + drafted)
        else:
            history = _walk(state, rng, rng.randint(0, 6))
            drafted = _walk(state, rng, rng.randint(0, 5))  # the step's proposal, advanced into the state
        twin.advance(history + drafted) if history + drafted else None
        assert parallel_fill_supported(state)
        proposal = Proposal(tokens=list(drafted), masks=[None] * (len(drafted) + 1))
        block = torch.zeros((len(drafted) + 1, words), dtype=torch.int32)
        fill_deferred_masks(_Session(twin, compiled), proposal, block)
        jobs.append((state, drafted, first))
        expected.append(block)
        twins.append(twin)
        first += len(drafted) + 1
    bitmask = torch.zeros((first + 3, words), dtype=torch.int32)
    assert all(fill_drafted_masks(jobs, bitmask))
    assert torch.equal(bitmask[:first], torch.cat(expected)) and not bitmask[first:].any()
    assert jobs[-1][0].finished and not bitmask[first - 1].any()  # after EOS: nothing allowed
    for (state, _, _), twin in zip(jobs, twins, strict=True):  # each state where it was
        assert (state.num_tokens, state.finished) == (twin.num_tokens, twin.finished)
        if not state.finished:
            mine, theirs = torch.zeros(words, dtype=torch.int32), torch.zeros(words, dtype=torch.int32)
            state.fill_mask(mine)
            twin.fill_mask(theirs)
            assert torch.equal(mine, theirs)


class _Session:
    def __init__(self, state, compiled):
        self.state, self.compiled = state, compiled
