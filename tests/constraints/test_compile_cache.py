"""compile()'s caches: refusals are remembered, timeouts only briefly and per timeout, and the
cache of compiled constraints is bounded by the bytes its engine programs hold."""

import threading
import time

import pytest

from cdsl_struct import CompileTimeout, JsonSchema, Regex, UnsupportedFeature, compile
from cdsl_struct.constraints import compiler
from cdsl_struct.constraints.backends.llguidance_backend import LLGuidanceBackend


@pytest.fixture
def counted_llguidance(monkeypatch):
    """LLGuidanceBackend.compile, counting its calls."""
    calls: list[str] = []
    real = LLGuidanceBackend.compile

    def counted(self, spec, vocabulary, whitespace):
        calls.append(spec.key)
        return real(self, spec, vocabulary, whitespace)

    monkeypatch.setattr(LLGuidanceBackend, "compile", counted)
    return calls


def test_a_refusal_is_raised_again_without_compiling_again(vocab_of, counted_llguidance):
    schema = JsonSchema({"type": "array", "uniqueItems": True, "description": "refused-cache"})
    errors = []
    for _ in range(3):
        with pytest.raises(UnsupportedFeature) as info:
            compile(schema, vocab_of("gpt2"), backend="llguidance")
        errors.append(info.value)
    assert len(counted_llguidance) == 1
    assert type(errors[0]) is type(errors[2]) and str(errors[0]) == str(errors[2])


@pytest.fixture
def release():
    """Set at the end of a test, so that compile threads left waiting end with it."""
    event = threading.Event()
    yield event
    event.set()


def test_a_timeout_is_remembered_only_for_a_timeout_as_short(vocab_of, monkeypatch, release):
    started = []

    class Stuck:
        name = "llguidance"
        enforces_timeout = False

        def compile(self, *args):
            started.append(1)
            release.wait(5)
            raise AssertionError("should have timed out")

    monkeypatch.setattr(compiler, "get_backend", lambda name: Stuck())
    spec = Regex("remembered-timeout[0-9]")
    for timeout in (0.1, 0.1, 0.05):
        with pytest.raises(CompileTimeout):
            compile(spec, vocab_of("gpt2"), backend="llguidance", timeout=timeout)
    assert len(started) == 1  # the same or a shorter timeout: the cached verdict
    monkeypatch.setattr(compiler, "TIMEOUT_TTL_S", 0.0)  # what is cached from here expires at once
    with pytest.raises(CompileTimeout):
        compile(spec, vocab_of("gpt2"), backend="llguidance", timeout=0.2)
    assert len(started) == 2  # a longer timeout deserves a new try
    with pytest.raises(CompileTimeout):
        compile(spec, vocab_of("gpt2"), backend="llguidance", timeout=0.2)
    assert len(started) == 3  # expired


def test_auto_spends_one_budget_over_every_engine(vocab_of, monkeypatch, release):
    class Stuck:
        def __init__(self, name: str) -> None:
            self.name = name
            self.enforces_timeout = False

        def compile(self, *args):
            release.wait(10)
            raise AssertionError("should have timed out")

    monkeypatch.setattr(compiler, "get_backend", Stuck)
    start = time.monotonic()
    with pytest.raises(CompileTimeout) as info:
        compile(Regex("one-budget[0-9]"), vocab_of("gpt2"), timeout=1.0, cache=False)
    assert time.monotonic() - start < 1.0 + 0.5  # not 1 s per engine
    assert [name for name, _ in info.value.attempts] == ["llguidance", "outlines-core"]


def test_the_cache_is_bounded_by_bytes(vocab_of, monkeypatch):
    compiler.clear_cache()
    first = compile(Regex("bytes-a[0-9]"), vocab_of("gpt2"), backend="llguidance")
    size = first.program.nbytes
    assert size > 0 and compiler.cache_info()["bytes"] == size
    monkeypatch.setattr(compiler, "CACHE_BYTES", size * 2 + size // 2)
    for name in "bcd":
        compile(Regex(f"bytes-{name}[0-9]"), vocab_of("gpt2"), backend="llguidance")
    info = compiler.cache_info()
    assert info["entries"] == 2 and info["bytes"] <= compiler.CACHE_BYTES
    again = compile(Regex("bytes-a[0-9]"), vocab_of("gpt2"), backend="llguidance")
    assert again is not first  # the oldest was dropped and compiled anew


def test_an_unsupported_refusal_through_auto_is_cached_with_its_attempts(vocab_of):
    spec = JsonSchema({"type": "array", "items": {"enum": list(range(500))}, "uniqueItems": True,
                       "description": "cached-attempts"})
    with pytest.raises(UnsupportedFeature) as first:
        compile(spec, vocab_of("gpt2"))
    with pytest.raises(UnsupportedFeature) as second:
        compile(spec, vocab_of("gpt2"))
    assert second.value.attempts == first.value.attempts and len(first.value.attempts) >= 2
