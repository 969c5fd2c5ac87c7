"""``Generator(torch_compile=True)`` end to end, on a tiny random Llama with SmolLM2's real
tokenizer: it compiles before it returns, its steps run compiled, and its answers are the eager
Generator's; ``serve`` compiles by default (``"auto"``) and passes ``--torch-compile`` through."""

from __future__ import annotations

import argparse

import pytest

from cdsl_struct.api import Generator
from cdsl_struct.server.cli import add_serve_parser, run_serve
from tests.models.solo import save_tiny_llama

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-smollm2-vocab"), seed=1, heads=4, kv_heads=2)


def test_a_compiled_generator_answers_as_the_eager_one(tiny_folder):
    prompts = [f"Describe person number {i} as JSON." for i in range(6)]
    answers = {}
    for compiled in (False, True):
        generator = Generator(tiny_folder, draft=None, dtype="float32", torch_compile=compiled)
        try:
            runner = generator.engine.runner
            assert (runner.compiled is not None and runner.compiled.active) is compiled
            steps = runner.compiled.steps if compiled else 0
            results = generator.generate_batch(prompts, schema=PERSON, max_tokens=24)
            answers[compiled] = [(r.text, r.finish_reason) for r in results]
            if compiled:
                assert runner.compiled.steps > steps and runner.compiled.active  # decoded compiled, no fallback
            load = generator.load()  # what /metrics reports
            assert load.compiled_active is compiled and (load.compiled_steps > 0) is compiled
        finally:
            generator.close()
    assert answers[True] == answers[False]
    assert len({text for text, _ in answers[True]}) > 1  # rows differ, so a row mix-up would show


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
