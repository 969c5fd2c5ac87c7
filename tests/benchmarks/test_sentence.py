"""The real-sentence constraint: listed whole words only, on the real SmolLM2 tokenizer."""

import re

import pytest

from benchmarks.sentence import (
    common_words,
    real_word_share,
    repeated_block,
    sentence_grammar,
    sentence_words,
    trie_regex,
)
from cdsl_struct.constraints import Grammar, compile


def test_trie_regex_matches_exactly_the_words():
    words = ["a", "an", "and", "ant", "bee", "been", "beer"]
    pattern = re.compile(trie_regex(words))
    for probe in words:
        assert pattern.fullmatch(probe)
    for probe in ["", "b", "be", "ands", "antbee", "beerr", "n"]:
        assert not pattern.fullmatch(probe)
    with pytest.raises(ValueError, match="at least one"):
        trie_regex([])


def test_word_list_holds_common_words_and_keyword_inflections():
    common = common_words(3000)
    assert {"the", "dog", "field", "a", "i"} <= set(common)
    assert all(re.fullmatch("[a-z]+", w) for w in common)
    assert not {"b", "c", "x"} & set(common)  # single letters other than a and i are not words
    words = set(sentence_words(["frisbee_N", "catch_V"], size=3000))
    assert {"frisbee", "caught", "catching", "catches"} <= words


@pytest.fixture(scope="module")
def sentence(smollm2):
    grammar = sentence_grammar(["frisbee_N", "catch_V"], size=3000)
    return compile(Grammar(grammar), smollm2.tokenizer, backend="llguidance", eos_token_ids=smollm2.eos_token_ids)


def accepts(compiled, tokenizer, text):
    """How many of the tokens of ``text`` the constraint accepts, and whether they complete it."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    state = compiled.new_state()
    ok = state.validate(tokens)
    if ok == len(tokens):
        state.advance(tokens)
    return ok == len(tokens), state.is_complete()


def test_grammar_accepts_sentences_of_listed_words(sentence, smollm2):
    tok = smollm2.tokenizer
    assert accepts(sentence, tok, "The dog caught a frisbee in the field.") == (True, True)
    assert accepts(sentence, tok, "A dog, a man and a frisbee.") == (True, True)
    assert accepts(sentence, tok, "The dog caught") == (True, False)  # a prefix, not yet a sentence


@pytest.mark.parametrize("text", [
    "The dog ateam a frisbee.",  # glued words
    "The dog caughtfrisbee.",  # keyword glued to a keyword
    "The dog  caught a frisbee.",  # two spaces
    "the dog caught a frisbee.",  # no capital
    "The dog caught a frisbee",  # then EOS without the period is refused below
    "The Dog caught a frisbee.",  # capital inside
    "Dog.",  # too short
])
def test_grammar_refuses_non_sentences(sentence, smollm2, text):
    accepted, complete = accepts(sentence, smollm2.tokenizer, text)
    assert not (accepted and complete)


def test_real_word_share():
    assert real_word_share("The dog caught a frisbee.") == 1.0
    assert real_word_share("The dog ateam glassfulfilledglass.") == pytest.approx(2 / 4)
    assert real_word_share("A xqzzy.", keywords=["xqzzy_N"]) == 1.0  # keywords count as words
    assert real_word_share("") == 1.0


@pytest.mark.parametrize(("text", "expected"), [
    ("A body, a body, a body.", True),
    ("Sit, table, lamp, lamp, lamp.", True),
    ("The dog had had had enough.", True),
    ("A body, a stone, a water, a body, a stone, a water.", False),  # twice is not three times
    ("The dog had had enough of the dog.", False),
])
def test_repeated_block_finds_a_block_written_three_times_in_a_row(text, expected):
    assert repeated_block(text) is expected
