"""The loop guard: which cycles it sees, what it penalises, and that it never loosens a constraint."""

import pytest
import torch

from cdsl_struct import JsonSchema, compile
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.decoding.loops import (
    DEFAULT_GUARD,
    MIN_TOKENS,
    PENALTY,
    SENTENCE_GUARD,
    LoopGuard,
    WordLoopGuard,
    loop_bans,
    loop_continuation,
    penalise,
)
from cdsl_struct.models.batch import BatchRunner
from cdsl_struct.prompts import prompt_ids


@pytest.mark.parametrize(("history", "expected"), [
    ([5, 1, 2, 3, 1, 2, 3, 1, 2, 3], 1),               # a block of three, three times: the block starts again
    ([9, 7, 7, 7, 7, 7, 7, 7, 7], 7),                  # one token eight times
    ([7] * (MIN_TOKENS - 1), None),                     # one token, too few times
    ([1, 2, 1, 2, 1, 2], None),                         # a block of two needs four rounds (eight tokens)
    ([1, 2, 1, 2, 1, 2, 1, 2], 1),
    ([1, 2, 3, 1, 2, 3, 1, 2, 4], None),                # broken cycle
    ([], None),
    (list(range(40)), None),
])
def test_loop_continuation(history, expected):
    assert loop_continuation(history) == expected


def test_guard_penalises_each_scored_position_from_its_own_history():
    logits = torch.zeros(3, 10)
    output = [4, 5, 6] * 2 + [4, 5]
    bans = loop_bans(output, [6, 4], positions=3)
    penalise(logits, bans)
    # position 0 follows ...4 5 (no third round yet), position 1 follows ...4 5 6 (third round done)
    assert bans == [(1, 4), (2, 5)]
    assert logits[0].eq(0).all()
    assert logits[1, 4] == -PENALTY and logits[2, 5] == -PENALTY


@pytest.fixture(scope="module")
def looping(smollm2, one_torch_thread):
    """A prompt that makes SmolLM2 repeat an array item until max_tokens without the guard."""
    items = {"type": "array", "items": {"enum": ["cheese", "milk", "bread"]}}
    schema = {"type": "object", "properties": {"items": items}, "required": ["items"], "additionalProperties": False}
    compiled = compile(JsonSchema(schema), smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    ids = prompt_ids(smollm2.tokenizer, "Write the word cheese many times as a JSON array of strings.")
    return compiled, ids


def run(smollm2, compiled, ids, guard):
    engine = BatchEngine(BatchRunner(smollm2.model, pad_token_id=smollm2.eos_token_ids[0]), max_batch_size=2)
    return engine.run([Request(ids, compiled, max_tokens=80, loop_guard=guard)])[0]


def test_the_guard_ends_a_cycle_the_model_would_repeat_to_max_tokens(smollm2, looping):
    compiled, ids = looping
    unguarded = run(smollm2, compiled, ids, guard=False)
    guarded = run(smollm2, compiled, ids, guard=True)
    assert unguarded.finish_reason == "length" and unguarded.stats.loop_guarded == 0, unguarded.text
    assert guarded.finish_reason == "stop" and guarded.complete and guarded.stats.loop_guarded > 0, guarded.text
    assert isinstance(guarded.value["items"], list)  # valid under the schema: parse_value checked it


def test_the_sentence_guard_stops_the_third_repeat_and_the_default_is_unchanged():
    twice = [1, 2, 3, 1, 2, 3]  # "a body, a body," : the block twice
    assert SENTENCE_GUARD.continuation(twice) == 1
    assert SENTENCE_GUARD.continuation([1, 2, 3, 1, 2]) is None  # once and a part
    assert SENTENCE_GUARD.continuation([5, 5]) == 5  # "had had" goes no further
    assert loop_continuation(twice) is None and DEFAULT_GUARD == LoopGuard()
    assert SENTENCE_GUARD.bans([9], [1, 2, 3, 1, 2, 3], 7) == [(6, 1)]
    logits = torch.zeros(2, 4)
    assert SENTENCE_GUARD.guard(logits, [0, 0], [3]) == 1 and logits[0, 0] == -PENALTY and logits[1].eq(0).all()
    with pytest.raises(ValueError, match="min_repeats"):
        LoopGuard(min_repeats=1)


@pytest.fixture(scope="module")
def word_guard(smollm2):
    from cdsl_struct.constraints.vocabulary import TokenVocabulary

    vocabulary = TokenVocabulary.from_tokenizer(smollm2.tokenizer, smollm2.eos_token_ids)
    return WordLoopGuard(vocabulary.token_bytes)


@pytest.mark.parametrize(("text", "first_word"), [
    ("Aw, shaking, aw, shaking,", "aw"),  # case and punctuation between the words aside
    ("A pair of a pair of", "a"),  # the last word may still go on: only a new word is banned
    ("wow, wow wow", "wow"),
    ("The dog runs. The dog", None),
    ("The dog sat on the mat and the cat sat on the rug.", None),
])
def test_the_word_guard_sees_blocks_of_words(smollm2, word_guard, text, first_word):
    tokenizer = smollm2.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    banned = word_guard.word_continuations(ids)
    if first_word is None:
        assert banned == []
        return
    assert banned
    for token in banned:
        piece = tokenizer.decode([token])
        word = piece.strip(" ,.").lower()
        assert word and first_word.startswith(word), piece  # each starts the block's first word
        if text[-1].isalnum():
            assert not piece[0].isalnum(), piece  # mid-word: only a token that opens a new word
    assert tokenizer.encode(" " + first_word.capitalize(), add_special_tokens=False)[0] in banned


def test_the_word_guard_guards_tokens_too_and_each_position(smollm2, word_guard):
    tokenizer = smollm2.tokenizer
    ids = tokenizer("Aw, shaking, aw, shaking,", add_special_tokens=False)["input_ids"]
    bans = word_guard.bans(ids[:2], ids[2:], len(ids) - 1)  # position i follows ids[:2 + i]
    positions = {position for position, _ in bans}
    assert positions == {i for i in range(len(ids) - 1) if word_guard.word_continuations(ids[:2 + i])}
    twice = len(tokenizer("Aw, shaking, aw, shaking", add_special_tokens=False)["input_ids"])
    assert positions and min(positions) == twice - 2  # from the second "shaking" on
    assert word_guard.continuation([1, 2, 3, 1, 2, 3]) == 1  # SENTENCE_GUARD's token cycles still count
    logits = torch.zeros(1, len(word_guard.texts))
    assert word_guard.guard(logits, ids) == len(word_guard.word_continuations(ids)) > 0
    assert (logits[0] == -PENALTY).sum() == len(set(word_guard.word_continuations(ids)))
