"""The reasoning state: think between markers, a budget, a forced close, then the constraint;
on real vocabularies that hold the markers as one special token (qwen3) or spell them (smollm2)."""

from __future__ import annotations

import random

import pytest

from cdsl_struct.constraints import compile
from cdsl_struct.constraints.mask import allocate_bitmask, allowed_tokens, is_allowed
from cdsl_struct.constraints.reasoning import (
    ANSWER,
    BEFORE,
    THINKING,
    Reasoning,
    split_reasoning,
    start_phase,
    template_markers,
    with_reasoning,
)
from cdsl_struct.errors import InvalidArgument, InvalidToken
from cdsl_struct.models.tokenizers import load_tokenizer
from cdsl_struct.streaming import Thought, ThoughtDeltas

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _state(vocab, budget, *, required=False, prompt="Q?", spec=SCHEMA, template=None):
    compiled = compile(spec, vocab)
    return with_reasoning(compiled, Reasoning(budget=budget, required=required), template, prompt, 100).new_state()


def _allowed(state):
    row = allocate_bitmask(state.vocabulary.size)
    state.fill_mask(row)
    return row


def _text(vocab, tokens):
    return vocab.decode(tokens).decode()


def test_markers_are_read_from_the_chat_template():
    qwen = load_tokenizer("qwen3")
    assert template_markers(qwen.chat_template) == ("<think>", "</think>")
    assert template_markers("{{ '[THINK]' }}...{{ '[/THINK]' }}") == ("[THINK]", "[/THINK]")
    assert template_markers(None) == ("<think>", "</think>")
    assert Reasoning(open="<r>", close="</r>").markers(qwen.chat_template) == ("<r>", "</r>")


def test_the_prompt_says_where_the_output_starts():
    qwen = load_tokenizer("qwen3")
    messages = [{"role": "user", "content": "hi"}]
    thinking_off = qwen.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                            enable_thinking=False)
    thinking_on = qwen.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert start_phase(thinking_off, "<think>", "</think>") == ANSWER
    assert start_phase(thinking_on, "<think>", "</think>") == BEFORE
    assert start_phase("<|Assistant|><think>\n", "<think>", "</think>") == THINKING  # DeepSeek-R1's template


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_a_forced_thought_stays_within_its_budget_then_the_answer_is_constrained(vocab_of, name):
    vocab = vocab_of(name)
    state = _state(vocab, budget=5, required=True)
    rng = random.Random(0)
    tokens: list[int] = []
    for _ in range(40):
        forced = state.forced_tokens(1)
        allowed = allowed_tokens(_allowed(state), vocab.size)
        assert allowed, "a reasoning state never dead-ends"
        token = forced[0] if forced else rng.choice(allowed)
        if state.phase.name == THINKING and not forced:
            assert not any(is_allowed(_allowed(state), eos) for eos in vocab.eos_token_ids)
        state.advance(token)
        tokens.append(token)
        if state.phase.name == ANSWER:
            break
    text = _text(vocab, tokens)
    assert text.startswith("<think>") and text.endswith("</think>")
    thought_tokens = len(tokens) - len(vocab.encode("<think>")) - len(vocab.encode("</think>"))
    assert thought_tokens <= 5 + len(vocab.encode("</think>"))  # the budget, then only the close marker
    assert not state.is_complete()
    state.advance(vocab.encode('{"a": 1}'))
    assert state.is_complete()
    with pytest.raises(InvalidToken):  # the answer is the schema's: no free text after the thought
        _state(vocab, budget=0, prompt="x</think>").advance(vocab.encode("hello"))


def test_a_token_that_closes_the_marker_and_goes_on_is_refused(vocab_of):
    vocab = vocab_of("smollm2")
    state = _state(vocab, budget=50, prompt="<think>")
    state.advance(vocab.encode("hmm </think"))
    row = _allowed(state)
    closers = [t for t, piece in enumerate(vocab.token_bytes) if piece.startswith(b">") and len(piece) > 1]
    assert closers and not any(is_allowed(row, t) for t in closers)
    assert is_allowed(row, vocab.encode(">")[0])


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_validate_and_rollback_agree_with_a_fresh_state(vocab_of, name):
    vocab = vocab_of(name)
    rng = random.Random(1)
    walk = _state(vocab, budget=4)
    tokens: list[int] = []
    # the marker first, a thought, the close, then an answer
    for token in vocab.encode("<think>") + [rng.randrange(200, 3000) for _ in range(3)]:
        if walk.validate([token]) == 1:
            walk.advance(token)
            tokens.append(token)
    walk.advance(vocab.encode("</think>"))
    tokens += vocab.encode("</think>")
    assert walk.phase.name == ANSWER
    answer = vocab.encode('{"a": 12}')
    walk.advance(answer)
    tokens += answer
    assert _state(vocab, budget=4).validate(tokens) == len(tokens)
    for back in range(1, len(tokens) + 1):
        twin = walk.copy()
        twin.rollback(back)
        fresh = _state(vocab, budget=4)
        fresh.advance(tokens[:len(tokens) - back])
        assert twin.phase == fresh.phase
        assert bool((_allowed(twin) == _allowed(fresh)).all()), f"masks differ {back} tokens back"


def test_a_model_may_skip_thinking_and_answer_at_once(vocab_of):
    vocab = vocab_of("qwen3")
    state = _state(vocab, budget=8)
    row = _allowed(state)
    assert is_allowed(row, vocab.encode("<think>")[0]) and is_allowed(row, vocab.encode("{")[0])
    assert not is_allowed(row, vocab.encode("hello")[0])
    state.advance(vocab.encode('{"a": 3}'))
    assert state.phase.name == ANSWER and state.is_complete()
    state.rollback(len(vocab.encode('{"a": 3}')))
    assert state.phase.name == BEFORE


def test_split_and_stream_deltas_agree():
    text = "<think>let me see</think>{\"a\": 1}"
    assert split_reasoning(text, "<think>", "</think>") == ("let me see", '{"a": 1}')
    assert split_reasoning('{"a": 1}', "<think>", "</think>") == (None, '{"a": 1}')
    assert split_reasoning("so</think>x", "<think>", "</think>", THINKING) == ("so", "x")
    assert split_reasoning("<think>still going", "<think>", "</think>") == ("still going", "")
    for cut in range(1, len(text)):
        deltas = ThoughtDeltas("<think>", "</think>", BEFORE)
        pieces = [*deltas.push(text[:cut]), *deltas.push(text[cut:]), *deltas.flush()]
        assert "".join(p for p in pieces if isinstance(p, Thought)) == "let me see"
        assert "".join(p for p in pieces if not isinstance(p, Thought)) == '{"a": 1}'
        assert deltas.written + '{"a": 1}' == text


def test_bad_reasoning_options_are_typed_errors():
    with pytest.raises(InvalidArgument):
        Reasoning(budget=-1)
    with pytest.raises(InvalidArgument):
        Reasoning.of({"budgt": 3})
    with pytest.raises(InvalidArgument):
        Reasoning.of("yes")
    assert Reasoning.of(12) == Reasoning(budget=12) and Reasoning.of(False) is None
