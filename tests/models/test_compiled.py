"""A RaggedRunner's steps through torch.compile (``models.compiled``) on a tiny random Llama: the
compiled steps give a solo run's logits through joins, speculation, crops, leaves and forks; a
failing compiled forward falls back to eager without losing the step; runners without ragged
steps stay eager; ``"auto"`` compiles only a ragged runner on the CPU where inductor finds a C++
compiler. One compiled runner for the module (compiling costs seconds)."""

import logging

import pytest
import torch._inductor.config as inductor_config

from cdsl_struct.models.batch import BatchRunner, Feed
from cdsl_struct.models.compiled import compile_for, compile_mode, compile_runner, why_not_compiled
from cdsl_struct.models.ragged import GROUPED_QUERIES, RaggedRunner
from tests.models.solo import close, solo


@pytest.fixture(scope="module")
def compiled_runner(model):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    assert compile_runner(runner)
    assert runner.rows == 0 and runner.compiled.steps >= 4  # the warm-up's rows are gone
    return runner


def test_compiled_steps_match_solo_runs(model, compiled_runner):
    runner = compiled_runner
    steps = runner.compiled.steps
    a, b = [1, 2, 3, 4, 5, 6, 7], [9, 8]
    out = runner.run([Feed("a", a, 1), Feed("b", b, 1)])
    assert close(out[0], solo(model, a)) and close(out[1], solo(model, b))
    out = runner.run([Feed("a", a + [5, 6, 7], 4), Feed("b", b + [9], 2)])  # speculation: several kept
    assert close(out[0], solo(model, a + [5, 6, 7], keep=4)) and close(out[1], solo(model, b + [9], keep=2))
    a, b = a + [5, 11], b + [9, 12]  # a keeps one of its three: cropped
    prompt = [3] * (GROUPED_QUERIES + 4)  # a prompt joining the decode step, attending on its own
    out = runner.run([Feed("a", a, 1), Feed("b", b, 1), Feed("c", prompt, 1)])
    assert close(out[0], solo(model, a)) and close(out[1], solo(model, b)) and close(out[2], solo(model, prompt))
    runner.release("a")  # c moves into a's slot
    out = runner.run([Feed("d", b + [4, 4], 2, parent="b"), Feed("c", prompt + [1], 1)])
    assert close(out[0], solo(model, b + [4, 4], keep=2)) and close(out[1], solo(model, prompt + [1]))
    out = runner.run([Feed("d", b + [4, 4, 2], 1)])  # one row, one token
    assert close(out[0], solo(model, b + [4, 4, 2]))
    runner.release("b", "c", "d")
    out = runner.run([Feed("e", prompt[:9], 1)])  # a lone prompt: one kept position of many fed
    assert out[0].shape[0] == 1 and close(out[0], solo(model, prompt[:9]))
    assert runner.compiled.active and runner.compiled.steps == steps + 6
    runner.release("e")


def test_a_failing_compiled_forward_falls_back_to_eager_and_loses_no_step(model, caplog):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    runner.compile(warm_up=False)
    calls = []

    def broken(**inputs):
        calls.append(inputs)
        raise RuntimeError("no C++ compiler")

    runner.compiled.compiled = broken
    seq = [1, 2, 3, 4]
    with caplog.at_level(logging.WARNING, logger="cdsl_struct.models.compiled"):
        out = runner.run([Feed("a", seq, 1)])
        assert close(out[0], solo(model, seq))
        out = runner.run([Feed("a", seq + [5], 1)])
    assert close(out[0], solo(model, seq + [5]))
    assert len(calls) == 1 and not runner.compiled.active and runner.compiled.steps == 0  # tried once
    assert "running eagerly" in caplog.text and "no C++ compiler" in caplog.text


def test_a_runner_without_ragged_steps_stays_eager(model, caplog):
    runner = BatchRunner(model)
    with caplog.at_level(logging.WARNING, logger="cdsl_struct.models.compiled"):
        assert not compile_runner(runner)
    assert "running eagerly" in caplog.text
    out = runner.run([Feed("a", [1, 2, 3], 1)])
    assert close(out[0], solo(model, [1, 2, 3]))


def test_an_id_past_the_vocabulary_raises_as_eager_does(model, compiled_runner):
    steps = compiled_runner.compiled.steps
    with pytest.raises(IndexError):
        compiled_runner.run([Feed("x", [1, 2, model.config.vocab_size + 5], 1)])
    assert compiled_runner.compiled.steps == steps and compiled_runner.compiled.active
    compiled_runner.release("x")


def test_compile_modes_are_named_and_a_bad_one_raises():
    assert [compile_mode(v) for v in (True, False, None, "auto", "ON", "off")] == ["on", "off", "off", "auto",
                                                                                 "on", "off"]
    with pytest.raises(ValueError, match="auto, on, off"):
        compile_mode("fast")


def test_auto_compiles_a_ragged_cpu_runner_only_where_a_cxx_is_found(model, caplog, monkeypatch, tmp_path):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    assert why_not_compiled(runner) is None  # this machine has g++, as the compiled tests above need
    assert "no ragged steps" in why_not_compiled(BatchRunner(model))
    with inductor_config.patch({"cpp.cxx": ("cdsl-no-such-cxx",)}):
        assert "no C++ compiler" in why_not_compiled(runner)
        with caplog.at_level(logging.INFO, logger="cdsl_struct.models.compiled"):
            assert not compile_for(runner, "auto")
    assert runner.compiled is None and "running eagerly: no C++ compiler" in caplog.text
    monkeypatch.setattr("sysconfig.get_path", lambda name, *args, **kwargs: str(tmp_path))  # no Python.h there
    assert "no Python.h" in why_not_compiled(runner)
    assert not compile_for(runner, "off") and runner.compiled is None
    out = runner.run([Feed("a", [1, 2, 3], 1)])
    assert close(out[0], solo(model, [1, 2, 3]))
