"""compile() keeps each pydantic model, stops timed-out engines, and lets bugs surface."""

import os
import signal
import threading
import time

import psutil
import pydantic
import pytest

from cdsl_struct import CompileError, CompileTimeout, JsonSchema, Regex, UnsupportedFeature, compile
from cdsl_struct.constraints.backends.llguidance_backend import LLGuidanceBackend
from cdsl_struct.constraints.backends.outlines_core_backend import OutlinesCoreBackend
from cdsl_struct.constraints.backends.outlines_core_process import WORKERS
from cdsl_struct.result import parse_value

# ~50 s to index on GPT-2's vocabulary with Unicode \w (with the default ASCII \w: about 1 s)
SLOW_ON_OUTLINES_CORE = Regex(r"\w{1,200}", unicode=True)


def _pet_model() -> type[pydantic.BaseModel]:
    """A new class each call, all with the same name and fields (as in two modules)."""

    class Pet(pydantic.BaseModel):
        name: str
        age: int

    return Pet


Cat, Dog = _pet_model(), _pet_model()


def test_models_with_one_schema_each_keep_their_class():
    assert Cat is not Dog and Cat.model_json_schema() == Dog.model_json_schema()
    cat = compile(JsonSchema(Cat), "smollm2")
    dog = compile(JsonSchema(Dog), "smollm2")
    assert cat.spec.model is Cat and dog.spec.model is Dog
    assert compile(JsonSchema(Cat), "smollm2").spec.model is Cat
    assert isinstance(parse_value(dog.spec, '{"name":"Rex","age":3}'), Dog)
    plain = compile(JsonSchema(Dog.model_json_schema()), "smollm2")
    assert plain.spec.model is None
    assert cat.program is dog.program is plain.program  # the engine compiled the schema once


@pytest.mark.parametrize("backend", ["llguidance", "outlines-core"])
def test_property_order_is_part_of_the_constraint(vocab_of, backend):
    def schema(order):
        return {"type": "object", "properties": {k: {"type": "integer"} for k in order},
                "required": ["a", "b"], "additionalProperties": False}

    vocab = vocab_of("gpt2")
    tokens = vocab.encode('{"a":1,"b":2}')
    ab = compile(JsonSchema(schema("ab")), vocab, backend=backend, whitespace="compact")
    ba = compile(JsonSchema(schema("ba")), vocab, backend=backend, whitespace="compact")
    assert ab is not ba
    assert ab.new_state().validate(tokens) == len(tokens)
    assert ba.new_state().validate(tokens) < len(tokens)


def _child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def test_outlines_core_timeout_stops_the_engine(vocab_of):
    vocab = vocab_of("gpt2")
    compile(Regex("warm[0-9]"), vocab, backend="outlines-core", timeout=30, cache=False)
    workers = set(WORKERS.idle_pids())
    workers_were_alive = workers <= _child_pids()
    start = time.monotonic()
    with pytest.raises(CompileTimeout, match="longer than 1 s"):
        compile(SLOW_ON_OUTLINES_CORE, vocab, backend="outlines-core", timeout=1.0, cache=False)
    assert time.monotonic() - start < 1.0 + 1.0
    assert not [t for t in threading.enumerate() if t.name.startswith("cdsl-compile-outlines")]
    assert workers and workers_were_alive
    gone = workers - set(WORKERS.idle_pids())
    assert len(gone) == 1 and not gone & _child_pids()  # the busy worker was killed and reaped
    assert compile(Regex("after[0-9]"), vocab, backend="outlines-core", timeout=30, cache=False)


def test_auto_falls_back_when_outlines_core_times_out(vocab_of, monkeypatch):
    def refuse(self, spec, vocabulary, whitespace):
        raise UnsupportedFeature("not today", feature="test")

    monkeypatch.setattr(LLGuidanceBackend, "compile", refuse)
    start = time.monotonic()
    with pytest.raises(CompileTimeout) as info:  # not the refusal: with more time it might compile
        compile(SLOW_ON_OUTLINES_CORE, vocab_of("gpt2"), timeout=0.5, cache=False)
    assert time.monotonic() - start < 0.5 + 1.0
    assert [name for name, _ in info.value.attempts] == ["llguidance", "outlines-core"]
    assert "longer than" in info.value.attempts[1][1] and "not today" in str(info.value)


def test_a_worker_that_died_while_idle_is_replaced(vocab_of):
    vocab = vocab_of("gpt2")
    compile(Regex("idle[0-9]"), vocab, backend="outlines-core", timeout=30, cache=False)
    for pid in WORKERS.idle_pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    compiled = compile(Regex("fresh[0-9]"), vocab, backend="outlines-core", timeout=30, cache=False)
    assert compiled.backend == "outlines-core"


@pytest.mark.parametrize("timeout", [None, 30])
def test_outlines_core_refusals_are_typed_in_and_out_of_process(vocab_of, timeout):
    with pytest.raises(CompileError, match="word boundar"):
        compile(Regex(r"a\b"), vocab_of("gpt2"), backend="outlines-core", timeout=timeout, cache=False)


@pytest.mark.parametrize("timeout", [None, 30])
def test_a_bug_in_a_backend_surfaces_without_fallback(vocab_of, monkeypatch, timeout):
    called = []

    def broken(self, *args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'schema'")

    def record(self, *args, **kwargs):
        called.append(args)
        raise AssertionError("auto must not fall back on a bug")

    monkeypatch.setattr(LLGuidanceBackend, "compile", broken)
    monkeypatch.setattr(OutlinesCoreBackend, "compile", record)
    with pytest.raises(AttributeError, match="no attribute 'schema'"):
        compile(Regex("bug[0-9]"), vocab_of("gpt2"), backend="auto", timeout=timeout, cache=False)
    assert not called


def test_a_bug_in_the_fallback_backend_surfaces(vocab_of, monkeypatch):
    def refuse(self, spec, vocabulary, whitespace):
        raise UnsupportedFeature("not today", feature="test")

    def broken(self, *args, **kwargs):
        raise TypeError("unexpected argument")

    monkeypatch.setattr(LLGuidanceBackend, "compile", refuse)
    monkeypatch.setattr(OutlinesCoreBackend, "compile", broken)
    with pytest.raises(TypeError, match="unexpected argument"):
        compile(Regex("bug[0-9]"), vocab_of("gpt2"), backend="auto", cache=False)


def test_unsupported_feature_still_falls_back(vocab_of, monkeypatch):
    def refuse(self, spec, vocabulary, whitespace):
        raise UnsupportedFeature("llguidance: not today", feature="test", backend="llguidance")

    monkeypatch.setattr(LLGuidanceBackend, "compile", refuse)
    compiled = compile(Regex("fall[0-9]"), vocab_of("gpt2"), backend="auto", cache=False)
    assert compiled.backend == "outlines-core"
    assert compiled.skipped == [("llguidance", "llguidance: not today")]


def test_a_finished_output_is_validated_against_the_schema_as_given():
    from cdsl_struct.errors import OutputInvalid

    spec = JsonSchema({"type": "object", "properties": {"age": {"type": "integer", "maximum": 150}},
                       "required": ["age"]})
    assert parse_value(spec, '{"age": 36}') == {"age": 36}
    for bad in ('{"age": 151}', '{"age": "36"}', "{}", '{"age": 3'):
        with pytest.raises(OutputInvalid):
            parse_value(spec, bad)
    with pytest.raises(OutputInvalid, match="Pet"):
        parse_value(JsonSchema(Dog), '{"name": "Rex"}')


def test_an_index_over_the_worker_memory_cap_is_refused_by_name(vocab_of, monkeypatch):
    from cdsl_struct.constraints.backends import outlines_core_backend
    from cdsl_struct.constraints.backends.outlines_core_process import WorkerPool
    from cdsl_struct.constraints.backends.outlines_core_worker import MEMORY_ENV

    monkeypatch.setenv(MEMORY_ENV, "100")
    pool = WorkerPool()
    monkeypatch.setattr(outlines_core_backend, "WORKERS", pool)
    try:
        with pytest.raises(UnsupportedFeature, match="more than 100 MiB") as info:
            compile(Regex(r"[a-z ]{1,300}"), vocab_of("gpt2"), backend="outlines-core", timeout=60, cache=False)
        assert info.value.feature == "index size"
        assert compile(Regex("small[0-9]"), vocab_of("gpt2"), backend="outlines-core", timeout=60, cache=False)
    finally:
        pool.close()


def test_outlines_core_workers_are_capped_and_a_compile_waits_within_its_timeout(vocab_of, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from cdsl_struct.constraints.backends import outlines_core_backend
    from cdsl_struct.constraints.backends.outlines_core_process import WorkerPool

    pool = WorkerPool(max_workers=1)
    monkeypatch.setattr(outlines_core_backend, "WORKERS", pool)
    vocab = vocab_of("gpt2")
    try:
        with ThreadPoolExecutor(1) as background:
            slow = background.submit(compile, SLOW_ON_OUTLINES_CORE, vocab, backend="outlines-core",
                                     timeout=3.0, cache=False)
            time.sleep(0.5)  # the slow one holds the only worker
            with pytest.raises(CompileTimeout, match="no worker was free"):
                compile(Regex("waits[0-9]"), vocab, backend="outlines-core", timeout=0.5, cache=False)
            with pytest.raises(CompileTimeout):
                slow.result()
        assert compile(Regex("after-slot[0-9]"), vocab, backend="outlines-core", timeout=30, cache=False)
    finally:
        pool.close()
