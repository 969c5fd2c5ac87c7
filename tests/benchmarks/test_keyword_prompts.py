"""The keyword-prompts bench: its three conditions' requests, the summary's counts and ratio, and
one run through ``generate`` on the embedded model via the CLI."""

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.commongen import PROMPT
from benchmarks.keyword_prompts import INSTRUCTIONS, request, summarise
from cdsl_struct.keywords import Keywords
from tests.benchmarks.test_commongen_bench import write_data


def test_each_condition_asks_as_it_says():
    words = ["dog", "walk"]
    prompt, keywords = request("named", "Write a sentence.", words)
    assert prompt == "Write a sentence.\n\n" + PROMPT.format(words="dog, walk") and keywords.name
    assert keywords.naming(prompt) is None  # the user named them: the library adds nothing
    assert request("unnamed", "Write a sentence.", words) == ("Write a sentence.", Keywords(("dog", "walk")))
    assert request("off", "Write a sentence.", words) == ("Write a sentence.", Keywords(("dog", "walk"), name=False))
    assert not any(Keywords(("dog",)).naming(text) is None for text in INSTRUCTIONS)  # none names a word


def test_the_summary_counts_coverage_finished_and_lists():
    def row(covered, text, finished=True):
        return {"words": ["a", "b"], "covered": covered, "text": text, "finished": finished, "wall_s": 1.0}

    summary = summarise({"named": [row(["a", "b"], "An a and a b."), row(["a", "b"], "A b, a.")],
                         "unnamed": [row(["a", "b"], "Dogs, cats, birds, fish, an a, a b.", finished=False),
                                     row(["a"], "I'm a helpful AI named SmolLM, an a.")]})
    assert summary["named"]["hard_coverage"] == 1.0 and summary["unnamed"]["hard_coverage"] == 0.5
    assert summary["unnamed"]["finished"] == 0.5 and summary["unnamed"]["word_lists"] == 1
    assert summary["unnamed_vs_named"] == pytest.approx(0.5)
    assert summary["unnamed"]["about_assistant"] == 1 and summary["named"]["about_assistant"] == 0


def test_keyword_prompts_runs_through_generate(tmp_path, smollm2, monkeypatch, one_torch_thread):
    from cdsl_struct import api

    monkeypatch.setattr(api, "load_model", lambda name, **options: smollm2)
    data = write_data(tmp_path / "dev.jsonl")
    out = tmp_path / "prompts.json"
    assert main(["keyword-prompts", "--data", str(data), "--limit", "1", "--split", "all", "--conditions",
                 "unnamed,off", "--max-tokens", "8", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    for condition in ("unnamed", "off"):
        (row,) = report["rows"][condition]
        assert row["method"] == "cdsl" and row["instruction"] == INSTRUCTIONS[0]
        assert set(row["covered"]) <= set(row["words"]) and row["finished"]  # closed to fit 8 tokens at worst
    assert report["summary"]["unnamed"]["sets"] == 1
