"""One JSON whitespace default everywhere, and the default keeps numbers as the model writes them."""

from __future__ import annotations

import argparse
import inspect

import pytest

import cdsl_struct as cs
from cdsl_struct.api import Generator
from cdsl_struct.bulk.cli import add_batch_parser, job_from_args
from cdsl_struct.bulk.job import BatchJob
from cdsl_struct.constraints.compiler import compile as compile_spec
from cdsl_struct.generate_cli import add_generate_parser
from cdsl_struct.options import DEFAULT_WHITESPACE, SERVE_TORCH_COMPILE
from cdsl_struct.prompts import prompt_ids
from cdsl_struct.server.app import serve
from cdsl_struct.server.cli import add_serve_parser
from cdsl_struct.server.handoff import GENERATOR_OPTIONS
from cdsl_struct.tools.grammar import ToolCallsGrammar
from cdsl_struct.verbs import generate

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}


def _default(function, name: str):
    return inspect.signature(function).parameters[name].default


def _cli_default(add_parser, argv: list[str]) -> str:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv).whitespace


def test_every_entry_point_defaults_to_the_one_whitespace_policy():
    assert DEFAULT_WHITESPACE != "compact"  # benchmarks quality: compact forbids the model's space before a number
    python_defaults = {
        "compile": _default(compile_spec, "whitespace"),
        "Generator": _default(Generator.__init__, "whitespace"),
        "generate": _default(generate, "whitespace"),
        "ToolCallsGrammar": _default(ToolCallsGrammar.__init__, "whitespace"),
        "serve": _default(serve, "whitespace"),
        "BatchJob": BatchJob().whitespace,
    }
    cli_defaults = {
        "cdsl-struct generate": _cli_default(add_generate_parser, ["generate", "prompt"]),
        "cdsl-struct batch": _cli_default(add_batch_parser, ["batch", "in.jsonl", "out.jsonl"]),
        "cdsl-struct serve": _cli_default(add_serve_parser, ["serve"]),
    }
    assert set(python_defaults.values()) | set(cli_defaults.values()) == {DEFAULT_WHITESPACE}, \
        {**python_defaults, **cli_defaults}


def test_a_compiled_constraint_for_the_transformers_processor_uses_the_default(vocab_of):
    compiled = cs.compile(cs.JsonSchema(PERSON), vocab_of("smollm2"))
    assert compiled.whitespace.name == DEFAULT_WHITESPACE


def test_a_batch_job_passes_its_output_options_to_its_generator(monkeypatch):
    seen = {}

    class Recorder:
        def __init__(self, model, **options):
            seen.update(options)

    monkeypatch.setattr("cdsl_struct.api.Generator", Recorder)
    BatchJob(whitespace="flexible", loop_guard=False).generator()
    assert seen["whitespace"] == "flexible" and seen["loop_guard"] is False and seen["torch_compile"] == "off"
    parser = argparse.ArgumentParser()
    add_batch_parser(parser.add_subparsers(dest="command"))
    job = job_from_args(parser.parse_args(["batch", "in.jsonl", "out.jsonl", "--torch-compile"]))
    assert job.torch_compile == "on" and BatchJob.from_dict(job.to_dict()).torch_compile == "on"  # to Ray actors
    job.generator()
    assert seen["torch_compile"] == "on"


@pytest.mark.parametrize("guard", ["loop_guard", "string_guard"])
def test_each_guard_is_on_everywhere_unless_turned_off(guard):
    assert _default(Generator.__init__, guard) is True and getattr(BatchJob(), guard) is True
    assert _default(serve, guard) is True and guard in GENERATOR_OPTIONS  # the compiled child's too
    flag = "--no-" + guard.replace("_", "-")
    for add_parser, argv in ((add_generate_parser, ["generate", "p"]), (add_batch_parser, ["batch", "i", "o"]),
                             (add_serve_parser, ["serve"])):
        parser = argparse.ArgumentParser()
        add_parser(parser.add_subparsers(dest="command"))
        assert getattr(parser.parse_args(argv), guard) is True
        assert getattr(parser.parse_args([*argv, flag]), guard) is False
    job = job_from_args(_parsed_batch(["batch", "i", "o", flag]))
    assert getattr(job, guard) is False and getattr(BatchJob.from_dict(job.to_dict()), guard) is False


def _parsed_batch(argv):
    parser = argparse.ArgumentParser()
    add_batch_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def greedy(smollm2, one_torch_thread):
    generator = Generator(smollm2, draft=None)
    yield generator
    generator.close()


@pytest.mark.parametrize("passage, age", [
    ("Ada Lovelace is 86 years old and lives in London.", 86),
    ("Meet Omar Khan: a 41-year-old teacher from Karachi.", 41),
])
def test_a_number_after_a_key_is_written_as_the_model_writes_it(greedy, passage, age):
    """Under the default, every token of the age (from the one after ``":`` to its last digit) is
    the unconstrained model's own argmax at that point: the constraint never had to overrule it."""
    import torch

    prompt = f"{passage}\n\nExtract the person from the text above as JSON with the keys name, age and city."
    result = greedy.generate(prompt, schema=PERSON, max_tokens=48)
    assert result.complete and result.value["age"] == age, result.text

    tokenizer = greedy.tokenizer
    prompt = prompt_ids(tokenizer, prompt)
    output = [t for t in result.tokens if t not in greedy.vocabulary.eos_token_ids]
    with torch.no_grad():
        logits = greedy.loaded.model(torch.tensor([prompt + output])).logits[0]
    free_choice = logits[len(prompt) - 1:-1].argmax(-1).tolist()  # the model's own pick at each output position

    texts = [tokenizer.decode(output[:i]) for i in range(len(output) + 1)]
    key_end = next(i for i, text in enumerate(texts) if text.rstrip().endswith('"age":'))
    number_end = next(i for i, text in enumerate(texts) if text.replace(" ", "").endswith(f'"age":{age}'))
    for position in range(key_end, number_end):
        assert output[position] == free_choice[position], (
            f"at {texts[position]!r} the model would write {tokenizer.decode([free_choice[position]])!r}, "
            f"the constraint made it {tokenizer.decode([output[position]])!r}")


def test_one_rule_for_at_most_one_constraint_everywhere():
    """generate(), cdsl-struct batch and the server share options.one_constraint."""
    from cdsl_struct.bulk.settings import BatchJob
    from cdsl_struct.options import ConflictingConstraints, one_constraint

    assert one_constraint({"schema": None, "regex": "a+"}) == ("regex", "a+")
    assert one_constraint({"schema": None}) is None
    with pytest.raises(ConflictingConstraints) as info:
        one_constraint({"schema": {}, "regex": "a", "grammar": "g"})
    assert info.value.given == ["schema", "regex", "grammar"] and isinstance(info.value, ValueError)
    with pytest.raises(ConflictingConstraints, match="tools, regex"):
        BatchJob(tools=[{"type": "function", "function": {"name": "f"}}], regex="a").check()


def test_the_server_compiles_by_default_and_the_library_does_not():
    """serve starts once and runs long: it pays minutes of compiling for its rate; a Generator in a
    script or a notebook starts in seconds unless asked."""
    assert SERVE_TORCH_COMPILE == "auto" and _default(serve, "torch_compile") == SERVE_TORCH_COMPILE
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["serve"]).torch_compile == SERVE_TORCH_COMPILE
    assert _default(Generator.__init__, "torch_compile") is False
