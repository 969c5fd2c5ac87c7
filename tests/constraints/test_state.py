"""ConstraintState mechanics on real tokenizers: validate never mutates, rollback restores
exactly, copies are independent, forced tokens are the only choice. Property tests walk random
token paths drawn from the masks themselves."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdsl_struct import InvalidToken, JsonSchema, Regex, RollbackError, compile
from cdsl_struct.constraints import allocate_bitmask, allowed_tokens

SCHEMA = JsonSchema({
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 30},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 40},
    },
    "required": ["id", "name", "kind", "scores"],
    "additionalProperties": False,
})
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None,
                             suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=["llguidance", "outlines-core"])
def compiled(request, vocab_of):
    return compile(SCHEMA, vocab_of("llama3"), backend=request.param, whitespace="compact")


def mask_of(state):
    row = allocate_bitmask(state.vocabulary.size)
    state.fill_mask(row)
    return row.clone()


def random_path(compiled, seed, length):
    """Advance a fresh state along ``length`` random allowed (non-EOS) tokens."""
    rng = random.Random(seed)
    state, path = compiled.new_state(), []
    eos = set(compiled.vocabulary.eos_token_ids)
    for _ in range(length):
        choices = [t for t in allowed_tokens(mask_of(state), compiled.vocab_size) if t not in eos]
        if not choices:
            break
        token = rng.choice(choices)
        state.advance(token)
        path.append(token)
    return state, path


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 10_000), length=st.integers(1, 80), back=st.integers(0, 80))
def test_rollback_restores_exactly(compiled, seed, length, back):
    state, path = random_path(compiled, seed, length)
    back = min(back, len(path))
    state.rollback(back)
    replay = compiled.new_state()
    replay.advance(path[: len(path) - back])
    assert state.num_tokens == replay.num_tokens == len(path) - back
    assert bool((mask_of(state) == mask_of(replay)).all())
    assert state.is_complete() == replay.is_complete()
    state.advance(path[len(path) - back:])  # and the rolled-back tokens are accepted again
    assert state.num_tokens == len(path)


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 10_000), length=st.integers(0, 40), probe=st.lists(st.integers(0, 128_255), max_size=12))
def test_validate_never_mutates(compiled, seed, length, probe):
    state, path = random_path(compiled, seed, length)
    before = mask_of(state)
    _, future = random_path(compiled, seed + 1, length + 10)
    for candidate in (probe, future[len(path):], [compiled.vocabulary.eos_token_id], future):
        count = state.validate(candidate)
        assert 0 <= count <= len(candidate)
        assert state.num_tokens == len(path)
        assert bool((mask_of(state) == before).all())
        if count < len(candidate):  # the first refused token is refused by advance too
            twin = state.copy()
            twin.advance(candidate[:count])
            with pytest.raises(InvalidToken):
                twin.advance(candidate[count])


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 10_000), length=st.integers(0, 40))
def test_copy_is_independent(compiled, seed, length):
    state, path = random_path(compiled, seed, length)
    twin = state.copy()
    before = mask_of(state)
    choices = [t for t in allowed_tokens(before, compiled.vocab_size)
               if t not in compiled.vocabulary.eos_token_ids]
    if choices:
        twin.advance(choices[0])
        assert twin.num_tokens == state.num_tokens + 1
    assert bool((mask_of(state) == before).all())
    twin.rollback(twin.num_tokens)  # a copy keeps the full history
    assert bool((mask_of(twin) == mask_of(compiled.new_state())).all())


def test_rollback_at_least_64_tokens(vocab_of):
    for backend in ("llguidance", "outlines-core"):
        compiled = compile(Regex("(ab){1,200}"), vocab_of("gpt2"), backend=backend)
        token = vocab_of("gpt2").encode("ab")
        state = compiled.new_state()
        for _ in range(150):
            state.advance(token)
        start = mask_of(compiled.new_state())
        state.rollback(state.num_tokens)
        assert bool((mask_of(state) == start).all())
        with pytest.raises(RollbackError):
            state.rollback(1)


def test_eos_only_when_complete_and_rollback_over_eos(compiled):
    vocab = compiled.vocabulary
    text = '{"id":7,"name":"x","kind":"beta","scores":[1.5]}'
    tokens = vocab.encode(text)
    state = compiled.new_state()
    for token in tokens[:-1]:
        state.advance(token)
        assert not state.is_complete()
        with pytest.raises(InvalidToken):
            state.advance(vocab.eos_token_id)
    state.advance([tokens[-1], vocab.eos_token_id])
    assert state.finished and state.is_complete()
    assert allowed_tokens(mask_of(state), vocab.size) == []
    with pytest.raises(InvalidToken):
        state.advance(tokens[0])
    state.rollback(2)
    assert not state.finished and state.validate([tokens[-1], vocab.eos_token_id]) == 2


def test_advance_is_atomic(compiled):
    vocab = compiled.vocabulary
    state = compiled.new_state()
    good = vocab.encode('{"id":1')
    with pytest.raises(InvalidToken) as info:
        state.advance(good + vocab.encode("oops"))
    assert info.value.position == len(good)
    assert state.num_tokens == 0


def test_forced_tokens_are_the_only_choice(compiled):
    state = compiled.new_state()
    forced = state.forced_tokens()
    assert forced, "a schema with fixed keys starts with forced tokens"
    for token in forced:
        allowed = allowed_tokens(mask_of(state), compiled.vocab_size)
        assert token in allowed
        state.advance(token)
    assert compiled.vocabulary.decode(forced).startswith(b'{"')


def test_a_matcher_failing_while_decoding_is_a_matcher_error_not_a_compile_error():
    """A compile error would tell a client its constraint was bad (400); this is the engine's fault."""
    from cdsl_struct import MatcherError
    from cdsl_struct.errors import CompileError
    from cdsl_struct.server.errors import from_exception

    class Failed:
        def unsafe_compute_mask_ptr(self, pointer, nbytes):
            pass

        def is_error(self):
            return True

        def get_error(self):
            return "internal parser failure\ndetails"

    state = compile(Regex("[0-9]+"), "gpt2", backend="llguidance").new_state()
    state._matcher = Failed()
    with pytest.raises(MatcherError, match="internal parser failure") as info:
        state.fill_mask(allocate_bitmask(state.vocabulary.size))
    assert not isinstance(info.value, CompileError)
    assert from_exception(info.value).status == 500


def test_allows_only_reads_a_mask_without_listing_it():
    from cdsl_struct.constraints.mask import allocate_bitmask, allows_only, set_bit

    row = allocate_bitmask(100)
    assert allows_only(row, [], 100)  # nothing allowed: nothing outside any set
    set_bit(row, 0)
    set_bit(row, 31)  # the sign bit of the first word
    assert allows_only(row, [0, 31], 100) and not allows_only(row, [0], 100)
    set_bit(row, 99)
    assert not allows_only(row, [0, 31], 100) and allows_only(row, [0, 31, 99, 150], 100)
