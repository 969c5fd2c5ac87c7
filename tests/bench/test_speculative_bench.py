"""The speculative bench on the real embedded model: one small task from a --prompts file."""

import json

import pytest

from cdsl_struct.bench.speculative import SpeculativeConfig, load_tasks, run_speculative_bench


def test_prompts_file_runs_and_reports(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "Write the date 2 May 2024 as YYYY-MM-DD.",
                                 "regex": r"\d{4}-\d{2}-\d{2}"}) + "\n")
    report = run_speculative_bench(load_tasks(tasks), SpeculativeConfig(draft="lookup", max_tokens=16,
                                                                          with_hf=False), progress=False)
    summary = report["summary"]
    assert summary["identical"] is True
    assert set(summary["target_passes_per_token"]) == {"target", "speculative"}
    assert summary["target_passes_per_token"]["target"] == 1.0
    run = report["runs"][0]
    assert run["target"]["finish_reason"] == "stop" and len(run["target"]["text"]) == 10


def test_bad_prompts_file(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "no constraint"}) + "\n")
    with pytest.raises(ValueError, match="needs 'prompt' and one of"):
        load_tasks(tasks)
