"""``Generator(torch_compile=True)`` end to end, on a tiny random Llama with SmolLM2's real
tokenizer: it answers at once, eagerly, while a child process compiles; then its steps run through the
saved graphs, with the eager Generator's answers; a second Generator loads the saved graphs; a compile
that fails leaves it eager with the reason. ``serve`` compiles by default (``"auto"``) and passes
``--torch-compile`` through."""

from __future__ import annotations

import argparse
import json

import pytest

from cdsl_struct.api import Generator
from cdsl_struct.models.loading import load_model
from cdsl_struct.models.saved_graphs import SavedForward
from cdsl_struct.server.cli import add_serve_parser, run_serve
from tests.models.solo import save_tiny_llama

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-smollm2-vocab"), seed=1, heads=4, kv_heads=2)


def _answers(generator, prompts):
    return [(r.text, r.finish_reason) for r in generator.generate_batch(prompts, schema=PERSON, max_tokens=24)]


def test_a_compiled_generator_answers_at_once_and_swaps_in_the_graphs(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("CDSL_STRUCT_CACHE", str(tmp_path))  # nothing saved yet: a child process compiles
    prompts = [f"Describe person number {i} as JSON." for i in range(6)]
    eager = Generator(tiny_folder, draft=None, dtype="float32")
    try:
        expected = _answers(eager, prompts)
        assert eager.compile_state() is None and not eager.wait_compiled(0)
    finally:
        eager.close()
    assert len({text for text, _ in expected}) > 1  # rows differ, so a row mix-up would show

    generator = Generator(tiny_folder, draft=None, dtype="float32", torch_compile=True)
    try:
        runner = generator.engine.runner
        first = generator.generate(prompts[0], schema=PERSON, max_tokens=24)  # the child is still compiling
        assert runner.compiled is None and generator.compile_state().phase == "compiling"
        assert (first.text, first.finish_reason) == expected[0]
        assert generator.wait_compiled(timeout=600), generator.compile_state()
        state = generator.compile_state()
        assert state.phase == "ready" and state.source == "compiled"
        assert isinstance(runner.compiled, SavedForward) and runner.compiled.steps == 0
        assert _answers(generator, prompts) == expected
        assert runner.compiled.steps > 0 and runner.compiled.active  # decoded through the graphs, no fallback
        load = generator.load()  # what /metrics reports
        assert load.compiled_active and load.compiled_steps == runner.compiled.steps
    finally:
        generator.close()
    assert list(tmp_path.glob("compiled/graphs-*/manifest.json"))

    again = Generator(tiny_folder, draft=None, dtype="float32", torch_compile="on")  # the graphs are saved now
    try:
        assert again.wait_compiled(timeout=120)
        state = again.compile_state()
        assert state.source == "saved" and state.seconds < 60
        assert _answers(again, prompts) == expected and again.engine.runner.compiled.steps > 0
    finally:
        again.close()


def test_a_compile_that_fails_leaves_the_generator_eager_with_the_reason(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("CDSL_STRUCT_CACHE", str(tmp_path))
    loaded = load_model(tiny_folder, dtype="float32")

    class Local(type(loaded.model)):
        """A model class the compiling process cannot import."""

    loaded.model.__class__ = Local
    generator = Generator(loaded, draft=None, torch_compile=True)
    try:
        assert not generator.wait_compiled(timeout=300)
        state = generator.compile_state()
        assert state.phase == "failed" and "Local" in state.reason
        assert generator.engine.runner.compiled is None
        result = generator.generate("Describe a person as JSON.", schema=PERSON, max_tokens=24)  # eagerly
        assert set(json.loads(result.text)) == {"name", "age"}
    finally:
        generator.close()


def test_serve_passes_torch_compile_through(monkeypatch):
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["serve"]).torch_compile == "auto"  # a server compiles where that pays
    seen = {}
    monkeypatch.setattr("cdsl_struct.server.app.serve", lambda *args, **kwargs: seen.update(kwargs))
    for argv, mode in ((["--torch-compile"], "on"), (["--torch-compile", "off"], "off"), ([], "auto")):
        assert run_serve(parser.parse_args(["serve", *argv])) == 0
        assert seen["torch_compile"] == mode
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--torch-compile", "fast"])


def test_a_bad_torch_compile_fails_before_the_model_loads(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("loaded")

    monkeypatch.setattr("cdsl_struct.api.load_model", load)
    with pytest.raises(ValueError, match="torch_compile"):
        Generator("smollm2", torch_compile="fast")
