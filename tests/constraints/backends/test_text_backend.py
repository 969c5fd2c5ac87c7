"""Free text by table (``backends.text_backend``): ``Regex("[\\s\\S]*")`` under ``backend="auto"``
compiles there, and its masks, verdicts and decoded outputs are llguidance's for the same pattern,
on real tokenizers, through rollbacks, copies, drafts and EOS, and in the engine."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from cdsl_struct import Regex, UnsupportedFeature, compile
from cdsl_struct.constraints.backends import get_backend
from cdsl_struct.constraints.backends.llguidance_backend import LLGuidanceState
from cdsl_struct.constraints.backends.text_backend import FREE_TEXT, TextState, fill_text_masks, is_free_text
from cdsl_struct.constraints.mask import allocate_bitmask, allowed_tokens, words_for
from cdsl_struct.decoding.loop import Proposal, fill_deferred_masks
from cdsl_struct.decoding.mask_fill import fill_masks_together, split_mask_jobs


def _pair(vocabulary):
    return compile(Regex(FREE_TEXT), vocabulary), compile(Regex(FREE_TEXT), vocabulary, backend="llguidance")


def _mask(state):
    row = allocate_bitmask(state.vocabulary.size)
    state.fill_mask(row)
    return row


def _choose(rng, vocabulary, allowed):
    """A token among ``allowed`` but EOS, mostly one with non-ASCII bytes (where UTF-8 states differ)."""
    allowed = [t for t in allowed if t not in vocabulary.eos_token_ids]
    wide = [t for t in allowed if t in _wide(vocabulary)]
    return rng.choice(wide if wide and rng.random() < 0.7 else allowed)


@functools.cache
def _wide(vocabulary):
    return frozenset(t for t, text in enumerate(vocabulary.token_bytes) if any(b >= 0x80 for b in text))


def test_free_text_compiles_to_the_table_backend_only_under_auto(vocab_of):
    vocabulary = vocab_of("smollm2")
    ours, theirs = _pair(vocabulary)
    assert ours.backend == "text" and isinstance(ours.new_state(), TextState) and not ours.skipped
    assert theirs.backend == "llguidance"
    assert compile(Regex(r"[\s\S]{0,5}"), vocabulary).backend == "llguidance"
    assert is_free_text(Regex(r"[\S\s]*")) and not is_free_text(Regex("[a-z]*"))
    with pytest.raises(UnsupportedFeature):
        get_backend("text").compile(Regex("[a-z]*"), vocabulary, ours.whitespace)
    with pytest.raises(ValueError, match="unknown backend"):
        compile(Regex(FREE_TEXT), vocabulary, backend="text")


@pytest.mark.parametrize("name", ["smollm2", "llama3", "gpt2", "llama2", "gemma3"])
def test_masks_and_verdicts_equal_llguidance_along_random_walks(vocab_of, name):
    vocabulary = vocab_of(name)
    ours, theirs = _pair(vocabulary)
    rng = random.Random(name)
    size = vocabulary.size
    specials = sorted(vocabulary.special_ids)[:5]
    for _ in range(12):
        mine, reference = ours.new_state(), theirs.new_state()
        for _ in range(10):
            expected = _mask(reference)
            assert torch.equal(_mask(mine), expected)
            allowed = allowed_tokens(expected, size)
            probes = [rng.randrange(size) for _ in range(12)] + specials + list(vocabulary.eos_token_ids)
            assert [mine.validate([t]) for t in probes] == [reference.validate([t]) for t in probes]
            token = _choose(rng, vocabulary, allowed)
            mine.advance(token)
            reference.advance(token)
            assert mine.is_complete() == reference.is_complete()
            if mine.finished:
                break


def test_rollback_copy_and_eos_only_between_characters(vocab_of):
    vocabulary = vocab_of("smollm2")
    compiled = compile(Regex(FREE_TEXT), vocabulary)
    eos = vocabulary.eos_token_id
    e_acute = list("é".encode())  # two byte tokens: lead, then continuation
    lead, tail = (vocabulary.token_bytes.index(bytes([b])) for b in e_acute)
    state = compiled.new_state()
    start = _mask(state).clone()
    state.advance(lead)
    assert not state.is_complete() and state.validate([eos]) == 0 and state.validate([tail, eos]) == 2
    twin = state.copy()
    state.advance([tail, eos])
    assert state.finished and not _mask(state).any()
    state.rollback(3)
    assert torch.equal(_mask(state), start)
    reference = compile(Regex(FREE_TEXT), vocabulary, backend="llguidance").new_state()
    reference.advance(lead)
    assert torch.equal(_mask(twin), _mask(reference))


def _walk(state, rng, count):
    tokens = []
    for _ in range(count):
        tokens.append(_choose(rng, state.vocabulary, allowed_tokens(_mask(state), state.vocabulary.size)))
        state.advance(tokens[-1])
    return tokens


def test_a_steps_masks_filled_in_one_copy_equal_row_by_row_ones(vocab_of):
    vocabulary = vocab_of("smollm2")
    compiled = compile(Regex(FREE_TEXT), vocabulary)
    words = words_for(vocabulary.size)
    rng = random.Random(3)
    jobs, expected, first = [], [], 0
    for index in range(9):
        state, twin = compiled.new_state(), compiled.new_state()
        history, drafted = _walk(state, rng, rng.randint(0, 3)), _walk(state, rng, rng.randint(0, 4))
        if index == 8 and state.is_complete():  # a draft that ends the text
            drafted.append(vocabulary.eos_token_id)
            state.advance(drafted[-1])
        twin.advance(history + drafted) if history + drafted else None
        block = torch.zeros((len(drafted) + 1, words), dtype=torch.int32)
        fill_deferred_masks(_Session(twin, compiled), Proposal(tokens=list(drafted), masks=[None] * (len(drafted) + 1)),
                            block)
        jobs.append((state, len(drafted), first))
        expected.append(block)
        first += len(drafted) + 1
    bitmask = torch.zeros((first + 2, words), dtype=torch.int32)
    fill_text_masks(jobs, bitmask)
    assert torch.equal(bitmask[:first], torch.cat(expected)) and not bitmask[first:].any()


def test_free_text_and_llguidance_rows_fill_together_in_one_step(vocab_of):
    vocabulary = vocab_of("smollm2")
    ours, theirs = _pair(vocabulary)
    words = words_for(vocabulary.size)
    text = vocabulary.encode("Hello, café")
    rows, blocks, expected, first = [], [], [], 0
    for compiled in (ours, theirs, ours):
        state, twin = compiled.new_state(), compiled.new_state()
        state.advance(text)
        twin.advance(text)
        proposal = Proposal(tokens=text[-2:], masks=[None] * 3)
        reference = torch.zeros((3, words), dtype=torch.int32)
        fill_deferred_masks(_Session(twin, compiled), Proposal(tokens=text[-2:], masks=[None] * 3), reference)
        rows.append((_Row(state, compiled), proposal))
        expected.append(reference)
        first += 3
    bitmask = torch.zeros((first, words), dtype=torch.int32)
    blocks = list(torch.split(bitmask, 3))
    together, alone = split_mask_jobs(list(enumerate(zip(rows, blocks, strict=True))))
    assert len(together) == 3 and not alone
    assert isinstance(rows[1][0].session.state, LLGuidanceState)
    assert sorted(fill_masks_together(together, bitmask)) == [(0, None), (1, None), (2, None)]
    assert torch.equal(bitmask, torch.cat(expected))
    assert all(len(proposal.masks) == 3 for _, proposal in rows)


def test_the_engine_decodes_free_text_as_llguidance_does(vocab_of):
    """A random 1-layer model over SmolLM2's vocabulary writes byte tokens and odd characters: greedy
    rows (some with prompt lookup's drafts) decode the same tokens under either backend."""
    from cdsl_struct.bench.overhead import near_zero_model
    from cdsl_struct.decoding import BatchEngine, Request
    from cdsl_struct.decoding.proposers import build_proposers
    from cdsl_struct.models import batch_runner

    vocabulary = vocab_of("smollm2")
    model = near_zero_model(vocabulary.size, seed=5)
    prompts = [vocabulary.encode(text) for text in ("Über café", "日本語 text", "a b a b a b", "ok")]
    outputs = {}
    for compiled in _pair(vocabulary):
        lookup = tuple(build_proposers("lookup", model))
        engine = BatchEngine(batch_runner(model, pad_token_id=0), max_batch_size=4)
        try:
            rows = engine.run_rows([Request(tuple(p), compiled, max_tokens=24, proposers=lookup if i % 2 else ())
                                    for i, p in enumerate(prompts)])
        finally:
            engine.close()
        outputs[compiled.backend] = [row.result.tokens for row in rows]
    assert outputs["text"] == outputs["llguidance"]
    assert any(any(b >= 0x80 for t in tokens for b in vocabulary.token_bytes[t]) for tokens in outputs["text"])


class _Session:
    def __init__(self, state, compiled):
        self.state, self.compiled = state, compiled


class _Row:
    def __init__(self, state, compiled):
        self.session = _Session(state, compiled)
