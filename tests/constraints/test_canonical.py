"""Canonical token boundaries on SmolLM2's real byte-level BPE tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from cdsl_struct.constraints import JsonSchema, allocate_bitmask, compile, is_allowed
from cdsl_struct.constraints.canonical import CanonicalFilter, non_canonical_pairs, with_canonical_tokens
from cdsl_struct.constraints.mask import allowed_tokens, set_bit
from cdsl_struct.constraints.vocabulary import UnsupportedTokenizer

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.fixture(scope="module")
def canonical(smollm2_tokenizer, smollm2):
    from cdsl_struct.constraints import TokenVocabulary

    vocabulary = TokenVocabulary.from_tokenizer(smollm2_tokenizer, smollm2.eos_token_ids)
    return CanonicalFilter.for_tokenizer(smollm2_tokenizer, vocabulary)


def one(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


@pytest.mark.parametrize("previous", [" New", "\":", "experiment", "\n"])
def test_rank_test_finds_exactly_the_non_canonical_pairs(canonical, smollm2_tokenizer, previous):
    p = one(smollm2_tokenizer, previous)
    special = canonical.vocabulary.special_ids
    brute = [t for t in range(canonical.vocabulary.size) if t not in special and not canonical.is_canonical_pair(p, t)]
    assert brute, "every one of these tokens has some non-canonical continuation"
    assert canonical.non_canonical_after(p).tolist() == brute
    assert set(brute) <= set(canonical.candidates(p).tolist())


def test_pairs_the_tokenizer_produces_are_canonical(canonical, smollm2_tokenizer):
    tokens = smollm2_tokenizer.encode('{"name": "New York City", "age": 42}', add_special_tokens=False)
    assert non_canonical_pairs(tokens, canonical) == 0
    split = [one(smollm2_tokenizer, " New"), one(smollm2_tokenizer, " Y"), one(smollm2_tokenizer, "ork")]
    assert smollm2_tokenizer.decode(split) == " New York"
    assert non_canonical_pairs(split, canonical) == 1  # " Y" + "ork" re-tokenises as " York"


def test_narrow_only_removes_and_falls_back_when_nothing_would_be_left(canonical, smollm2_tokenizer):
    p = one(smollm2_tokenizer, " Y")
    bad = one(smollm2_tokenizer, "ork")
    good = one(smollm2_tokenizer, " is")
    row = allocate_bitmask(canonical.vocabulary.size, backend="numpy")
    set_bit(row, bad)
    set_bit(row, good)
    assert canonical.narrow(row, p) == "narrowed"
    assert allowed_tokens(row, canonical.vocabulary.size) == [good]
    only_bad = allocate_bitmask(canonical.vocabulary.size)  # torch rows too
    set_bit(only_bad, bad)
    assert canonical.narrow(only_bad, p) == "fallback"
    assert allowed_tokens(only_bad, canonical.vocabulary.size) == [bad]


def test_state_masks_are_narrowed_but_the_constraint_is_unchanged(canonical, smollm2_tokenizer, smollm2):
    compiled = compile(JsonSchema(PERSON), smollm2_tokenizer, eos_token_ids=smollm2.eos_token_ids)
    canonical_compiled = with_canonical_tokens(compiled, smollm2_tokenizer)
    assert with_canonical_tokens(canonical_compiled, smollm2_tokenizer) is canonical_compiled
    plain, narrowed = compiled.new_state(), canonical_compiled.new_state()
    prefix = smollm2_tokenizer.encode('{"name":"New', add_special_tokens=False) + [one(smollm2_tokenizer, " Y")]
    plain.advance(prefix)
    narrowed.advance(prefix)
    size = compiled.vocab_size
    plain_row, narrowed_row = allocate_bitmask(size), allocate_bitmask(size)
    plain.fill_mask(plain_row)
    narrowed.fill_mask(narrowed_row)
    plain_ids, narrowed_ids = set(allowed_tokens(plain_row, size)), set(allowed_tokens(narrowed_row, size))
    assert narrowed_ids < plain_ids  # only removes
    ork = one(smollm2_tokenizer, "ork")
    assert is_allowed(plain_row, ork) and not is_allowed(narrowed_row, ork)  # " Y" + "ork" is spelled " York"
    assert narrowed.canonical_narrowed == 1 and narrowed.canonical_fallbacks == 0
    assert narrowed.validate([ork]) == 1  # the hard constraint itself is not narrowed
    twin = narrowed.copy()
    twin.advance(ork)
    twin.rollback(1)
    again = allocate_bitmask(size)
    twin.fill_mask(again)
    assert np.array_equal(again.numpy(), narrowed_row.numpy())  # the copy kept the history and the filter


def test_decoding_keeps_every_pair_canonical(smollm2, smollm2_tokenizer, one_torch_thread):
    from cdsl_struct.decoding import decode
    from cdsl_struct.models.runner import ModelRunner
    from cdsl_struct.prompts import prompt_ids

    plain = compile(JsonSchema(PERSON), smollm2_tokenizer, eos_token_ids=smollm2.eos_token_ids)
    canonical_compiled = with_canonical_tokens(plain, smollm2_tokenizer)
    filter_ = canonical_compiled.new_state().canonical
    prompt = prompt_ids(smollm2_tokenizer, "Ada Lovelace, aged 36, lived in London. Give her name and age as JSON.",
                        chat=True, system=None)
    eos = set(plain.vocabulary.eos_token_ids)
    broken, tokens = {}, []
    for name, compiled in (("plain", plain), ("canonical", canonical_compiled)):
        result = decode(ModelRunner(smollm2.model), compiled, prompt, max_tokens=40)
        assert result.complete and set(result.value) == {"name", "age"}  # valid either way
        broken[name] = non_canonical_pairs([t for t in result.tokens if t not in eos], filter_)
        if name == "canonical":
            tokens = result.tokens
    assert broken["plain"] > 0  # compact JSON makes the model write '":' '"' where the tokenizer writes '":"'
    # canonical decoding breaks a pair only where the constraint left no canonical token at all
    for i in range(1, len(tokens)):
        if tokens[i] in eos or filter_.is_canonical_pair(tokens[i - 1], tokens[i]):
            continue
        state = plain.new_state()
        state.advance(tokens[:i])
        row = allocate_bitmask(plain.vocab_size)
        state.fill_mask(row)
        allowed = allowed_tokens(row, plain.vocab_size)
        assert not any(filter_.is_canonical_pair(tokens[i - 1], t) for t in allowed if t not in eos)


def test_sentencepiece_tokenizers_are_refused(vocab_of):
    with pytest.raises(UnsupportedTokenizer, match="byte-level"):
        CanonicalFilter(None, vocab_of("llama2"))
