"""``cdsl-struct generate`` run in-process on the embedded SmolLM2: values printed, stdin, stream,
stats, clean one-line errors and exit codes."""

from __future__ import annotations

import argparse
import io
import json
import re

import jsonschema
import pytest

from cdsl_struct import api, verbs
from cdsl_struct.cli import main
from cdsl_struct.generate_cli import EXIT_ERROR, EXIT_INCOMPLETE, _constraint_kwargs, add_generate_parser
from tests.test_api import GREETING, PASSAGE, PERSON


@pytest.fixture(autouse=True)
def embedded_model(smollm2, one_torch_thread, monkeypatch):
    """The CLI builds its Generator from the already loaded model (no second load)."""
    monkeypatch.setattr(verbs, "_generators", {})
    monkeypatch.setattr(api, "load_model", lambda name, **options: smollm2)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["generate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_choices_repeated_or_comma_separated(capsys):
    code, out, _ = run(capsys, "--choices", "yes", "--choices", "no,maybe", "--max-tokens", "4",
                       "Is water wet? Answer yes or no.")
    assert code == 0 and out.strip() in ("yes", "no", "maybe")


def test_schema_file_prints_json_and_stats(capsys, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    code, out, err = run(capsys, "--schema", str(schema), "--max-tokens", "30", "--stats", PASSAGE)
    assert code == 0
    jsonschema.validate(json.loads(out), PERSON)
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["method"] == "speculative" and stats["finish_reason"] == "stop" and stats["target_passes"] >= 1


def test_prompt_from_stdin_streamed(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Write the date of the Moon landing (20 July 1969) as YYYY-MM-DD."))
    code, out, _ = run(capsys, "--regex", r"\d{4}-\d{2}-\d{2}", "--max-tokens", "12", "--stream", "--draft", "none",
                       "--stats")
    assert code == 0 and re.fullmatch(r"\d{4}-\d{2}-\d{2}\n", out)


def test_grammar_file_with_tree(capsys, tmp_path):
    grammar = tmp_path / "greeting.lark"
    grammar.write_text(GREETING)
    code, out, _ = run(capsys, "--grammar", str(grammar), "--tree", "--max-tokens", "8", "Greet Anna in two words.")
    assert code == 0 and out.startswith("start") and "greeting" in out


def test_keywords_use_cdsl(capsys):
    code, _, err = run(capsys, "--choices", "a dog,a cat", "--keywords", "dog", "--max-tokens", "4", "--stats",
                       "Name a pet.")
    assert code == 0 and json.loads(err.strip().splitlines()[-1])["method"] == "cdsl"


def test_readmes_keyword_example_writes_a_sentence_with_its_words(capsys, monkeypatch):
    """README: ``echo "Write a sentence." | cdsl-struct generate --keywords dog,ride,walk``."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Write a sentence.\n"))
    code, out, err = run(capsys, "--keywords", "dog,ride,walk")
    assert code == 0 and re.fullmatch(r"[A-Z][^\n]*[.!?]\n", out)
    assert "keywords covered: dog, ride, walk\n" in err


def test_incomplete_output_exits_nonzero(capsys):
    code, out, err = run(capsys, "--regex", "[a-z ]{20,40}", "--max-tokens", "2", "Describe the sea.")
    assert code == EXIT_INCOMPLETE and out.strip()
    assert "incomplete" in err and "length" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--schema", "/no/such/schema.json", "hi"], "No such file"),
    (["--regex", "a(?=b)", "hi"], "lookahead"),
    (["--grammar", "start: (\n", "hi"], "grammar"),
    (["--temperature", "-1", "hi"], "temperature"),
    (["--method", "cdlh", "hi"], "reward"),
    (["--tree", "hi"], "--tree needs --grammar"),
    (["   "], "prompt is empty"),
])
def test_bad_input_is_one_clean_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == EXIT_ERROR and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("cdsl-struct generate: error:")
    assert message in err and "Traceback" not in err


def test_an_unknown_grammar_name_fails_before_the_model_loads(capsys, monkeypatch):
    def no_model(name, **options):
        raise AssertionError("the model was loaded before the grammar name was checked")

    monkeypatch.setattr(api, "load_model", no_model)
    code, out, err = run(capsys, "--grammar", "arithmetics", "1+1?")
    assert code == EXIT_ERROR and out == "" and len(err.strip().splitlines()) == 1
    assert "unknown grammar name 'arithmetics'" in err and "did you mean 'arithmetic'" in err
    assert "sql_select" in err


def test_two_constraints_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--regex", "a", "--choices", "a,b", "hi"])
    assert exit_info.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    for option in ("--schema", "--regex", "--choices", "--grammar", "--keywords", "--method", "--model", "--draft",
                   "--max-tokens", "--temperature", "--seed", "--stream", "--stats", "stdin"):
        assert option in out


def test_a_structural_tag_file_and_reasoning(capsys, tmp_path):
    tag = tmp_path / "tag.json"
    tag.write_text(json.dumps({"type": "structural_tag", "triggers": ["<person>"], "structures": [
        {"begin": "<person>", "schema": PERSON, "end": "</person>"}]}))
    code, out, _ = run(capsys, "--structural-tag", str(tag), "--max-tokens", "24", "Name a person.")
    assert code in (0, EXIT_INCOMPLETE) and out.strip()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "structural_tag", "structures": []}))
    code, _, err = run(capsys, "--structural-tag", str(bad), "hi")
    assert code == EXIT_ERROR and "structures" in err
    code, out, _ = run(capsys, "--schema", str(_person_file(tmp_path)), "--reasoning-budget", "4", "--max-tokens", "60",
                       "Extract: Tom Baker, 52, teaches history.")  # SmolLM2 may skip thinking: the answer holds
    assert code == 0 and json.loads(out)["age"] >= 0
    parser = argparse.ArgumentParser()
    add_generate_parser(parser.add_subparsers())
    assert _constraint_kwargs(parser.parse_args(["generate", "--reasoning", "hi"]))["reasoning"] is True
    assert _constraint_kwargs(parser.parse_args(["generate", "--reasoning-budget", "16", "hi"]))["reasoning"] == 16
    assert "reasoning" not in _constraint_kwargs(parser.parse_args(["generate", "hi"]))
    keywords = _constraint_kwargs(parser.parse_args(["generate", "--keywords", "dog", "hi"]))["keywords"]
    assert "optimism" not in keywords  # the library's default
    steered = parser.parse_args(["generate", "--keywords", "dog", "--keyword-optimism", "0.5", "hi"])
    assert _constraint_kwargs(steered)["keywords"]["optimism"] == 0.5


def _person_file(tmp_path):
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    return path


@pytest.mark.parametrize(("flag", "held"), [((), True), (("--keywords-may-end-early",), False)])
def test_keywords_hold_their_ending_unless_told_otherwise(capsys, monkeypatch, flag, held):
    from cdsl_struct.keywords import Keywords

    asked = []
    of = Keywords.of.__func__

    def recording(cls, value):
        asked.append(value)
        return of(cls, value)

    monkeypatch.setattr(Keywords, "of", classmethod(recording))
    code, _, err = run(capsys, "--keywords", "dog,walk", *flag, "--max-tokens", "6", "Write a sentence.")
    assert code in (0, EXIT_INCOMPLETE) and "keywords covered" in err
    assert any(isinstance(a, dict) and a.get("hold_ending") is held for a in asked), asked
