"""A request's arguments are read and checked before any model loads (``arguments.read_arguments``):
in a fresh process, ``cs.generate`` with a bad regex, grammar, schema, structural tag, tool definition,
method or parameter raises its typed error without importing torch or loading a model, and the CLI
refuses them the same way; a good request's arguments come back parsed."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from cdsl_struct import GrammarSyntaxError, InvalidSchema, Regex
from cdsl_struct.arguments import read_arguments
from cdsl_struct.errors import InvalidArgument, UnknownGrammar

BAD_REQUESTS = {
    "regex": ({"regex": "(unclosed"}, "GrammarSyntaxError"),
    "grammar": ({"grammar": 'start: ("a"'}, "GrammarSyntaxError"),
    "grammar name": ({"grammar": "nosuchgrammar"}, "UnknownGrammar"),
    "schema": ({"schema": {"type": "objekt"}}, "InvalidSchema"),
    "structural tag": ({"schema": {"type": "structural_tag", "format": {"type": "no_such_format"}}},
                       "InvalidSchema"),
    "tool name": ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "InvalidArgument"),
    "tool parameters": ({"tools": [{"name": "f", "parameters": {"type": "object",
                                                               "properties": {"x": {"type": 12}}}}]},
                        "InvalidSchema"),
    "tool choice": ({"tools": [{"name": "f"}], "tool_choice": "g"}, "InvalidArgument"),
    "tool format": ({"tools": [{"name": "f"}], "tool_format": "klingon"}, "InvalidArgument"),
    "method": ({"method": "fast"}, "InvalidArgument"),
    "temperature": ({"temperature": -1}, "InvalidArgument"),
    "keywords": ({"keywords": "dog"}, "InvalidArgument"),
    "reasoning": ({"reasoning": {"budget": 4, "colour": "red"}}, "InvalidArgument"),
}


def test_every_bad_request_fails_in_a_fresh_process_before_torch_loads():
    code = f"""
        import json, sys, time
        import cdsl_struct as cs
        import cdsl_struct.models.loading as loading

        def refuse(*args, **kwargs):
            raise AssertionError("the model was loaded")

        loading.load_model = refuse
        out = {{}}
        for name, kwargs in {json.dumps({name: kwargs for name, (kwargs, _) in BAD_REQUESTS.items()})}.items():
            started = time.perf_counter()
            try:
                cs.generate("Hello.", **kwargs)
                out[name] = ["no error", 0]
            except Exception as exc:
                out[name] = [type(exc).__name__, time.perf_counter() - started]
        out["torch loaded"] = "torch" in sys.modules
        print(json.dumps(out))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("torch loaded") is False
    for name, (_, error) in BAD_REQUESTS.items():
        raised, seconds = out[name]
        assert raised == error, (name, raised)
        assert seconds < 1.0, (name, seconds)


def test_the_cli_refuses_a_bad_regex_before_the_model_loads(monkeypatch, capsys):
    from cdsl_struct.generate_cli import add_generate_parser, run_generate

    monkeypatch.setattr("cdsl_struct.verbs.cached_generator",
                        lambda *args, **kwargs: pytest.fail("a model was loaded for a bad regex"))
    parser = argparse.ArgumentParser()
    add_generate_parser(parser.add_subparsers(dest="command"))
    assert run_generate(parser.parse_args(["generate", "Say hi.", "--regex", "(unclosed"])) == 2
    assert "invalid regex" in capsys.readouterr().err


def test_a_good_request_comes_back_parsed():
    read = read_arguments(regex="[a-z]+", keywords=["dog", "walk"], max_tokens=12, reasoning=8)
    assert read.spec == Regex("[a-z]+") and read.params.max_tokens == 12
    assert read.reward is not None and read.reasoning.budget == 8
    assert read_arguments().spec is None  # free text


@pytest.mark.parametrize(("kwargs", "error"), [({"regex": "a(b"}, GrammarSyntaxError),
                                               ({"schema": "{not json"}, InvalidSchema),
                                               ({"grammar": "no_such_one"}, UnknownGrammar),
                                               ({"regex": "a", "choices": ["a"]}, ValueError),
                                               ({"max_tokens": 0}, InvalidArgument)])
def test_read_arguments_raises_the_typed_error(kwargs, error):
    with pytest.raises(error):
        read_arguments(**kwargs)


@pytest.mark.parametrize("prompt", [None, 5, [], [{"role": "user", "content": "hi"}, "text"]])
def test_a_prompt_of_the_wrong_kind_is_a_typed_error_naming_it(prompt):
    """A prompt that is no string, message list or list of prompts raised a bare ValueError, which
    ``except cs.CdslError`` let through."""
    from cdsl_struct.arguments import split_batch

    with pytest.raises(InvalidArgument) as caught:
        split_batch(prompt)
    assert caught.value.param == "prompt"


def test_a_reward_that_is_not_callable_is_a_typed_error_naming_it():
    from cdsl_struct.arguments import reward_for

    with pytest.raises(InvalidArgument) as caught:
        reward_for(None, 5)
    assert caught.value.param == "reward"
